"""`dns:///NAME:PORT` endpoints: the gateway follows what a name resolves to (issue 24).

Memory fleets with the autojump clock: the workers listen on 10.0.0.N:8001 of the
memory network, and trio's resolver is replaced at the socket layer
(`trio.socket.set_custom_hostname_resolver`) by a stub the test edits, as a
Kubernetes headless Service's answer changes when pods come and go. One test edits
/etc/hosts in a mount namespace of its own (a copy bind-mounted over it; the
machine's file is never touched), with real workers on 127.0.0.2 and 127.0.0.3.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import pytest
import trio
from trio.testing import MockClock

from rsgw.config._config import GatewayConfig, ListenConfig
from rsgw.gateway._running import RunningGateway
from rsgw.runtime._net import TCP, Network
from rsgw.scheduling.fleet._capabilities import CapabilityTable
from rsgw.worker._worker import RunningWorker, WorkerConfig
from rsgw.worker.models._catalogue import builtin_catalogue
from tests.gateway.fleet import Fleet, start_gateway, start_worker
from tests.gateway.test_failover import check_simple, served
from tests.gateway.test_membership import load
from tests.helpers import wait_until_async
from tests.memory import MemoryNetwork

REPO = Path(__file__).resolve().parent.parent.parent

NAME = "rsgw-workers.test.svc"
PORT = 8001


class StubResolver(trio.abc.HostnameResolver):
    """Answers for `NAME` from `answers`; any other name is unknown."""

    def __init__(self, *ips: str) -> None:
        self.answers = list(ips)
        self.failing = False
        self.lookups = 0

    async def getaddrinfo(  # type: ignore[override]  # an IPv4-only answer
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[
        tuple[
            Literal[socket.AddressFamily.AF_INET],
            socket.SocketKind,
            int,
            str,
            tuple[str, int],
        ]
    ]:
        self.lookups += 1
        await trio.lowlevel.checkpoint()
        name = host.decode() if isinstance(host, bytes) else host
        if self.failing:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if name != NAME:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, PORT))
            for ip in self.answers
        ]

    async def getnameinfo(
        self, sockaddr: tuple[str, int] | tuple[str, int, int, int], flags: int
    ) -> tuple[str, str]:
        raise NotImplementedError


@contextlib.contextmanager
def resolving(resolver: StubResolver) -> Iterator[None]:
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    try:
        yield
    finally:
        trio.socket.set_custom_hostname_resolver(previous)


async def start_dns_fleet(
    nursery: trio.Nursery, network: Network, hosts: list[str], name: str, port: int, interval: float
) -> Fleet:
    """Workers on each of `hosts` at `port`, and a gateway following dns:///`name`:`port`."""
    workers: list[RunningWorker] = []
    for i, host in enumerate(hosts):
        config = WorkerConfig(
            name=f"pod{i}",
            gpu=str(i),
            host=host,
            port=port,
            metrics_port=-1,
            catalogue=builtin_catalogue(),
        )
        workers.append(await nursery.start(start_worker, config, network))
    gateway_config = GatewayConfig(
        endpoints=(f"dns:///{name}:{port}",),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
        health_interval_seconds=interval,
    )
    gateway: RunningGateway = await nursery.start(start_gateway, gateway_config, network)
    return Fleet(workers, gateway, nursery, network)


@asynccontextmanager
async def dns_fleet(resolver: StubResolver, hosts: int = 3) -> AsyncIterator[Fleet]:
    """Workers on 10.0.0.1..`hosts`:8001 and a gateway following dns:///NAME:8001."""
    with resolving(resolver):
        async with trio.open_nursery() as nursery:
            ips = [f"10.0.0.{i + 1}" for i in range(hosts)]
            fleet = await start_dns_fleet(nursery, MemoryNetwork(), ips, NAME, PORT, 0.5)
            try:
                yield fleet
            finally:
                nursery.cancel_scope.cancel()


def pod(i: int) -> str:
    return f"10.0.0.{i + 1}:{PORT}"


async def test_the_gateway_follows_the_pods_a_name_resolves_to(autojump_clock: MockClock) -> None:
    resolver = StubResolver("10.0.0.2", "10.0.0.1")
    async with dns_fleet(resolver) as fleet:
        gateway = fleet.gateway
        # Sorted, so the answer's order decides no ordinal.
        assert gateway.statistics().workers == (pod(0), pod(1))
        await check_simple(fleet, 1)

        async def scale() -> None:
            resolver.answers = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]  # a pod comes
            await wait_until_async(lambda: pod(2) in gateway.statistics().ready, what="pod 2")
            resolver.answers = ["10.0.0.2", "10.0.0.3"]  # a pod goes

        assert await load(fleet, 600, scale) == []
        await wait_until_async(lambda: pod(0) not in gateway.statistics().workers, what="gone")
        assert gateway.statistics().workers == (pod(1), pod(2))
        before = served(fleet.workers[0]), served(fleet.workers[2])
        assert await load(fleet, 80, trio.lowlevel.checkpoint) == []
        assert served(fleet.workers[0]) == before[0], "a pod DNS no longer names gets nothing"
        assert served(fleet.workers[2]) > before[1], "the new pod takes its share"
        status = gateway._members.status(gateway.statistics().ready, CapabilityTable())
        assert [(m.address, m.public_name, m.source) for m in status] == [
            (pod(1), "worker1", f"dns:{NAME}:{PORT}"),
            (pod(2), "worker2", f"dns:{NAME}:{PORT}"),
        ]


