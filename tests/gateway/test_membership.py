"""Workers that join and leave a running gateway (issue 24, in progress).

Memory fleets with the autojump clock, as tests/gateway/test_failover.py: eight clients
keep calling while a worker is added or removed, and no call fails.
"""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from rsgw._errors import ConfigError, RsgwError
from rsgw._status import StatusCode
from rsgw.worker._catalogue import builtin_catalogue
from rsgw.worker._worker import RunningWorker, WorkerConfig
from tests.gateway.fleet import Fleet, open_fleet, start_worker
from tests.gateway.test_control import CtlFailed
from tests.gateway.test_control import ctl_in_memory as ctl
from tests.gateway.test_failover import PROBING, check_simple, served
from tests.gateway.test_lpt_packing import lpt
from tests.helpers import wait_until_async


async def load(fleet: Fleet, calls: int, at_call_20: object) -> list[RsgwError]:
    """Eight clients making `calls` calls in all; the first runs `at_call_20` (an async
    callable) in the background at its 20th call. Returns the calls' errors."""
    errors: list[RsgwError] = []

    async with trio.open_nursery() as clients:

        async def client(index: int) -> None:
            channel = fleet.channel()
            for i in range(calls // 8 + 1):
                try:
                    await check_simple(fleet, index * 1000 + i, channel)
                except RsgwError as exc:
                    errors.append(exc)
                if index == 0 and i == 20:
                    clients.start_soon(at_call_20)  # type: ignore[arg-type]

        for c in range(8):
            clients.start_soon(client, c)
    return errors


async def extra_worker(fleet: Fleet, name: str) -> tuple[RunningWorker, str]:
    config = WorkerConfig(
        name=name, gpu="9", port=0, metrics_port=-1, catalogue=builtin_catalogue()
    )
    worker: RunningWorker = await fleet.nursery.start(start_worker, config, fleet.network)
    return worker, f"127.0.0.1:{worker.grpc_port}"


async def test_a_worker_added_under_load_takes_traffic(autojump_clock: MockClock) -> None:
    async with open_fleet(2, memory=True, **PROBING) as fleet:
        newcomer, url = await extra_worker(fleet, "worker-new")

        async def add() -> None:
            fleet.gateway.add_worker(url, "worker-new")

        errors = await load(fleet, 400, add)
        assert errors == []
        assert url in fleet.gateway.statistics().workers
        await wait_until_async(lambda: url in fleet.gateway.statistics().ready, what="ready")
        before = served(newcomer)
        await load(fleet, 80, trio.lowlevel.checkpoint)
        assert served(newcomer) > before, "round_robin sends the new worker its share"


async def test_a_worker_removed_under_load_drains(autojump_clock: MockClock) -> None:
    async with open_fleet(3, memory=True, **PROBING) as fleet:
        leaving = fleet.worker_url(1)
        cut: list[int] = []

        async def remove() -> None:
            cut.append(await fleet.gateway.remove_worker("worker1", drain_seconds=5))

        errors = await load(fleet, 400, remove)
        assert errors == [] and cut == [0]
        status = fleet.gateway.statistics()
        assert leaving not in status.workers and leaving not in status.ready
        assert all(leaving not in replicas for replicas in status.models.values())
        exposition = fleet.gateway._service.metrics.render().decode()
        assert 'worker="worker0"' in exposition
        assert 'worker="worker1"' not in exposition, "no series stays behind"
        before = served(fleet.workers[1])
        await load(fleet, 80, trio.lowlevel.checkpoint)
        assert served(fleet.workers[1]) == before, "no call reaches a removed worker"


async def test_membership_changes_that_cannot_be_made(autojump_clock: MockClock) -> None:
    async with open_fleet(2, memory=True, **PROBING) as fleet:
        gateway = fleet.gateway
        with pytest.raises(ConfigError, match="is a worker already"):
            gateway.add_worker(fleet.worker_url(0))
        with pytest.raises(ConfigError, match="the name 'worker0' is taken"):
            gateway.add_worker("127.0.0.1:1", "worker0")
        with pytest.raises(ConfigError, match="not host:port"):
            gateway.add_worker("nocolon")
        with pytest.raises(ConfigError, match="no worker is called 'gpu-q'"):
            await gateway.remove_worker("gpu-q")
        await gateway.remove_worker("worker0", drain_seconds=1)
        with pytest.raises(ConfigError, match="is the last worker"):
            await gateway.remove_worker("worker1")
    async with open_fleet(
        2, memory=True, scheduling=lpt(), startup_wait_seconds=30.0, **PROBING
    ) as fleet:
        with pytest.raises(ConfigError, match="not supported under lpt_packing yet"):
            fleet.gateway.add_worker("127.0.0.1:1")


async def test_rsgw_ctl_adds_and_removes_workers(autojump_clock: MockClock) -> None:
    async with open_fleet(2, memory=True, **PROBING) as fleet:
        _, url = await extra_worker(fleet, "gpu-new")
        assert await ctl(fleet, "add-worker", url, "--name", "gpu-new") == (
            "added gpu-new; 3 workers"
        )
        await wait_until_async(lambda: url in fleet.gateway.statistics().ready, what="ready")
        with pytest.raises(CtlFailed) as taken:
            await ctl(fleet, "add-worker", url)
        assert taken.value.error.code is StatusCode.ALREADY_EXISTS
        with pytest.raises(CtlFailed) as bad:
            await ctl(fleet, "add-worker", "nocolon")
        assert bad.value.error.code is StatusCode.INVALID_ARGUMENT
        said = await ctl(fleet, "remove-worker", "worker0", "--drain-seconds", "2")
        assert said.startswith("removed worker0 after ") and said.endswith("; 2 workers")
        with pytest.raises(CtlFailed) as unknown:
            await ctl(fleet, "remove-worker", "worker0")
        assert unknown.value.error.code is StatusCode.NOT_FOUND
        await ctl(fleet, "remove-worker", "gpu-new")
        with pytest.raises(CtlFailed) as last:
            await ctl(fleet, "remove-worker", "worker1")
        assert last.value.error.code is StatusCode.FAILED_PRECONDITION
        await check_simple(fleet, 7)  # the last worker still serves
