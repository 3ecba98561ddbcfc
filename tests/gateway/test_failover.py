"""Workers that die, hang or come back: the gateway keeps serving (issue 5, items 2-3).

Workers run as real subprocesses here, so they can be SIGKILLed and SIGSTOPped;
the gateway runs in the test's Trio run, so the test can read its state.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import trio

from rsgw._config import GatewayConfig, ListenConfig
from rsgw.gateway._gateway import RunningGateway, serve_gateway
from tests.helpers import (
    WorkerProcess,
    check_simple,
    infer_request,
    model_infer,
    simple_inputs,
    start_worker_process,
    wait_until_async,
)

OTHER_MODEL = """
models:
  - name: other
    compute: add_sub
    max_batch_size: 8
    inputs:
      - {name: INPUT0, datatype: INT32, shape: [-1, 16]}
      - {name: INPUT1, datatype: INT32, shape: [-1, 16]}
    outputs:
      - {name: OUTPUT0, datatype: INT32, shape: [-1, 16]}
      - {name: OUTPUT1, datatype: INT32, shape: [-1, 16]}
"""


@pytest.fixture
def three_workers() -> Iterator[list[WorkerProcess]]:
    workers = [start_worker_process("--name", f"worker{i}") for i in range(3)]
    yield workers
    for worker in workers:
        worker.stop()


def config_for(workers: list[WorkerProcess], **overrides: object) -> GatewayConfig:
    base = GatewayConfig(
        endpoints=tuple(w.target for w in workers),
        metrics_endpoints=tuple(f"127.0.0.1:{w.metrics_port}" for w in workers),
        worker_names=tuple(f"worker{i}" for i in range(len(workers))),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0"),
        health_interval_seconds=0.3,
        probe_timeout_seconds=1.0,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]  # test overrides


async def readyz(gateway: RunningGateway) -> int:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"http://127.0.0.1:{gateway.admin_port}/readyz")).status_code


async def test_sigkill_during_a_run_loses_no_request(three_workers: list[WorkerProcess]) -> None:
    config = config_for(three_workers)
    async with trio.open_nursery() as nursery:
        gateway: RunningGateway = await nursery.start(serve_gateway, config)
        target = f"127.0.0.1:{gateway.grpc_port}"
        assert await readyz(gateway) == 200
        errors: list[BaseException] = []
        slowest = 0.0
        done = 0
        victim = three_workers[1]

        def client(worker_index: int) -> None:
            nonlocal slowest, done
            with grpc.insecure_channel(target) as channel:
                call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
                for i in range(500 // 8 + 1):
                    n = worker_index * 1000 + i
                    body = infer_request("simple", simple_inputs(n)).SerializeToString()
                    started = time.monotonic()
                    try:
                        call(body, timeout=30)
                    except grpc.RpcError as exc:
                        errors.append(exc)
                    slowest = max(slowest, time.monotonic() - started)
                    done += 1
                    if worker_index == 0 and i == 20:
                        os.kill(victim.process.pid, signal.SIGKILL)

        async with trio.open_nursery() as clients:
            for c in range(8):
                clients.start_soon(trio.to_thread.run_sync, client, c)
        assert done >= 500
        assert errors == []
        assert slowest < 2.0, f"a call waited {slowest:.2f} s: failover must not wait for timeouts"
        # The dead worker leaves the table at the next probe round; the others stay ready.
        await wait_until_async(
            lambda: victim.target not in gateway.statistics().ready, what="unready"
        )
        assert await readyz(gateway) == 200
        nursery.cancel_scope.cancel()


async def test_readyz_follows_the_workers_and_a_restarted_worker_gets_traffic() -> None:
    worker = start_worker_process("--name", "worker0")
    port = worker.grpc_port
    try:
        async with trio.open_nursery() as nursery:
            gateway: RunningGateway = await nursery.start(serve_gateway, config_for([worker]))
            assert await readyz(gateway) == 200
            worker.stop()
            await wait_until_async(lambda: not gateway.statistics().ready, what="no ready worker")
            assert await readyz(gateway) == 503
            worker = start_worker_process("--name", "worker0", "--port", str(port))
            await wait_until_async(lambda: bool(gateway.statistics().ready), what="worker back")
            assert await readyz(gateway) == 200
            target = f"127.0.0.1:{gateway.grpc_port}"
            await trio.to_thread.run_sync(check_simple, target, 7)
            nursery.cancel_scope.cancel()
    finally:
        worker.stop()


async def test_sigstop_resets_the_channel_and_others_stay_fast(tmp_path: Path) -> None:
    catalogue = tmp_path / "other.yaml"
    catalogue.write_text(OTHER_MODEL)
    healthy = start_worker_process("--name", "worker0")
    stopped = start_worker_process("--name", "worker1", "--models", str(catalogue))
    try:
        async with trio.open_nursery() as nursery:
            config = config_for([healthy, stopped])
            gateway: RunningGateway = await nursery.start(serve_gateway, config)
            target = f"127.0.0.1:{gateway.grpc_port}"
            inputs = simple_inputs(3)
            await trio.to_thread.run_sync(model_infer, target, infer_request("other", inputs))
            os.kill(stopped.process.pid, signal.SIGSTOP)
            try:
                resets = gateway.statistics().channel_resets
                deadline = trio.current_time() + 10
                slowest = 0.0
                while gateway.statistics().channel_resets == resets:
                    assert trio.current_time() < deadline, "the watchdog never reset the channel"
                    started = time.monotonic()
                    await trio.to_thread.run_sync(check_simple, target, 1)
                    slowest = max(slowest, time.monotonic() - started)
                assert slowest < 1.0
                assert stopped.target not in gateway.statistics().ready
            finally:
                os.kill(stopped.process.pid, signal.SIGCONT)
            with trio.fail_after(10):
                await wait_until_async(
                    lambda: stopped.target in gateway.statistics().ready, what="back"
                )
            response = await trio.to_thread.run_sync(
                model_infer, target, infer_request("other", inputs)
            )
            assert response.model_name == "other"
            nursery.cancel_scope.cancel()
    finally:
        healthy.stop()
        stopped.stop()
