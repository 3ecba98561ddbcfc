"""The gateway's own spans, exported over OTLP/HTTP to a receiver in the test.

A real fleet on loopback, real clients (tritonclient's gRPC and HTTP), the gateway's
real exporter, and `tests.otlp`'s receiver decoding what it is sent: the gateway's
span is the child of the caller's; each attempt at a worker is a child span whose id
is the `traceparent` the worker was sent (so a Triton's span nests under it); a call
without a context starts a trace; a failover shows two attempts; a collector that is
away costs spans, counted, never calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._call import CallContext
from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.base._trace_context import parse_traceparent
from rsgw.config._tracing import TracingConfig
from rsgw.worker._service import WorkerService
from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import client_inputs, in_thread, infer_request, simple_inputs, wait_until_async
from tests.otlp import ReceivedSpan, Receiver, otlp_receiver

CALLER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-01"
SERVER, CLIENT = 2, 3  # OTLP's SpanKind numbers


def tracing(endpoint: str) -> TracingConfig:
    """Spans exported within 50 ms, as a test wants them."""
    return TracingConfig(endpoint=endpoint, schedule_delay_millis=50, export_timeout_millis=2000)


@pytest.fixture
def worker_parents(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The `traceparent` each traced ModelInfer reached a worker with (the gateway's
    capability probes, untraced, are left out)."""
    seen: list[str] = []
    unary = WorkerService.model_infer

    async def model_infer(self: WorkerService, body: bytes, call: CallContext) -> bytes:
        seen.extend(v.decode() for k, v in call.metadata if k == b"traceparent")
        return await unary(self, body, call)

    monkeypatch.setattr(WorkerService, "model_infer", model_infer)
    yield seen


def _trace(receiver: Receiver, trace_id: int, count: int) -> list[ReceivedSpan]:
    """The trace's spans once `count` of them have come."""
    spans = receiver.wait_for(lambda got: sum(s.trace_id == trace_id for s in got) >= count)
    return [s for s in spans if s.trace_id == trace_id]


def _check_nesting(spans: list[ReceivedSpan], worker_parent: str, caller: int) -> None:
    """One server span under `caller` (0: a root), its attempts under it, and the
    worker told to nest under the last attempt."""
    (server,) = [s for s in spans if s.kind == SERVER]
    assert server.parent_id == caller
    assert server.name == "ModelInfer" and server.service == "rsgw"
    assert server.attributes["rsgw.model"] == "simple"
    assert server.attributes["rpc.grpc.status_code"] == 0
    attempts = [s for s in spans if s.kind == CLIENT]
    assert attempts and all(a.parent_id == server.span_id for a in attempts)
    assert server.attributes["rsgw.attempts"] == len(attempts)
    parent = parse_traceparent(worker_parent)
    assert parent is not None and parent.trace_id == server.trace_id
    assert parent.span_id == attempts[-1].span_id
    assert server.attributes["rsgw.worker"] == attempts[-1].attributes["rsgw.worker"]


async def test_grpc_and_rest_calls_are_children_of_the_callers_span(
    worker_parents: list[str],
) -> None:
    with otlp_receiver() as receiver:
        async with open_fleet(1, tracing=tracing(receiver.url)) as fleet:
            grpc_client = grpcclient.InferenceServerClient(fleet.target)
            http_port = fleet.gateway.http_port
            http_client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
            headers = {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}
            try:
                await in_thread(
                    lambda: grpc_client.infer(
                        "simple", client_inputs(grpcclient.InferInput), headers=headers
                    )
                )
                spans = await in_thread(lambda: _trace(receiver, CALLER_TRACE, 2))
                _check_nesting(spans, worker_parents[0], CALLER_SPAN)
                await in_thread(
                    lambda: http_client.infer(
                        "simple", client_inputs(httpclient.InferInput), headers=dict(headers)
                    )
                )
                spans = await in_thread(lambda: _trace(receiver, CALLER_TRACE, 4))
            finally:
                grpc_client.close()
                http_client.close()
    rest = [s for s in spans if s.attributes.get("rsgw.protocol") == "rest"]
    assert len(rest) == 1
    _check_nesting(
        [s for s in spans if s.span_id == rest[0].span_id or s.parent_id == rest[0].span_id],
        worker_parents[1],
        CALLER_SPAN,
    )


