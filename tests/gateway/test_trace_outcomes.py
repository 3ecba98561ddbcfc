"""A slow or failed call explains itself in its trace (issue 51, acceptance 2).

A real fleet on loopback (the span exporter is a thread: no mock clock here), the
gateway's real exporter, and `tests.otlp`'s receiver: a worker killed while it holds
the call makes two attempt spans in the caller's trace, the first failed; a cold
model's call shows its load wait as a child span; a call refused at admission has
its span's status say why.
"""

from __future__ import annotations

from typing import Any

import trio
import tritonclient.grpc as grpcclient

from rsgw.base._call import CallContext
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._config import GrpcLimits, SchedulingConfig, SchedulingMode
from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.worker._service import WorkerService
from rsgw.worker._worker import WorkerApi
from rsgw.worker.models._catalogue import parse_catalogue
from tests.gateway.fleet import Fleet, open_fleet, repository_states
from tests.gateway.test_gateway_limits import SLOW, simple_body
from tests.gateway.test_tracing import CALLER_SPAN, CALLER_TRACE, CLIENT, SERVER, TRACEPARENT
from tests.gateway.test_tracing import tracing as quick_tracing
from tests.helpers import catalogue_from_yaml, in_thread, simple_model, wait_until_async
from tests.otlp import ReceivedSpan, Receiver, otlp_receiver

CALLER: tuple[tuple[bytes, bytes], ...] = ((b"traceparent", TRACEPARENT.encode()),)


async def traced_call(fleet: Fleet, model: str, within: float = 30.0) -> None:
    """One ModelInfer of `model` in the caller's trace (`CALLER_TRACE`)."""
    await fleet.channel().unary(
        Method.MODEL_INFER.wire,
        simple_body(1, model),
        deadline=trio.current_time() + within,
        metadata=CALLER,
    )


async def caller_spans(receiver: Receiver, count: int) -> list[ReceivedSpan]:
    """The caller's trace once `count` spans of it have come."""
    spans = await in_thread(
        lambda: receiver.wait_for(lambda got: sum(s.trace_id == CALLER_TRACE for s in got) >= count)
    )
    return [s for s in spans if s.trace_id == CALLER_TRACE]


def server_span(spans: list[ReceivedSpan]) -> ReceivedSpan:
    (server,) = [s for s in spans if s.kind == SERVER]
    assert server.parent_id == CALLER_SPAN
    return server


async def test_a_worker_killed_mid_call_shows_two_attempts_in_one_trace(
    monkeypatch: Any,
) -> None:
    holding: list[str] = []
    held = trio.Event()
    answering = WorkerService.model_infer

    async def model_infer(self: WorkerService, body: bytes, call: CallContext) -> bytes:
        if not holding:  # the first worker to hold the call is the one killed
            holding.append(self.identity.name)
            held.set()
        return await answering(self, body, call)

    monkeypatch.setattr(WorkerService, "model_infer", model_infer)
    slow = catalogue_from_yaml(SLOW)
    with otlp_receiver() as receiver:
        async with open_fleet(2, catalogues=[slow, slow], tracing=quick_tracing(receiver.url)) as f:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(traced_call, f, "slow")
                with trio.fail_after(10):
                    await held.wait()
                victim = int(holding[0].removeprefix("worker"))
                f.workers[victim].kill()
            spans = await caller_spans(receiver, 3)
    server = server_span(spans)
    attempts = sorted(
        (s for s in spans if s.kind == CLIENT and s.parent_id == server.span_id),
        key=lambda s: str(s.attributes["rsgw.attempt"]),
    )
    assert [a.attributes["rsgw.worker"] for a in attempts] == [
        holding[0],
        f"worker{1 - victim}",
    ]
    assert attempts[0].attributes["rpc.grpc.status_code"] == StatusCode.UNAVAILABLE
    assert attempts[0].status_message.startswith("UNAVAILABLE")
    assert attempts[1].attributes["rpc.grpc.status_code"] == StatusCode.OK
    assert server.attributes["rsgw.attempts"] == 2
    assert server.attributes["rpc.grpc.status_code"] == StatusCode.OK


