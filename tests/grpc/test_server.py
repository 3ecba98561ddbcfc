"""The gRPC server shell, driven by rsgw's own channel over memory streams.

Both ends run in the test's Trio run on `tests.memory.MemoryNetwork` with the
autojump clock, so deadlines of seconds cost no wall time and every wait is on
an event. (pytest-trio takes the clock only from a test's own arguments, so every
test names `autojump_clock`.) `tests/grpc/test_interop.py` runs a smaller set against grpcio over
real sockets.
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

from rsgw.base._call import CallContext
from rsgw.base._errors import GrpcError, ListenError, NotFound, WorkerUnavailable
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer
from tests.helpers import wait_until_async
from tests.memory import MemoryNetwork

LIMIT = 1024 * 1024
BIG = 80 * 1024 * 1024


class Handlers:
    """Handlers that tell the test what happened to them."""

    def __init__(self) -> None:
        self.slow_started = trio.Event()
        self.slow_cancelled = trio.Event()
        self.gate = trio.Event()
        self.gated_started = trio.Event()
        self.metadata: list[tuple[tuple[bytes, bytes], ...]] = []
        #: The tasks Echo ran on.
        self.tasks: set[trio.lowlevel.Task] = set()

    async def echo(self, request: bytes, call: CallContext) -> bytes:
        self.metadata.append(call.metadata)
        self.tasks.add(trio.lowlevel.current_task())
        return request

    async def slow(self, request: bytes, call: CallContext) -> bytes:
        self.slow_started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.slow_cancelled.set()
            raise
        return b""  # pragma: no cover

    async def gated(self, request: bytes, call: CallContext) -> bytes:
        self.gated_started.set()
        await self.gate.wait()
        return b"opened"

    async def boom(self, request: bytes, call: CallContext) -> bytes:
        raise RuntimeError("kaboom")

    async def refuse(self, request: bytes, call: CallContext) -> bytes:
        raise GrpcError(StatusCode.FAILED_PRECONDITION, "not now", ((b"x-why", b"because"),))

    async def missing(self, request: bytes, call: CallContext) -> bytes:
        raise NotFound("no such thing: " + request.decode())

    async def deadline(self, request: bytes, call: CallContext) -> bytes:
        return repr(call.deadline - trio.current_time()).encode()

    async def huge(self, request: bytes, call: CallContext) -> bytes:
        return b"z" * (LIMIT + 1)


@dataclass
class Served:
    handlers: Handlers
    server: GrpcServer
    network: MemoryNetwork
    target: str
    nursery: trio.Nursery

    def channel(self, **limits: Any) -> Channel:
        return Channel(self.target, self.nursery, network=self.network, **limits)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    handlers = Handlers()
    routes = {
        f"/t.Test/{name}": getattr(handlers, name.lower())
        for name in ("Echo", "Slow", "Gated", "Boom", "Refuse", "Missing", "Deadline", "Huge")
    }
    server = GrpcServer(routes, max_receive_message_bytes=LIMIT, max_send_message_bytes=LIMIT)
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("gw", 0, network=network, **kw))
        yield Served(handlers, server, network, f"gw:{port}", nursery)
        nursery.cancel_scope.cancel()


async def call(
    served: Served, method: str, body: bytes = b"", *, deadline: float = math.inf
) -> bytes:
    return await served.channel(max_send_message_bytes=BIG, max_receive_message_bytes=BIG).unary(
        f"/t.Test/{method}".encode(), body, deadline=deadline
    )


async def failure(served: Served, method: str, body: bytes = b"") -> GrpcError:
    with pytest.raises(GrpcError) as caught:
        await call(served, method, body)
    return caught.value


async def test_echo_and_metadata(served: Served, autojump_clock: MockClock) -> None:
    assert await call(served, "Echo", b"hello") == b"hello"
    assert await call(served, "Echo", b"") == b""
    channel = served.channel()
    await channel.unary(b"/t.Test/Echo", b"x", metadata=((b"x-tenant", b"a"),))
    assert served.handlers.metadata[-1] == ((b"x-tenant", b"a"),)


async def test_unknown_method_is_unimplemented(served: Served, autojump_clock: MockClock) -> None:
    error = await failure(served, "Nope", b"x")
    assert error.code is StatusCode.UNIMPLEMENTED
    assert "/t.Test/Nope" in error.message


async def test_oversized_message_fails_only_its_call(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel(max_send_message_bytes=BIG)
    results: dict[str, object] = {}

    async def gated() -> None:
        results["gated"] = await channel.unary(b"/t.Test/Gated", b"")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(gated)
        await served.handlers.gated_started.wait()
        with pytest.raises(GrpcError) as caught:  # the same connection as the gated call
            await channel.unary(b"/t.Test/Echo", b"x" * (LIMIT + 1))
        served.handlers.gate.set()
    assert caught.value.code is StatusCode.RESOURCE_EXHAUSTED
    assert f"{LIMIT + 1} vs. {LIMIT}" in caught.value.message
    assert results["gated"] == b"opened"
    assert channel.connects == 1
    assert await channel.unary(b"/t.Test/Echo", b"after") == b"after"


async def test_a_message_at_the_limit_passes_and_an_oversized_answer_fails(
    served: Served, autojump_clock: MockClock
) -> None:
    assert len(await call(served, "Echo", b"y" * LIMIT)) == LIMIT
    error = await failure(served, "Huge")
    assert error.code is StatusCode.RESOURCE_EXHAUSTED


async def test_64_mib_round_trip(autojump_clock: MockClock) -> None:
    handlers = Handlers()
    server = GrpcServer(
        {"/t.Test/Echo": handlers.echo},
        max_receive_message_bytes=BIG,
        max_send_message_bytes=BIG,
    )
    network = MemoryNetwork()
    payload = bytes(range(256)) * (64 * 1024 * 1024 // 256)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("big", 0, network=network, **kw))
        channel = Channel(
            f"big:{port}",
            nursery,
            network=network,
            max_receive_message_bytes=BIG,
            max_send_message_bytes=BIG,
        )
        assert await channel.unary(b"/t.Test/Echo", payload) == payload
        nursery.cancel_scope.cancel()


async def test_client_cancel_cancels_the_handler(served: Served, autojump_clock: MockClock) -> None:
    channel = served.channel()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.unary, b"/t.Test/Slow", b"")
        await served.handlers.slow_started.wait()
        nursery.cancel_scope.cancel()  # the channel sends RST_STREAM
    with trio.fail_after(1):
        await served.handlers.slow_cancelled.wait()
    assert await channel.unary(b"/t.Test/Echo", b"alive") == b"alive"


async def test_client_deadline_cancels_the_handler(
    served: Served, autojump_clock: MockClock
) -> None:
    with pytest.raises(GrpcError) as caught:
        await call(served, "Slow", deadline=trio.current_time() + 0.3)
    assert caught.value.code is StatusCode.DEADLINE_EXCEEDED
    with trio.fail_after(1):
        await served.handlers.slow_cancelled.wait()


async def test_deadline_reaches_the_handler(served: Served, autojump_clock: MockClock) -> None:
    remaining = float(await call(served, "Deadline", deadline=trio.current_time() + 30))
    assert 29 < remaining <= 30
    assert await call(served, "Deadline") == b"inf"


async def test_handler_exception_is_internal(served: Served, autojump_clock: MockClock) -> None:
    error = await failure(served, "Boom")
    assert error.code is StatusCode.INTERNAL
    assert (
        "kaboom" not in error.message and "RuntimeError" in error.message
    )  # text stays in the log


async def test_grpc_error_and_rsgw_error_keep_their_status(
    served: Served, autojump_clock: MockClock
) -> None:
    error = await failure(served, "Refuse")
    assert (error.code, error.message) == (StatusCode.FAILED_PRECONDITION, "not now")
    assert (b"x-why", b"because") in error.trailers
    error = await failure(served, "Missing", b"thing")
    assert (error.code, error.message) == (StatusCode.NOT_FOUND, "no such thing: thing")


async def test_many_concurrent_calls_on_one_connection(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel(max_concurrent_streams=1000)
    replies: dict[int, bytes] = {}

    async def one(i: int) -> None:
        replies[i] = await channel.unary(b"/t.Test/Echo", str(i).encode() * 100)

    async with trio.open_nursery() as nursery:
        for i in range(200):
            nursery.start_soon(one, i)
    assert replies == {i: str(i).encode() * 100 for i in range(200)}
    assert channel.connects == 1


async def test_handler_tasks_are_kept_between_calls(
    served: Served, autojump_clock: MockClock
) -> None:
    """Rounds of 8 concurrent calls on one connection run on a handful of tasks, not
    a task each; a call that fails or is cancelled leaves its task usable."""
    channel = served.channel()
    for _ in range(10):
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(channel.unary, b"/t.Test/Echo", b"%d" % i)
        with pytest.raises(GrpcError):
            await channel.unary(b"/t.Test/Boom", b"")
        with trio.move_on_after(1):
            await channel.unary(b"/t.Test/Slow", b"")
    assert len(served.handlers.tasks) <= 10  # 80 calls
    assert await channel.unary(b"/t.Test/Echo", b"still") == b"still"


async def test_graceful_close_lets_calls_finish_and_refuses_new_ones(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel()
    result: list[bytes] = []

    async def client() -> None:
        result.append(await channel.unary(b"/t.Test/Gated", b""))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        await served.handlers.gated_started.wait()
        nursery.start_soon(served.server.aclose, 10)
        await trio.testing.wait_all_tasks_blocked()
        # Going away: the connection takes no new call, and a new one is refused.
        with pytest.raises(WorkerUnavailable):
            await channel.unary(b"/t.Test/Echo", b"late")
        served.handlers.gate.set()
    assert result == [b"opened"]


async def test_graceful_close_gives_up_after_its_grace(
    served: Served, autojump_clock: MockClock
) -> None:
    """A call still running when the grace is up ends UNAVAILABLE, saying why."""
    channel = served.channel()
    failures: list[GrpcError] = []

    async def slow() -> None:
        try:
            await channel.unary(b"/t.Test/Slow", b"")
        except GrpcError as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow)
        await served.handlers.slow_started.wait()
        started = trio.current_time()
        assert await served.server.aclose(grace=2) == 1
        assert 2 <= trio.current_time() - started < 2 + 1.5  # grace, then at most the linger
    [failure] = failures
    assert failure.code is StatusCode.UNAVAILABLE
    assert failure.message == ("server shutting down: the call did not finish within the 2 s drain")


async def test_a_second_listener_on_a_busy_address_is_a_listen_error(
    served: Served, autojump_clock: MockClock
) -> None:
    port = int(served.target.rpartition(":")[2])
    with pytest.raises(ListenError, match="address already in use"):
        await GrpcServer({}).serve("gw", port, network=served.network)


async def test_a_cancel_too_late_for_its_call_harms_no_other(autojump_clock: MockClock) -> None:
    """Calls on a connection share a cancel scope while none is cut short. One cancelled
    after its handler's last checkpoint (here: by itself) is answered as it finished,
    and the calls after it, on the same task, are not cancelled."""
    handlers = Handlers()

    async def late(request: bytes, call: CallContext) -> bytes:
        assert call.scope is not None
        call.scope.cancel()  # as a reset or a deadline arriving just as it returns
        return b"finished"

    server = GrpcServer({"/t.Test/Late": late, "/t.Test/Echo": handlers.echo})
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("gw", 0, network=network, **kw))
        channel = Channel(f"gw:{port}", nursery, network=network)
        assert await channel.unary(b"/t.Test/Late", b"") == b"finished"
        for i in range(5):
            assert await channel.unary(b"/t.Test/Echo", b"%d" % i) == b"%d" % i
        assert len(handlers.tasks) == 1
        nursery.cancel_scope.cancel()


async def test_a_method_time_limit_cuts_calls_and_never_the_next(autojump_clock: MockClock) -> None:
    """`time_limits`: a call to a method with a time limit ends at it when its client set
    no sooner deadline. The scope keeps that deadline between calls, so: a call to a
    method without a limit, on the same task, runs past it; a task idle past it
    serves the next call; and a client's sooner deadline still wins."""
    handlers = Handlers()
    server = GrpcServer(
        {
            "/t.Test/Slow": handlers.slow,
            "/t.Test/Gated": handlers.gated,
            "/t.Test/Deadline": handlers.deadline,
        },
        time_limits={"/t.Test/Slow": 2.0, "/t.Test/Deadline": 2.0},
    )
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("gw", 0, network=network, **kw))
        channel = Channel(f"gw:{port}", nursery, network=network)
        started = trio.current_time()
        with pytest.raises(GrpcError) as caught:
            await channel.unary(b"/t.Test/Slow", b"")
        assert caught.value.code is StatusCode.DEADLINE_EXCEEDED
        assert 2.0 <= trio.current_time() - started < 2.1
        # This call leaves its task's scope holding a deadline 2 s out.
        assert float(await channel.unary(b"/t.Test/Deadline", b"")) == 2.0
        async with trio.open_nursery() as calls:
            calls.start_soon(channel.unary, b"/t.Test/Gated", b"")
            await handlers.gated_started.wait()
            await trio.sleep(5)  # past that deadline: the gated call runs on
            handlers.gate.set()
        await trio.sleep(10)  # idle tasks outlive the deadlines they kept
        assert float(await channel.unary(b"/t.Test/Deadline", b"")) == 2.0
        sooner = trio.current_time() + 0.5
        assert float(await channel.unary(b"/t.Test/Deadline", b"", deadline=sooner)) <= 0.5
        nursery.cancel_scope.cancel()


