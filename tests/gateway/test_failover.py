"""Workers that die, hang or come back: the gateway keeps serving (issue 5, items 2-3).

Most tests run the fleet (in-process workers and the gateway) on memory streams
with the autojump clock: what they test is the gateway's failover, readiness and
watchdog, not the socket. A killed worker is its `aclose()` (its server's streams
close, the gateway reads EOF and new connections are refused, as after SIGKILL);
a SIGSTOPped worker is `network.freeze(url)` (no byte moves to or from it) and
SIGCONT is `thaw`. The probe interval and the probe watchdog then cost no wall
time, and "fast" is measured on the virtual clock, where only waiting for a
timer takes time. Readiness is read from `gateway.statistics().ready`, which is
what `/readyz` answers from (200 if any worker is ready).

One test stays with real processes: `test_sigkill_during_a_run_loses_no_request_real_processes`
SIGKILLs an `rsgw worker` subprocess under load from grpcio clients. Only a real
process killed by the kernel shows what happens to its sockets (connections torn
down mid-call, a port that refuses), and only a real client shows that none of
that reaches it; it is the end-to-end check of the memory tests' model.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw.base._errors import GrpcError, RsgwError
from rsgw.base._status import StatusCode
from rsgw.config._config import GatewayConfig, ListenConfig
from rsgw.gateway._gateway import serve_gateway
from rsgw.gateway._running import RunningGateway
from rsgw.grpc._client import Channel
from rsgw.worker._worker import RunningWorker, WorkerConfig
from rsgw.worker.models._catalogue import builtin_catalogue
from tests.gateway.fleet import Fleet, open_fleet, start_worker
from tests.helpers import (
    WorkerProcess,
    catalogue_from_yaml,
    infer_request,
    output_array,
    simple_inputs,
    start_worker_process,
    wait_until_async,
)
from tests.memory import MemoryNetwork

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

#: The prober settings of every test here: a round every 0.3 s, a hung probe after 1 s.
PROBING: dict[str, Any] = {"health_interval_seconds": 0.3, "probe_timeout_seconds": 1.0}


async def check_simple(fleet: Fleet, seed: int, channel: Channel | None = None) -> None:
    """`tests.helpers.check_simple` through the gateway with rsgw's own client."""
    inputs = simple_inputs(seed)
    response = await fleet.infer(infer_request("simple", inputs), channel=channel)
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    np.testing.assert_array_equal(output_array(response, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(response, "OUTPUT1"), a - b)


def served(worker: RunningWorker, model: str = "simple") -> int:
    return worker.service.device.counters[model].requests_served


# ---------------------------------------------------------------------------
# Memory fleets with the autojump clock.


async def test_sigkill_during_a_run_loses_no_request(autojump_clock: MockClock) -> None:
    """SIGKILL is the worker's `kill()`: its streams close, its port refuses."""
    async with open_fleet(3, memory=True, **PROBING) as fleet:
        gateway = fleet.gateway
        everyone = frozenset(gateway.config.endpoints)
        assert gateway.statistics().ready == everyone
        victim = fleet.workers[1]
        victim_url = fleet.worker_url(1)
        errors: list[RsgwError] = []
        slowest = 0.0
        done = 0
        served_before_kill = 0

        async def client(index: int) -> None:
            nonlocal slowest, done, served_before_kill
            channel = fleet.channel()  # one connection per client, as a grpcio channel
            for i in range(500 // 8 + 1):
                request = infer_request("simple", simple_inputs(index * 1000 + i))
                started = trio.current_time()
                try:
                    await fleet.infer(request, deadline=started + 30, channel=channel)
                except RsgwError as exc:
                    errors.append(exc)
                slowest = max(slowest, trio.current_time() - started)
                done += 1
                if index == 0 and i == 20:
                    served_before_kill = served(victim)
                    victim.kill()

        async with trio.open_nursery() as clients:
            for c in range(8):
                clients.start_soon(client, c)
        assert done >= 500
        assert errors == []
        assert slowest < 2.0, f"a call waited {slowest:.2f} s: failover must not wait for timeouts"
        assert served_before_kill > 0  # the victim was in the rotation when it died
        assert served(fleet.workers[0]) + served(fleet.workers[2]) >= done - served_before_kill
        # The dead worker leaves the table at the next probe round; the others stay ready.
        await wait_until_async(lambda: victim_url not in gateway.statistics().ready, what="unready")
        assert gateway.statistics().ready == everyone - {victim_url}  # /readyz says 200


async def test_readyz_follows_the_workers_and_a_restarted_worker_gets_traffic(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(1, memory=True, **PROBING) as fleet:
        gateway = fleet.gateway
        url = fleet.worker_url(0)
        assert gateway.statistics().ready == {url}  # /readyz says 200
        port = fleet.workers[0].grpc_port
        await fleet.workers[0].aclose()
        await wait_until_async(lambda: not gateway.statistics().ready, what="no ready worker")
        # /readyz says 503 now. The same worker comes back on the same port.
        config = WorkerConfig(name="worker0", gpu="0", port=port, metrics_port=-1)
        restarted: RunningWorker = await fleet.nursery.start(start_worker, config, fleet.network)
        assert restarted.grpc_port == port
        await wait_until_async(lambda: bool(gateway.statistics().ready), what="worker back")
        assert gateway.statistics().ready == {url}  # /readyz says 200 again
        await check_simple(fleet, 7)
        assert served(restarted) == 1


async def test_sigstop_resets_the_channel_and_others_stay_fast(autojump_clock: MockClock) -> None:
    """SIGSTOP is `network.freeze(url)`, SIGCONT `thaw(url)`."""
    other = catalogue_from_yaml(OTHER_MODEL, with_builtin=False)
    async with open_fleet(
        2, memory=True, catalogues=[builtin_catalogue(), other], **PROBING
    ) as fleet:
        gateway = fleet.gateway
        network = fleet.network
        assert isinstance(network, MemoryNetwork)
        stopped = fleet.worker_url(1)
        inputs = simple_inputs(3)
        assert (await fleet.infer(infer_request("other", inputs))).model_name == "other"
        channel = fleet.channel()
        network.freeze(stopped)  # SIGSTOP
        try:
            resets = gateway.statistics().channel_resets
            deadline = trio.current_time() + 10
            slowest = 0.0
            calls = 0
            while gateway.statistics().channel_resets == resets:
                assert trio.current_time() < deadline, "the watchdog never reset the channel"
                started = trio.current_time()
                await check_simple(fleet, 1, channel)
                slowest = max(slowest, trio.current_time() - started)
                calls += 1
                await trio.sleep(0.05)  # the next call a little later in the hang
            assert calls > 1  # the calls went on while the probe hung, not only before it
            assert slowest < 1.0
            assert stopped not in gateway.statistics().ready
        finally:
            network.thaw(stopped)  # SIGCONT
        with trio.fail_after(10):
            await wait_until_async(lambda: stopped in gateway.statistics().ready, what="back")
        response = await fleet.infer(infer_request("other", inputs))
        assert response.model_name == "other"
        assert served(fleet.workers[1], "other") == 2


# ---------------------------------------------------------------------------
# Real processes: the end-to-end check (see the module docstring).


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
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
        health_interval_seconds=0.3,
        probe_timeout_seconds=1.0,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]  # test overrides


async def readyz(gateway: RunningGateway) -> int:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"http://127.0.0.1:{gateway.admin_port}/readyz")).status_code


