"""The caller's trace context goes on to the worker, over gRPC, REST and streams.

With tracing off (no exporter), the gateway is a hop that does not take part: a valid
`traceparent` and its `tracestate` reach the worker byte for byte, so a Triton behind
rsgw joins the caller's trace; a malformed one is dropped, as the W3C spec asks of
every hop, and the call goes on. Real clients (tritonclient's gRPC and HTTP) send
the headers; the worker's handlers record the metadata they were called with.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from rsgw.base._call import CallContext, Metadata
from rsgw.grpc._streams import ServerStream
from rsgw.worker._service import WorkerService
from tests.gateway.fleet import open_fleet
from tests.helpers import client_inputs, in_thread

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
HEADERS = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE, "x-request-id": "r-7"}
FORWARDED = {
    b"traceparent": TRACEPARENT.encode(),
    b"tracestate": TRACESTATE.encode(),
    b"x-request-id": b"r-7",
}
_NAMES = set(FORWARDED)
UNTRACED = {"x-request-id": "r-8"}


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[bytes, bytes]]]:
    """The trace and request-id metadata of each of the test's calls the workers take."""
    calls: list[dict[bytes, bytes]] = []

    def record(metadata: Metadata) -> None:
        # Only the test's own calls, which all carry a request id (the gateway's
        # capability probes call the workers too).
        if any(name == b"x-request-id" for name, _ in metadata):
            calls.append({name: value for name, value in metadata if name in _NAMES})

    unary, stream = WorkerService.model_infer, WorkerService.model_stream_infer

    async def model_infer(self: WorkerService, body: bytes, call: CallContext) -> bytes:
        record(call.metadata)
        return await unary(self, body, call)

    async def model_stream_infer(self: WorkerService, server: ServerStream) -> None:
        record(server.call.metadata)
        await stream(self, server)

    monkeypatch.setattr(WorkerService, "model_infer", model_infer)
    monkeypatch.setattr(WorkerService, "model_stream_infer", model_stream_infer)
    yield calls


async def test_grpc_and_rest_calls_hand_the_callers_context_on(
    seen: list[dict[bytes, bytes]],
) -> None:
    async with open_fleet(1) as fleet:
        grpc_client = grpcclient.InferenceServerClient(fleet.target)
        http_client = httpclient.InferenceServerClient(f"127.0.0.1:{fleet.gateway.http_port}")

        def calls() -> None:
            grpc_client.infer("simple", client_inputs(grpcclient.InferInput), headers=dict(HEADERS))
            http_client.infer("simple", client_inputs(httpclient.InferInput), headers=dict(HEADERS))
            grpc_client.infer("simple", client_inputs(grpcclient.InferInput), headers=UNTRACED)

        try:
            await in_thread(calls)
        finally:
            grpc_client.close()
            http_client.close()
    assert seen == [FORWARDED, FORWARDED, {b"x-request-id": b"r-8"}]


@pytest.mark.parametrize(
    "traceparent",
    [
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "not a trace context",
    ],
)
async def test_a_malformed_context_is_dropped_and_the_call_goes_on(
    seen: list[dict[bytes, bytes]], traceparent: str
) -> None:
    async with open_fleet(1) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)
        headers = {**HEADERS, "traceparent": traceparent}
        try:
            result = await in_thread(
                lambda: client.infer(
                    "simple", client_inputs(grpcclient.InferInput), headers=headers
                )
            )
        finally:
            client.close()
    assert result.as_numpy("OUTPUT0") is not None
    assert seen == [{b"x-request-id": b"r-7"}]


async def test_a_stream_hands_the_callers_context_on(seen: list[dict[bytes, bytes]]) -> None:
    async with open_fleet(1) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)
        answers: queue.Queue[object] = queue.Queue()

        def stream() -> object:
            client.start_stream(
                callback=lambda result, error: answers.put(error), headers=dict(HEADERS)
            )
            client.async_stream_infer("simple", client_inputs(grpcclient.InferInput))
            error = answers.get(timeout=10)
            client.stop_stream()
            return error

        try:
            assert await in_thread(stream) is None
        finally:
            client.close()
    assert seen == [FORWARDED]