class _CancelOnHandover(trio.abc.Instrument):
    """Cancels `scope` the moment `task` is next scheduled: a kept deadline passing
    just after a call was handed to the task, before the task ran."""

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None
        self.scope: trio.CancelScope | None = None
        self.fired = False

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        if task is self.task and self.scope is not None and not self.fired:
            self.fired = True
            self.scope.cancel()


async def test_a_scope_cancelled_as_a_call_is_handed_over_spares_that_call(
    autojump_clock: MockClock,
) -> None:
    """The scope a task keeps between calls may be cancelled after a call was handed
    to the task and before it ran (its kept deadline passing then); that call runs in
    a fresh scope, not cut short."""
    spy = _CancelOnHandover()

    async def first(request: bytes, call: CallContext) -> bytes:
        spy.task, spy.scope = trio.lowlevel.current_task(), call.scope
        return b"first"

    async def second(request: bytes, call: CallContext) -> bytes:
        await trio.lowlevel.checkpoint()  # where a cancelled scope would strike
        return b"second"

    server = GrpcServer({"/t.Test/First": first, "/t.Test/Second": second})
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("gw", 0, network=network, **kw))
        channel = Channel(f"gw:{port}", nursery, network=network)
        assert await channel.unary(b"/t.Test/First", b"") == b"first"
        trio.lowlevel.add_instrument(spy)
        try:
            assert await channel.unary(b"/t.Test/Second", b"") == b"second"
        finally:
            trio.lowlevel.remove_instrument(spy)
        assert spy.fired  # the call was handed to the same task, and its scope cancelled
        nursery.cancel_scope.cancel()


