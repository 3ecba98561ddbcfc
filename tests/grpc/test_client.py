"""The client channel against rsgw's own server, over memory streams with the autojump clock.

The channel against a grpcio server, over a real socket, is in test_interop.py.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from rsgw.base._call import CallContext, UnaryHandler
from rsgw.base._errors import GrpcError, WorkerUnavailable
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer
from tests.memory import MemoryNetwork


class Peer:
    """Server-side handlers that report what they saw."""

    def __init__(self) -> None:
        self.started = trio.Event()
        self.cancelled = trio.Event()
        self.gate = trio.Event()
        self.in_flight = 0
        self.max_in_flight = 0
        self.deadlines: list[float] = []

    async def echo(self, request: bytes, call: CallContext) -> bytes:
        self.deadlines.append(call.deadline - trio.current_time())
        return request

    async def hang(self, request: bytes, call: CallContext) -> bytes:
        self.started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled.set()
            raise
        return b""  # pragma: no cover

    async def gated(self, request: bytes, call: CallContext) -> bytes:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.started.set()
        await self.gate.wait()
        self.in_flight -= 1
        return request

    async def refuse(self, request: bytes, call: CallContext) -> bytes:
        raise GrpcError(StatusCode.NOT_FOUND, "no model 'x' here", ((b"x-worker", b"w0"),))

    def routes(self) -> dict[str, UnaryHandler]:
        return {
            "/t.T/Echo": self.echo,
            "/t.T/Hang": self.hang,
            "/t.T/Gated": self.gated,
            "/t.T/Refuse": self.refuse,
        }


@dataclass
class Served:
    peer: Peer
    server: GrpcServer
    network: MemoryNetwork
    target: str
    nursery: trio.Nursery
    scope: trio.CancelScope

    def channel(self, **limits: Any) -> Channel:
        return Channel(self.target, self.nursery, network=self.network, **limits)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    peer = Peer()
    server = GrpcServer(peer.routes())
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[int]) -> None:
            with scope:
                await server.serve("w", 0, network=network, task_status=task_status)

        port = await nursery.start(run)
        yield Served(peer, server, network, f"w:{port}", nursery, scope)
        nursery.cancel_scope.cancel()


async def test_round_trip_and_reuse(served: Served, autojump_clock: MockClock) -> None:
    channel = served.channel()
    for i in range(20):
        assert await channel.unary(b"/t.T/Echo", b"ping %d" % i) == b"ping %d" % i
    assert channel.connects == 1


async def test_peer_status_and_trailers_pass_through(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel()
    with pytest.raises(GrpcError) as caught:
        await channel.unary(b"/t.T/Refuse", b"")
    assert caught.value.code is StatusCode.NOT_FOUND
    assert caught.value.message == "no model 'x' here"
    assert caught.value.trailers == ((b"x-worker", b"w0"),)
    with pytest.raises(GrpcError) as caught:
        await channel.unary(b"/t.T/Missing", b"")
    assert caught.value.code is StatusCode.UNIMPLEMENTED


async def test_deadline_is_forwarded_and_enforced(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel()
    await channel.unary(b"/t.T/Echo", b"", deadline=trio.current_time() + 0.3)
    assert 0 < served.peer.deadlines[-1] <= 0.3
    await channel.unary(b"/t.T/Echo", b"")
    assert served.peer.deadlines[-1] == math.inf
    with pytest.raises(GrpcError) as caught:
        await channel.unary(b"/t.T/Hang", b"", deadline=trio.current_time() + 0.2)
    assert caught.value.code is StatusCode.DEADLINE_EXCEEDED
    with trio.fail_after(1):
        await served.peer.cancelled.wait()  # the reset reached the handler


async def test_refused_connection_is_unavailable(autojump_clock: MockClock) -> None:
    async with trio.open_nursery() as nursery:
        channel = Channel("nobody:1", nursery, network=MemoryNetwork())
        with pytest.raises(
            WorkerUnavailable, match="cannot connect to nobody:1: Connection refused"
        ):
            await channel.unary(b"/t.T/Echo", b"")


async def test_dead_peer_fails_pending_calls_at_once(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel()
    errors: list[Exception] = []

    async def pending() -> None:
        try:
            await channel.unary(b"/t.T/Hang", b"")
        except WorkerUnavailable as exc:
            errors.append(exc)

    started = trio.current_time()
    async with trio.open_nursery() as calls:
        for _ in range(3):
            calls.start_soon(pending)
        await served.peer.started.wait()
        await trio.testing.wait_all_tasks_blocked()
        served.scope.cancel()  # the peer dies with three calls in flight
    assert trio.current_time() == started  # no timeout involved: EOF fails the calls
    assert len(errors) == 3
    assert all(type(e) is WorkerUnavailable for e in errors)  # none had a response yet
    assert not channel.connected


async def test_reset_fails_pending_and_reconnects(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel()
    failures: list[Exception] = []

    async def pending() -> None:
        try:
            await channel.unary(b"/t.T/Hang", b"")
        except WorkerUnavailable as exc:
            failures.append(exc)

    async with trio.open_nursery() as calls:
        calls.start_soon(pending)
        await served.peer.started.wait()
        channel.reset("reset by the watchdog")
    assert "reset by the watchdog" in str(failures[0])
    assert await channel.unary(b"/t.T/Echo", b"x") == b"x"
    assert channel.connects == 2


async def test_a_hung_peer_costs_the_deadline_and_nothing_else(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel()
    assert await channel.unary(b"/t.T/Echo", b"warm") == b"warm"
    served.network.freeze(served.target)
    started = trio.current_time()
    with pytest.raises(GrpcError) as caught:
        await channel.unary(b"/t.T/Echo", b"", deadline=started + 5)
    assert caught.value.code is StatusCode.DEADLINE_EXCEEDED
    assert trio.current_time() - started == pytest.approx(5)
    served.network.thaw(served.target)
    assert await channel.unary(b"/t.T/Echo", b"again") == b"again"
    assert channel.connects == 1  # a call's own deadline never resets the connection


async def test_a_server_going_away_refuses_new_calls_and_finishes_old_ones(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel()
    result: list[bytes] = []

    async def gated() -> None:
        result.append(await channel.unary(b"/t.T/Gated", b"last"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(gated)
        await served.peer.started.wait()
        nursery.start_soon(served.server.aclose)
        await trio.testing.wait_all_tasks_blocked()
        # Refused, so certainly not run: the gateway may send it to another replica.
        with pytest.raises(WorkerUnavailable, match="refused the stream"):
            await channel.unary(b"/t.T/Echo", b"new")
        served.peer.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert not channel.connected  # GOAWAY followed the last answer
    assert result == [b"last"]


async def test_stream_cap_queues_extra_calls(served: Served, autojump_clock: MockClock) -> None:
    channel = served.channel(max_concurrent_streams=2)
    async with trio.open_nursery() as calls:
        for _ in range(5):
            calls.start_soon(channel.unary, b"/t.T/Gated", b"")
        await served.peer.started.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert served.peer.in_flight == 2
        served.peer.gate.set()
    assert served.peer.max_in_flight == 2


async def test_uncapped_calls_do_not_queue_behind_a_full_cap(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel(max_concurrent_streams=2)
    async with trio.open_nursery() as calls:
        for _ in range(3):
            calls.start_soon(channel.unary, b"/t.T/Gated", b"")
        await served.peer.started.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert served.peer.in_flight == 2  # the cap is full, one call waits
        assert await channel.unary(b"/t.T/Echo", b"ping", uncapped=True) == b"ping"
        served.peer.gate.set()


async def test_send_limit() -> None:
    async with trio.open_nursery() as nursery:
        channel = Channel("nobody:1", nursery, network=MemoryNetwork(), max_send_message_bytes=10)
        with pytest.raises(GrpcError) as caught:
            await channel.unary(b"/t.T/Echo", b"x" * 11)
    assert caught.value.code is StatusCode.RESOURCE_EXHAUSTED


async def test_calls_past_the_peers_stream_limit_wait_for_a_stream(
    autojump_clock: MockClock,
) -> None:
    """The server allows 2 streams; 6 calls at once all succeed, 2 at a time."""
    running = 0
    most = 0

    async def slow(request: bytes, call: CallContext) -> bytes:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await trio.sleep(1)
        running -= 1
        return request

    network = MemoryNetwork()
    server = GrpcServer({"/t.Test/Slow": slow}, max_concurrent_streams=2)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("s", 0, network=network, **kw))
        channel = Channel(f"s:{port}", nursery, network=network, max_concurrent_streams=10)
        replies: list[bytes] = []

        async def one(i: int) -> None:
            replies.append(await channel.unary(b"/t.Test/Slow", bytes([i])))

        async with trio.open_nursery() as calls:
            for i in range(6):
                calls.start_soon(one, i)
        assert sorted(replies) == [bytes([i]) for i in range(6)]
        assert most == 2
        nursery.cancel_scope.cancel()