async def test_a_call_without_a_context_starts_a_trace(worker_parents: list[str]) -> None:
    with otlp_receiver() as receiver:
        async with open_fleet(1, tracing=tracing(receiver.url)) as fleet:
            await fleet.infer(_request())
            parent = parse_traceparent(worker_parents[0])
            assert parent is not None and parent.sampled
            spans = await in_thread(lambda: _trace(receiver, parent.trace_id, 2))
    _check_nesting(spans, worker_parents[0], 0)


async def test_a_failover_shows_two_attempts(
    worker_parents: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    answering = WorkerService.model_infer

    async def worker0_fails(self: WorkerService, body: bytes, call: CallContext) -> bytes:
        if self.identity.name == "worker0":  # down for ModelInfer, up for its probes
            raise GrpcError(StatusCode.UNAVAILABLE, "worker0 is going away")
        return await answering(self, body, call)

    monkeypatch.setattr(WorkerService, "model_infer", worker0_fails)
    with otlp_receiver() as receiver:
        async with open_fleet(2, tracing=tracing(receiver.url)) as fleet:
            for _ in range(2):  # round robin: one of the two starts at worker0
                await fleet.infer(_request())
            spans = await in_thread(
                lambda: receiver.wait_for(
                    lambda got: any(s.attributes.get("rsgw.attempts") == 2 for s in got)
                )
            )
    (server,) = [s for s in spans if s.attributes.get("rsgw.attempts") == 2]
    attempts = [s for s in spans if s.parent_id == server.span_id and s.kind == CLIENT]
    assert sorted(int(str(a.attributes["rsgw.attempt"])) for a in attempts) == [1, 2]
    failed = [a for a in attempts if a.attributes["rsgw.worker"] == "worker0"]
    assert len(failed) == 1 and failed[0].attributes["rpc.grpc.status_code"] == 14
    assert "worker0 is going away" in failed[0].status_message
    assert server.attributes["rsgw.worker"] == "worker1"


async def test_a_collector_that_is_away_costs_spans_not_calls() -> None:
    with otlp_receiver() as receiver:
        closed = receiver.url  # the receiver stops below: nothing listens there
    async with open_fleet(1, tracing=tracing(closed)) as fleet:
        for seed in range(5):
            await fleet.infer(_request(seed))
        await wait_until_async(
            lambda: _dropped(fleet, "export_failed") >= 2, 20, what="spans counted lost"
        )


def _dropped(fleet: Fleet, reason: str) -> float:
    registry = fleet.gateway._service.metrics.registry
    value = registry.get_sample_value("gateway_trace_spans_dropped_total", {"reason": reason})
    return 0.0 if value is None else value


def _request(seed: int = 0) -> pb.ModelInferRequest:
    return infer_request("simple", simple_inputs(seed))


async def test_a_call_its_caller_did_not_sample_makes_no_span(worker_parents: list[str]) -> None:
    unsampled = f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-00"
    with otlp_receiver() as receiver:
        async with open_fleet(1, tracing=tracing(receiver.url)) as fleet:
            client = grpcclient.InferenceServerClient(fleet.target)
            try:
                for parent in (unsampled, TRACEPARENT.replace("4736", "4737")):
                    await in_thread(
                        partial(
                            client.infer,
                            "simple",
                            client_inputs(grpcclient.InferInput),
                            headers={"traceparent": parent},
                        )
                    )
            finally:
                client.close()
            # The sampled call's spans come; the unsampled one's never did.
            spans = await in_thread(lambda: _trace(receiver, CALLER_TRACE + 1, 2))
    assert not [s for s in receiver.spans if s.trace_id == CALLER_TRACE]
    assert len(spans) == 2
    # The worker was told the caller's own span, unsampled: it leaves the call out too.
    assert worker_parents[0] == unsampled