async def test_sigkill_during_a_run_loses_no_request_real_processes(
    three_workers: list[WorkerProcess],
) -> None:
    """Real `rsgw worker` processes, one SIGKILLed under load from grpcio client threads."""
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


async def test_a_known_model_with_every_replica_down_is_unavailable_naming_no_address(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(2, memory=True, health_interval_seconds=0.5) as fleet:
        await fleet.infer(infer_request("simple", simple_inputs(0)))
        for worker in fleet.workers:
            await worker.aclose()
        await wait_until_async(lambda: not fleet.gateway.statistics().ready, what="all down")
        with pytest.raises(GrpcError) as caught:
            await fleet.infer(infer_request("simple", simple_inputs(1)))
        assert caught.value.code is StatusCode.UNAVAILABLE
        assert caught.value.message == "model 'simple' has no ready replica"
        with pytest.raises(GrpcError) as caught:
            await fleet.infer(infer_request("never_served", simple_inputs(1)))
        assert caught.value.code is StatusCode.NOT_FOUND
        assert caught.value.message == "Request for unknown model: 'never_served' is not found"


async def test_a_replica_that_fails_is_named_not_addressed(autojump_clock: MockClock) -> None:
    async with open_fleet(1, memory=True, health_interval_seconds=3600) as fleet:
        await fleet.workers[0].aclose()  # the table still lists it until the next round
        with pytest.raises(GrpcError) as caught:
            await fleet.infer(infer_request("simple", simple_inputs(0)))
        assert caught.value.code is StatusCode.UNAVAILABLE
        assert caught.value.message == "worker0 is unavailable"
