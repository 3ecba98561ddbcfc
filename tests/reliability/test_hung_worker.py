"""A worker that stops answering costs a replicated model nothing.

Real `rsgw worker` processes behind an in-process gateway on loopback, 16
closed-loop grpcio callers with 5 s deadlines. One worker is SIGSTOPped: within
about `stall + ping_timeout` the gateway ejects it (no PING answer), the calls
waiting on it fail over, and the other two carry the load; after SIGCONT the
prober brings it back. The prober's own probe timeout is left at its 8 s default,
so it is the stall watch, not the prober, that acts.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import trio

from rsgw.config._config import GatewayConfig, ListenConfig
from rsgw.gateway._gateway import serve_gateway
from rsgw.gateway._running import RunningGateway
from tests.helpers import (
    WorkerProcess,
    infer_request,
    simple_inputs,
    start_worker_process,
    wait_until_async,
)

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
CALLERS = 16
STOPPED_SECONDS = 5.0


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started = [start_worker_process("--name", f"worker{i}") for i in range(3)]
    yield started
    for worker in started:
        with_signal(worker, signal.SIGCONT)
        worker.stop()


def with_signal(worker: WorkerProcess, signum: signal.Signals) -> None:
    if worker.process.poll() is None:
        os.kill(worker.process.pid, signum)


def _config(workers: list[WorkerProcess], *, health_interval: float) -> GatewayConfig:
    """The gateway in front of `workers`, on loopback; the prober's timeout at its default."""
    return GatewayConfig(
        endpoints=tuple(w.target for w in workers),
        worker_names=tuple(f"worker{i}" for i in range(len(workers))),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
        health_interval_seconds=health_interval,
    )


class Load:
    """Closed-loop callers; every completion time and every error, for the test to read."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.done: list[float] = []
        self.errors: list[grpc.RpcError] = []
        self.stop = threading.Event()

    def caller(self, index: int) -> None:
        with grpc.insecure_channel(self.target) as channel:
            call = channel.unary_unary(MODEL_INFER)
            n = 0
            while not self.stop.is_set():
                request = infer_request("simple", simple_inputs(index * 100_000 + n))
                body = request.SerializeToString()
                try:
                    call(body, timeout=5)
                    self.done.append(time.monotonic())
                except grpc.RpcError as exc:
                    self.errors.append(exc)
                n += 1

    def rate(self, start: float, end: float) -> float:
        return sum(start <= t < end for t in self.done) / (end - start)


async def test_a_sigstopped_worker_is_ejected_and_costs_no_call(
    workers: list[WorkerProcess],
) -> None:
    config = _config(workers, health_interval=1.0)
    victim = workers[1]
    async with trio.open_nursery() as nursery:
        gateway: RunningGateway = await nursery.start(serve_gateway, config)
        load = Load(f"127.0.0.1:{gateway.grpc_port}")
        async with trio.open_nursery() as callers:
            for i in range(CALLERS):
                callers.start_soon(trio.to_thread.run_sync, load.caller, i)
            await trio.sleep(3)  # warm-up, then the baseline
            baseline_end = time.monotonic()
            with_signal(victim, signal.SIGSTOP)
            stopped_at = time.monotonic()
            await wait_until_async(
                lambda: victim.target not in gateway.statistics().ready, what="the ejection"
            )
            ejected_after = time.monotonic() - stopped_at
            await trio.sleep(max(0.0, STOPPED_SECONDS - (time.monotonic() - stopped_at)))
            with_signal(victim, signal.SIGCONT)
            resumed_at = time.monotonic()
            await wait_until_async(
                lambda: victim.target in gateway.statistics().ready,
                seconds=20,
                what="the worker's return",
            )
            load.stop.set()
        nursery.cancel_scope.cancel()

    assert load.errors == [], load.errors[:3]
    assert ejected_after < 3.0, f"ejected only after {ejected_after:.1f} s"
    baseline = load.rate(baseline_end - 2.0, baseline_end)
    during = load.rate(stopped_at, resumed_at)
    print(f"ejected after {ejected_after:.2f} s; {baseline:.0f} calls/s, {during:.0f} stopped")
    # At least 70% of what the two healthy workers' share (2/3) of the baseline is.
    assert during >= 0.7 * (2 / 3) * baseline, (during, baseline)
    metrics = gateway.statistics()
    assert victim.target in metrics.ready


async def test_ejection_is_logged_and_counted(
    workers: list[WorkerProcess], caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(workers, health_interval=0.5)
    victim = workers[2]
    caplog.set_level(logging.INFO, logger="rsgw")
    async with trio.open_nursery() as nursery:
        gateway: RunningGateway = await nursery.start(serve_gateway, config)
        load = Load(f"127.0.0.1:{gateway.grpc_port}")
        async with trio.open_nursery() as callers:
            for i in range(4):
                callers.start_soon(trio.to_thread.run_sync, load.caller, i)
            await wait_until_async(lambda: len(load.done) >= 100, what="load")
            with_signal(victim, signal.SIGSTOP)
            await wait_until_async(
                lambda: victim.target not in gateway.statistics().ready, what="the ejection"
            )
            with_signal(victim, signal.SIGCONT)
            await wait_until_async(
                lambda: victim.target in gateway.statistics().ready, seconds=20, what="return"
            )
            load.stop.set()
        nursery.cancel_scope.cancel()
    assert load.errors == []
    messages = [r.getMessage() for r in caplog.records]
    assert "worker ejected" in messages and "worker returned" in messages
    ejected = next(r for r in caplog.records if r.getMessage() == "worker ejected")
    assert ejected.__dict__["worker"] == "worker2"


async def test_a_draining_worker_costs_no_call(workers: list[WorkerProcess]) -> None:
    """SIGTERM to a worker under load: it finishes what it has, the rest go elsewhere."""
    config = _config(workers, health_interval=0.5)
    victim = workers[0]
    async with trio.open_nursery() as nursery:
        gateway: RunningGateway = await nursery.start(serve_gateway, config)
        load = Load(f"127.0.0.1:{gateway.grpc_port}")
        async with trio.open_nursery() as callers:
            for i in range(CALLERS):
                callers.start_soon(trio.to_thread.run_sync, load.caller, i)
            await wait_until_async(lambda: len(load.done) >= 200, what="load")
            victim.process.send_signal(signal.SIGTERM)
            exit_code = await trio.to_thread.run_sync(victim.process.wait, 30)
            after_exit = len(load.done)
            await wait_until_async(lambda: len(load.done) >= after_exit + 200, what="more load")
            load.stop.set()
        nursery.cancel_scope.cancel()
    assert exit_code == 0
    assert load.errors == [], load.errors[:3]
    assert len(load.done) > 400
