"""Workers that join and leave a running gateway (issue 24).

Memory fleets with the autojump clock, as tests/gateway/test_failover.py: eight clients
keep calling while a worker is added or removed (by the operator, or by gateway.yml
read again on SIGHUP), and no call fails. DNS discovery is tests/gateway/test_discovery.py.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import uuid
from pathlib import Path

import pytest
import trio
import yaml
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import ConfigError, RsgwError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._config import GatewayConfig, GrpcLimits, load_config
from rsgw.gateway._members import is_own_address
from rsgw.grpc._client import Channel
from rsgw.worker._worker import RunningWorker, WorkerConfig
from rsgw.worker.models._catalogue import builtin_catalogue
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


async def test_departed_workers_leave_nothing_behind(autojump_clock: MockClock) -> None:
    """Addresses churn (DNS discovery, an autoscaler): a worker that left and drained
    keeps no channel or name in the pool, so the pool stays the size of the fleet."""
    async with open_fleet(1, memory=True, **PROBING) as fleet:
        pool = fleet.gateway._service.pool
        for port in range(30000, 30050):  # nothing listens there: added, never ready
            url = f"127.0.0.1:{port}"
            fleet.gateway.add_worker(url)
            assert await fleet.gateway.remove_worker(url, drain_seconds=1) == 0
        assert len(pool.channels) == 1
        assert pool.public_name(url) == "worker50", "named for a call that outlived it"
        await check_simple(fleet, 3)


async def test_an_address_back_before_its_drain_ended_keeps_its_new_channel(
    autojump_clock: MockClock,
) -> None:
    """gateway.yml drops a worker and lists it again before its drain ran: the drain
    closes the departed member's channel, not the newcomer's at the same address."""
    current: list[GatewayConfig] = []
    async with open_fleet(2, memory=True, reload_config=lambda: current[0], **PROBING) as fleet:
        gateway, prober = fleet.gateway, fleet.gateway._service.prober
        both = gateway.config
        one = dataclasses.replace(
            both, endpoints=both.endpoints[:1], worker_names=both.worker_names[:1]
        )
        current.append(one)
        gateway.reload()  # worker1 leaves; its drain starts in the background...
        current[0] = both
        gateway.reload()  # ...and it is back before the drain has run
        assert gateway.statistics().workers == both.endpoints
        await wait_until_async(lambda: fleet.worker_url(1) in prober.ready, what="ready again")
        await trio.testing.wait_all_tasks_blocked()  # the drain has run
        for _ in range(2):  # a round that started after it
            await prober.next_round()
        assert fleet.worker_url(1) in prober.ready


async def test_membership_changes_that_cannot_be_made(autojump_clock: MockClock) -> None:
    async with open_fleet(2, memory=True, **PROBING) as fleet:
        gateway = fleet.gateway
        with pytest.raises(ConfigError, match="is a worker already"):
            gateway.add_worker(fleet.worker_url(0))
        with pytest.raises(ConfigError, match="worker name 'worker0' would name both"):
            gateway.add_worker("127.0.0.1:1", "worker0")
        with pytest.raises(ConfigError, match="not host:port"):
            gateway.add_worker("nocolon")
        with pytest.raises(ConfigError, match="this gateway's own address"):
            gateway.add_worker(f"127.0.0.1:{gateway.grpc_port}")
        for name in ("a b", "x" * 129, "tab\there"):
            with pytest.raises(ConfigError, match="at most 128 printable characters"):
                gateway.add_worker("127.0.0.1:2", name)
        with pytest.raises(ConfigError, match="no worker is called 'gpu-q'"):
            await gateway.remove_worker("gpu-q")
        await gateway.remove_worker("worker0", drain_seconds=1)
        with pytest.raises(ConfigError, match="is the last worker"):
            await gateway.remove_worker("worker1")


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


async def test_under_lpt_packing_a_worker_joins_the_placement_and_leaves_it(
    autojump_clock: MockClock,
) -> None:
    scheduling = lpt(first_rebalance_compute_seconds=1000.0, default_replicas="all")
    async with open_fleet(
        2, memory=True, scheduling=scheduling, startup_wait_seconds=30.0, **PROBING
    ) as fleet:
        gateway = fleet.gateway
        newcomer, url = await extra_worker(fleet, "worker-new")

        async def add() -> None:
            gateway.add_worker(url, "worker-new")

        assert await load(fleet, 400, add) == []
        # Once it answers ready, a repack takes it into the placement.
        await wait_until_async(
            lambda: url in gateway.statistics().placement.get("simple", ()), what="placed"
        )
        before = served(newcomer)
        assert await load(fleet, 80, trio.lowlevel.checkpoint) == []
        assert served(newcomer) > before, "the placement sends the new worker its share"

        leaving = fleet.worker_url(0)

        async def remove() -> None:
            await gateway.remove_worker("worker0", drain_seconds=5)

        assert await load(fleet, 400, remove) == []
        await wait_until_async(
            lambda: all(leaving not in urls for urls in gateway.statistics().placement.values()),
            what="repacked without it",
        )
        exposition = gateway._service.metrics.render().decode()
        stale = [line for line in exposition.splitlines() if leaving in line or "worker0" in line]
        assert stale == [], stale


async def test_the_inbound_cap_follows_the_workers(autojump_clock: MockClock) -> None:
    grpc = GrpcLimits(max_concurrent_requests_per_worker=16)
    async with open_fleet(2, memory=True, grpc=grpc, **PROBING) as fleet:
        service = fleet.gateway._service
        assert service.ledger.max_inflight == 32
        _, url = await extra_worker(fleet, "worker-new")
        fleet.gateway.add_worker(url)
        assert service.ledger.max_inflight == service.queue.cap == 48
        assert "gateway_max_concurrent_requests 48.0" in service.metrics.render().decode()
        await fleet.gateway.remove_worker("worker0", drain_seconds=1)
        assert service.ledger.max_inflight == 32


async def test_rsgw_ctl_status_lists_the_members(autojump_clock: MockClock) -> None:
    async with open_fleet(2, memory=True, **PROBING) as fleet:
        _, url = await extra_worker(fleet, "gpu-new")
        fleet.gateway.add_worker(url)
        await wait_until_async(lambda: url in fleet.gateway.statistics().ready, what="ready")
        lines = (await ctl(fleet, "status")).splitlines()
        start = lines.index("members: 3")
        rows = [line.split() for line in lines[start + 2 : start + 5]]
        assert [row[0] for row in rows] == ["worker0", "worker1", url]
        assert [row[2:5] for row in rows] == [
            ["worker0", "config", "true"],
            ["worker1", "config", "true"],
            ["worker2", "operator", "true"],
        ]


async def test_sighup_applies_a_changed_endpoint_list(autojump_clock: MockClock) -> None:
    """gateway.yml read again under load: a worker it no longer lists drains, a new one
    joins, no call fails; a reload that would rename a worker changes nothing."""
    current: list[GatewayConfig] = []
    async with open_fleet(2, memory=True, reload_config=lambda: current[0], **PROBING) as fleet:
        gateway = fleet.gateway
        newcomer, url = await extra_worker(fleet, "worker-new")
        current.append(
            dataclasses.replace(
                gateway.config,
                endpoints=(fleet.worker_url(1), url),
                worker_names=("worker1", "worker-new"),
            )
        )

        async def reload() -> None:
            gateway.reload()

        assert await load(fleet, 400, reload) == []
        await wait_until_async(lambda: url in gateway.statistics().ready, what="ready")
        assert gateway.statistics().workers == (fleet.worker_url(1), url)
        before = served(newcomer), served(fleet.workers[0])
        assert await load(fleet, 80, trio.lowlevel.checkpoint) == []
        assert served(newcomer) > before[0] and served(fleet.workers[0]) == before[1]

        current[0] = dataclasses.replace(current[0], worker_names=("gpu-a", "worker-new"))
        gateway.reload()  # a rename: refused, logged, nothing changes
        assert gateway.statistics().workers == (fleet.worker_url(1), url)


async def test_a_changed_gateway_yml_is_applied_without_a_signal(
    autojump_clock: MockClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The file watch: gateway.yml rewritten (a ConfigMap update, say) is applied as
    SIGHUP would apply it, within a check interval; a file that does not parse is not."""
    path = tmp_path / "gateway.yml"
    path.write_text("endpoints: []\n")
    load = functools.partial(load_config, str(path), {})
    async with open_fleet(
        2, memory=True, reload_config=load, config_file=str(path), **PROBING
    ) as fleet:
        gateway = fleet.gateway
        mapping = gateway.config.to_mapping()
        path.write_text("endpoints: [\n")  # half written: refused, nothing changes
        await wait_until_async(
            lambda: any("gateway.yml not applied" in r.getMessage() for r in caplog.records),
            what="the refusal logged",
        )
        assert gateway.statistics().workers == (fleet.worker_url(0), fleet.worker_url(1))
        mapping["endpoints"] = [fleet.worker_url(1)]
        mapping["worker_names"] = ["worker1"]
        mapping["metrics_endpoints"] = []
        path.write_text(yaml.safe_dump(mapping))
        await wait_until_async(
            lambda: gateway.statistics().workers == (fleet.worker_url(1),), what="applied"
        )


