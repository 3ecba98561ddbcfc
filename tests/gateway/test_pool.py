"""The worker pool and its fan-out: what a worker's failure is, what a bug is, and
what is left of a worker that departed (nothing but a closed channel on lookup).

`fan_out` keeps each worker's failure (an `RsgwError`) as that worker's result, and
lets anything else, a bug, reach the caller as itself: the server then answers
INTERNAL naming it, instead of the bug passing for an unavailable worker. The
gateway tests run a memory fleet of real simulated workers with the autojump clock;
the bug is the one scripted part (a real worker cannot make the gateway raise).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from trio.testing import MockClock

from rsgw.base._body import Body
from rsgw.base._errors import GrpcError, WorkerUnavailable
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.gateway.fleet import _pool
from rsgw.gateway.fleet._pool import WorkerPool, fan_out
from rsgw.grpc._client import Channel
from rsgw.scheduling.fleet._membership import Member
from tests.gateway.fleet import open_fleet
from tests.gateway.test_failover import PROBING
from tests.memory import MemoryNetwork


async def test_each_workers_failure_is_its_own_result() -> None:
    async def call(url: str) -> str:
        await trio.lowlevel.checkpoint()
        if url == "b":
            raise WorkerUnavailable("b is down")
        return url.upper()

    results = await fan_out(["a", "b", "c"], call)
    assert results["a"] == "A" and results["c"] == "C"
    assert isinstance(results["b"], WorkerUnavailable)


async def test_a_bug_in_a_fan_out_is_raised_as_itself() -> None:
    """Not an ExceptionGroup: the server's boundary names what it answers INTERNAL for."""

    async def call(url: str) -> str:
        await trio.lowlevel.checkpoint()
        if url == "b":
            raise KeyError("a bug")
        return url

    with pytest.raises(KeyError, match="a bug"):
        await fan_out(["a", "b", "c"], call)


async def test_a_bug_reaches_the_client_as_internal(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ServerMetadata asks every ready worker; the gateway's call to one of them
    hits a bug. The client reads INTERNAL with the bug's type, not an answer built
    from the other worker alone as if the first were merely down."""
    async with open_fleet(2, memory=True, **PROBING) as fleet:
        channel = fleet.gateway._service.pool.channels[fleet.worker_url(1)]
        unary = channel.unary

        async def buggy(path: bytes, request: bytes, **options: Any) -> Body:
            if path == Method.SERVER_METADATA.wire:
                raise RuntimeError("a bug in the gateway")
            reply: Body = await unary(path, request, **options)
            return reply

        monkeypatch.setattr(channel, "unary", buggy)
        client: Channel = fleet.channel()
        with pytest.raises(GrpcError) as failed:
            await client.unary(Method.SERVER_METADATA.wire, b"")
        assert failed.value.code is StatusCode.INTERNAL
        assert failed.value.message == (
            "internal error (RuntimeError); the log has its traceback"
        )  # the bug's own text stays in the log


async def test_a_url_looked_up_after_its_worker_left_fails_over() -> None:
    """A call that took a URL before its worker left, and looks it up only after the
    channel closed, gets a closed channel (WorkerUnavailable: it fails over), not a
    KeyError; and the pool holds nothing of the worker."""
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        pool = WorkerPool(lambda url: Channel(url, nursery, network=network))
        member = Member("127.0.0.1:1", "operator", 0)
        pool.add(member)
        pool.retire(member.url)
        await pool.close(member)
        assert len(pool.channels) == 0
        with pytest.raises(WorkerUnavailable, match="is closed"):
            await pool.channels[member.url].unary(Method.SERVER_READY.wire, b"")
        assert len(pool.channels) == 0
        assert network.connects == {}
        assert pool.public_name(member.url) == "worker0"


async def test_only_the_newest_departures_are_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the pool keeps of departed workers (their names) is bounded too."""
    monkeypatch.setattr(_pool, "REMEMBERED_DEPARTURES", 2)
    async with trio.open_nursery() as nursery:
        pool = WorkerPool(lambda url: Channel(url, nursery, network=MemoryNetwork()))
        members = [Member(f"127.0.0.1:{port}", "operator", port) for port in range(1, 6)]
        for member in members:
            pool.add(member)
            pool.retire(member.url)
            await pool.close(member)
        assert [pool.public_name(m.url) for m in members] == [
            *["a removed worker"] * 3,
            "worker4",
            "worker5",
        ]
        assert pool.label(members[0].url) == members[0].url  # the logs' fallback