async def test_a_cancelled_server_refuses_new_connections_while_old_ones_finish(
    autojump_clock: MockClock,
) -> None:
    """A server cancelled (an embedded one stopped, a worker killed in a test) closes its
    listener at once: a client connecting while a handler still finishes is refused,
    not left unserved in the backlog until its connect timeout."""
    started = trio.Event()

    async def stubborn(request: bytes, call: CallContext) -> bytes:
        started.set()
        with trio.CancelScope(shield=True):  # takes a while to stop
            await trio.sleep(0.5)
        return request

    server = GrpcServer({"/t.Test/Stubborn": stubborn})
    network = MemoryNetwork()
    seen: list[tuple[str, float]] = []

    async def call(channel: Channel) -> None:
        with pytest.raises(WorkerUnavailable):  # the server went away under it
            await channel.unary(b"/t.Test/Stubborn", b"")

    async def call_and_connect(target: str) -> None:
        outer.start_soon(call, Channel(target, outer, network=network))
        await started.wait()
        cancelled_at = trio.current_time()
        serving.cancel_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        try:
            await network.connect(target)
            seen.append(("accepted", trio.current_time() - cancelled_at))
        except ConnectionRefusedError:
            seen.append(("refused", trio.current_time() - cancelled_at))

    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as serving:
            port = await serving.start(lambda **kw: server.serve("gw", 0, network=network, **kw))
            outer.start_soon(call_and_connect, f"gw:{port}")
        outer.cancel_scope.cancel()
    assert seen == [("refused", 0.0)]