async def test_a_removed_worker_has_the_gateways_regions_unregistered() -> None:
    """Real sockets (the worker checks who maps a region from the kernel's socket table):
    a region registered through the gateway is registered on a worker that joins, and
    unregistered on one that leaves."""
    key = f"/rsgw-members-{uuid.uuid4().hex[:10]}"
    fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 64)
        async with open_fleet(2) as fleet:
            region = pb.SystemSharedMemoryRegisterRequest(name="r0", key=key, byte_size=64)
            await fleet.channel().unary(Method.SHM_REGISTER.wire, region.SerializeToString())

            async def regions(url: str) -> list[str]:
                channel = Channel(url, fleet.nursery)
                status = pb.SystemSharedMemoryStatusResponse.FromString(
                    await channel.unary(Method.SHM_STATUS.wire, b"")
                )
                await channel.aclose()
                return sorted(status.regions)

            _, url = await extra_worker(fleet, "worker-new")
            fleet.gateway.add_worker(url)
            await wait_until_async(lambda: url in fleet.gateway.statistics().ready, what="ready")
            assert await regions(url) == ["r0"], "registered on the worker that joined"
            leaving = fleet.worker_url(0)
            assert await regions(leaving) == ["r0"]
            assert await fleet.gateway.remove_worker("worker0", drain_seconds=1) == 0
            assert await regions(leaving) == [], "unregistered on the worker that left"
            assert await regions(fleet.worker_url(1)) == ["r0"], "the others keep theirs"
    finally:
        os.close(fd)
        os.unlink("/dev/shm" + key)


@pytest.mark.parametrize(
    ("url", "listen", "own"),
    [
        ("127.0.0.1:8001", "0.0.0.0:8001", True),
        ("localhost:8001", "127.0.0.1:8001", True),
        ("[::1]:8001", "[::]:8001", True),
        ("127.0.0.2:8001", "127.0.0.1:8001", False),  # another address, same port
        ("127.0.0.1:8002", "0.0.0.0:8001", False),
        ("192.0.2.7:8001", "0.0.0.0:8001", False),  # TEST-NET: no address of this host
        ("gpu7.example:8001", "0.0.0.0:8001", False),  # names are not resolved
    ],
)
def test_the_gateways_own_address_is_recognised(url: str, listen: str, own: bool) -> None:
    assert is_own_address(url, listen, 8001) is own