async def test_a_cold_start_shows_its_load_wait() -> None:
    models = ("m0", "m1", "m2")
    entry = {"launch_ms": 1.0, "item_ms": 0.0, "weight_bytes": 100, "load_ms": 200.0}
    catalogue = parse_catalogue(
        {"models": [simple_model(name=m, **entry) for m in models]}, source="test"
    )
    repository = RepositoryConfig(
        models=models, default_weight_bytes=100, worker_budget_bytes=100, drain_seconds=1.0
    )
    worker = {"api": WorkerApi.TRITON, "loaded_at_start": frozenset(), "gpu_memory_bytes": 100}
    with otlp_receiver() as receiver:
        async with open_fleet(
            2,
            catalogues=[catalogue, catalogue],
            worker_overrides=worker,
            scheduling=SchedulingConfig(mode=SchedulingMode.LPT_PACKING),
            repository=repository,
            tracing=quick_tracing(receiver.url),
        ) as fleet:
            packing = fleet.gateway._packing
            assert packing is not None
            with trio.fail_after(30):
                await packing.placer.wait_carried(1)
            # Two budgets of one model each, three models: one of them is cold.
            states = [await repository_states(fleet, i) for i in range(2)]
            resident = {m for held in states for m, state in held.items() if state == "READY"}
            (cold,) = set(models) - resident
            await traced_call(fleet, cold)
            spans = await caller_spans(receiver, 3)
    server = server_span(spans)
    (wait,) = [s for s in spans if s.name == "load wait"]
    assert wait.parent_id == server.span_id
    assert wait.attributes["model"] == cold
    assert wait.end_ns - wait.start_ns >= 150_000_000  # the 200 ms load, less timer slack
    (attempt,) = [s for s in spans if s.kind == CLIENT]
    assert attempt.start_ns >= wait.end_ns  # sent once the load was done


async def test_a_call_refused_at_admission_says_why_on_its_span() -> None:
    slow = catalogue_from_yaml(SLOW)
    with otlp_receiver() as receiver:
        async with open_fleet(
            1,
            catalogues=[slow],
            grpc=GrpcLimits(max_concurrent_requests_per_worker=1),
            tracing=quick_tracing(receiver.url),
        ) as fleet:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fleet.infer, simple_body(0, "slow"))  # holds the one slot
                await wait_until_async(lambda: fleet.workers[0].service.inflight > 0, 10)
                try:  # a slot would not come in time for a 0.1 s deadline: refused now
                    await traced_call(fleet, "slow", within=0.1)
                except GrpcError as exc:
                    assert exc.code is StatusCode.RESOURCE_EXHAUSTED
                    refusal = exc.message
                else:
                    raise AssertionError("the call was admitted")
            spans = await caller_spans(receiver, 1)
    server = server_span(spans)
    assert server.attributes["rpc.grpc.status_code"] == StatusCode.RESOURCE_EXHAUSTED
    assert "not admitted" in refusal
    assert server.status_message == f"RESOURCE_EXHAUSTED: {refusal}"
    assert not [s for s in spans if s.kind == CLIENT]  # no worker was tried


async def test_a_fan_out_and_a_stream_are_traced_with_a_span_per_worker() -> None:
    with otlp_receiver() as receiver:
        async with open_fleet(2, tracing=quick_tracing(receiver.url)) as fleet:
            client = grpcclient.InferenceServerClient(fleet.target)
            try:  # every worker is asked to unregister every region
                await in_thread(
                    lambda: client.unregister_system_shared_memory(
                        headers={"traceparent": TRACEPARENT}
                    )
                )
            finally:
                client.close()
            spans = await caller_spans(receiver, 3)
            unregister = server_span(spans)
            assert unregister.name == "SystemSharedMemoryUnregister"
            calls = [s for s in spans if s.kind == CLIENT and s.parent_id == unregister.span_id]
            assert sorted(str(c.attributes["rsgw.worker"]) for c in calls) == ["worker0", "worker1"]
            assert all(c.attributes["rpc.grpc.status_code"] == 0 for c in calls)

            async with fleet.channel().stream(
                Method.MODEL_STREAM_INFER.wire, metadata=CALLER
            ) as stream:
                for seed in range(2):
                    await stream.send(simple_body(seed))
                stream.end()
                replies = [reply async for reply in stream]
            assert len(replies) == 2
            # Its worker streams end before it does: in its export or an earlier one.
            spans = await in_thread(
                lambda: receiver.wait_for(
                    lambda got: any(s.name == "ModelStreamInfer" for s in got)
                )
            )
    spans = [s for s in spans if s.trace_id == CALLER_TRACE and s not in [unregister, *calls]]
    streamed = server_span(spans)
    assert streamed.name == "ModelStreamInfer"
    upstreams = [s for s in spans if s.kind == CLIENT]  # one per worker it went to
    assert 1 <= len(upstreams) <= 2
    assert all(u.parent_id == streamed.span_id for u in upstreams)
    assert all(u.attributes["rpc.grpc.status_code"] == 0 for u in upstreams)