async def test_a_failing_lookup_keeps_the_workers(autojump_clock: MockClock) -> None:
    resolver = StubResolver("10.0.0.1", "10.0.0.2")
    async with dns_fleet(resolver, hosts=2) as fleet:
        gateway = fleet.gateway
        for answer in ("fail", "empty"):
            resolver.failing = answer == "fail"
            resolver.answers = [] if answer == "empty" else resolver.answers
            wanted = resolver.lookups + 3
            await wait_until_async(lambda: resolver.lookups >= wanted, what="lookups")  # noqa: B023
            assert gateway.statistics().workers == (pod(0), pod(1)), answer
            await check_simple(fleet, 2)
        resolver.failing, resolver.answers = False, ["10.0.0.2"]
        await wait_until_async(lambda: gateway.statistics().workers == (pod(1),), what="back")


async def test_start_up_waits_for_the_name_to_resolve(autojump_clock: MockClock) -> None:
    resolver = StubResolver()
    resolver.failing = True
    started: list[RunningGateway] = []

    async def open_it() -> None:
        async with dns_fleet(resolver, hosts=1) as fleet:
            started.append(fleet.gateway)
            await check_simple(fleet, 3)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(open_it)
        await wait_until_async(lambda: resolver.lookups >= 3, what="lookups")
        assert not started, "nothing to serve with: the gateway is still starting"
        resolver.failing, resolver.answers = False, ["10.0.0.1"]
    assert started and started[0].statistics().workers == (pod(0),)


HOSTS = "/etc/hosts"


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs unshare and root, for a private mount namespace",
)
def test_an_etc_hosts_edit_is_followed(tmp_path: Path) -> None:
    """The system resolver follows an /etc/hosts edit: run in a child process in a
    mount namespace of its own, where /etc/hosts is a copy bind-mounted over it, so
    the machine's own file is never touched."""
    private = tmp_path / "hosts"
    private.write_text(read_hosts())
    code = (
        "import trio; from tests.gateway.test_discovery import follow_hosts_edit; "
        "trio.run(follow_hosts_edit)"
    )
    script = f'mount --bind "{private}" {HOSTS} && exec "{sys.executable}" -c "{code}"'
    run = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]


async def follow_hosts_edit() -> None:
    """Real workers on 127.0.0.2 and 127.0.0.3 (one port), the system resolver, and a
    name in /etc/hosts (the namespace's own copy) that moves from one to the other."""
    name = f"rsgw-discovery-{os.getpid()}.invalid"
    original = read_hosts()

    def point(ip: str) -> None:
        write_hosts(original.rstrip("\n") + f"\n{ip} {name}\n")

    probe = trio.socket.socket()
    await probe.bind(("127.0.0.2", 0))
    port = probe.getsockname()[1]
    probe.close()
    point("127.0.0.2")
    async with trio.open_nursery() as nursery:
        hosts = ["127.0.0.2", "127.0.0.3"]
        fleet = await start_dns_fleet(nursery, TCP, hosts, name, port, 0.2)
        gateway, workers = fleet.gateway, fleet.workers
        assert gateway.statistics().workers == (f"127.0.0.2:{port}",)
        await check_simple(fleet, 4)
        point("127.0.0.3")
        await wait_until_async(
            lambda: gateway.statistics().workers == (f"127.0.0.3:{port}",),
            seconds=20,
            what="the name moved",
        )
        await wait_until_async(lambda: bool(gateway.statistics().ready), what="ready")
        before = served(workers[1])
        await check_simple(fleet, 5)
        assert served(workers[1]) == before + 1
        nursery.cancel_scope.cancel()


def read_hosts() -> str:
    with open(HOSTS, encoding="utf-8") as f:
        return f.read()


def write_hosts(text: str) -> None:
    """Rewrite the (bind-mounted) file in place: the mount follows the inode."""
    with open(HOSTS, "r+", encoding="utf-8") as f:
        f.write(text)
        f.truncate()


async def test_an_answer_of_too_many_addresses_changes_nothing(autojump_clock: MockClock) -> None:
    resolver = StubResolver("10.0.0.1")
    async with dns_fleet(resolver, hosts=1) as fleet:
        resolver.answers = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(2000)]
        wanted = resolver.lookups + 3
        await wait_until_async(lambda: resolver.lookups >= wanted, what="lookups")
        assert fleet.gateway.statistics().workers == (pod(0),)
        await check_simple(fleet, 6)