async def test_a_client_that_hangs_up_cancels_its_calls(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel()
    failures: list[Exception] = []

    async def pending() -> None:
        try:
            await channel.unary(b"/t.Test/Slow", b"")
        except WorkerUnavailable as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pending)
        await served.handlers.slow_started.wait()
        channel.reset("hung up by the test")  # the stream closes under the call
        with trio.fail_after(1):
            await served.handlers.slow_cancelled.wait()
    assert [str(f) for f in failures] == [f"connection to {served.target} hung up by the test"]


async def test_a_saturated_server_holds_busy_connections_to_their_share(
    autojump_clock: MockClock,
) -> None:
    """At its running-call cap (4) the server tells each busy connection (2) it may have
    2 calls open; once it has been quiet for a while, the full limit (100) comes back.
    Clients then keep their backlog themselves, so a call that starts is not queued
    behind thousands in the sockets (bench/overload: p99 at 3x load 1.4 s -> 46 ms)."""
    handlers = Handlers()
    server = GrpcServer(
        {"/t.Test/Gated": handlers.gated}, max_running_calls=4, max_concurrent_streams=100
    )
    network = MemoryNetwork()

    async def gated(channel: Channel) -> None:
        await channel.unary(b"/t.Test/Gated", b"")

    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("gw", 0, network=network, **kw))
        channels = [Channel(f"gw:{port}", nursery, network=network) for _ in range(2)]
        assert server.stream_limit == 100
        async with trio.open_nursery() as calls:
            for channel in channels:
                for _ in range(2):
                    calls.start_soon(gated, channel)
            await wait_until_async(lambda: server.intake.running == 4, what="4 running calls")
            assert server.stream_limit == 2
            await wait_until_async(
                lambda: [c.peer_stream_limit for c in channels] == [2, 2],
                what="the share at the clients",
            )
            handlers.gate.set()
        await trio.sleep(3.0)  # the sweep sees a quiet server for its relax period
        assert server.stream_limit == 100
        await wait_until_async(
            lambda: [c.peer_stream_limit for c in channels] == [100, 100],
            what="the full limit back at the clients",
        )
        nursery.cancel_scope.cancel()
