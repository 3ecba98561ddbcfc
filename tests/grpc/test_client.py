"""The client channel against rsgw's own server and against a grpcio server."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from concurrent import futures

import grpc
import pytest
import trio
import trio.testing

from rsgw._errors import GrpcError, WorkerUnavailable
from rsgw._net import bind_tcp, bound_port
from rsgw._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer, ServerCall

BIG = 80 * 1024 * 1024


class Peer:
    """Server-side handlers that report what they saw."""

    def __init__(self) -> None:
        self.started = trio.Event()
        self.cancelled = trio.Event()
        self.gate = trio.Event()
        self.in_flight = 0
        self.max_in_flight = 0
        self.deadlines: list[float] = []

    async def echo(self, request: bytes, call: ServerCall) -> bytes:
        self.deadlines.append(call.deadline - trio.current_time())
        return request

    async def hang(self, request: bytes, call: ServerCall) -> bytes:
        self.started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled.set()
            raise
        return b""  # pragma: no cover

    async def gated(self, request: bytes, call: ServerCall) -> bytes:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.started.set()
        await self.gate.wait()
        self.in_flight -= 1
        return request

    async def refuse(self, request: bytes, call: ServerCall) -> bytes:
        raise GrpcError(StatusCode.NOT_FOUND, "no model 'x' here", ((b"x-worker", b"w0"),))


def routes(peer: Peer) -> dict[str, object]:
    return {
        "/t.T/Echo": peer.echo,
        "/t.T/Hang": peer.hang,
        "/t.T/Gated": peer.gated,
        "/t.T/Refuse": peer.refuse,
    }


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, Peer, trio.Nursery]]:
    peer = Peer()
    server = GrpcServer(routes(peer), max_receive_message_bytes=BIG, max_send_message_bytes=BIG)  # type: ignore[arg-type]  # handler dict
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, "127.0.0.1", 0)
        yield port, peer, nursery
        nursery.cancel_scope.cancel()


def channel(port: int, nursery: trio.Nursery, **kwargs: int) -> Channel:
    return Channel(
        f"127.0.0.1:{port}",
        nursery,
        max_receive_message_bytes=BIG,
        max_send_message_bytes=BIG,
        **kwargs,
    )


async def test_round_trip_and_reuse(served: tuple[int, Peer, trio.Nursery]) -> None:
    port, _, nursery = served
    ch = channel(port, nursery)
    for i in range(20):
        assert await ch.unary(b"/t.T/Echo", b"ping %d" % i) == b"ping %d" % i
    assert ch.connects == 1


async def test_64_mib_both_ways(served: tuple[int, Peer, trio.Nursery]) -> None:
    port, _, nursery = served
    payload = bytes(range(256)) * (64 * 1024 * 1024 // 256)
    assert await channel(port, nursery).unary(b"/t.T/Echo", payload) == payload


async def test_peer_status_and_trailers_pass_through(
    served: tuple[int, Peer, trio.Nursery],
) -> None:
    port, _, nursery = served
    with pytest.raises(GrpcError) as caught:
        await channel(port, nursery).unary(b"/t.T/Refuse", b"")
    assert caught.value.code is StatusCode.NOT_FOUND
    assert caught.value.message == "no model 'x' here"
    assert caught.value.trailers == ((b"x-worker", b"w0"),)
    with pytest.raises(GrpcError) as caught:
        await channel(port, nursery).unary(b"/t.T/Missing", b"")
    assert caught.value.code is StatusCode.UNIMPLEMENTED


async def test_deadline_is_forwarded_and_enforced(served: tuple[int, Peer, trio.Nursery]) -> None:
    port, peer, nursery = served
    ch = channel(port, nursery)
    await ch.unary(b"/t.T/Echo", b"", deadline=trio.current_time() + 0.3)
    assert 0 < peer.deadlines[-1] <= 0.3
    await ch.unary(b"/t.T/Echo", b"")
    assert peer.deadlines[-1] == math.inf
    with pytest.raises(GrpcError) as caught:
        await ch.unary(b"/t.T/Hang", b"", deadline=trio.current_time() + 0.2)
    assert caught.value.code is StatusCode.DEADLINE_EXCEEDED
    with trio.fail_after(5):
        await peer.cancelled.wait()


async def test_cancelled_caller_resets_the_stream(served: tuple[int, Peer, trio.Nursery]) -> None:
    port, peer, nursery = served
    ch = channel(port, nursery)
    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as inner:
            inner.start_soon(ch.unary, b"/t.T/Hang", b"")
            await peer.started.wait()
            inner.cancel_scope.cancel()
        with trio.fail_after(5):
            await peer.cancelled.wait()
    assert not scope.cancelled_caught
    assert await ch.unary(b"/t.T/Echo", b"after") == b"after"


async def test_refused_connection_is_unavailable() -> None:
    sock = bind_tcp("127.0.0.1", 0)
    port = bound_port(sock)
    sock.close()
    async with trio.open_nursery() as nursery:
        with pytest.raises(WorkerUnavailable, match=f"cannot connect to 127.0.0.1:{port}"):
            await channel(port, nursery).unary(b"/t.T/Echo", b"")


async def test_dead_peer_fails_pending_calls_at_once() -> None:
    peer = Peer()
    server = GrpcServer(routes(peer))  # type: ignore[arg-type]  # handler dict
    async with trio.open_nursery() as nursery:
        server_scope = trio.CancelScope()

        async def run_server(task_status: trio.TaskStatus[int]) -> None:
            with server_scope:
                await server.serve("127.0.0.1", 0, task_status=task_status)

        port = await nursery.start(run_server)
        ch = channel(port, nursery)
        errors: list[Exception] = []

        async def pending() -> None:
            try:
                await ch.unary(b"/t.T/Hang", b"")
            except WorkerUnavailable as exc:
                errors.append(exc)

        with trio.fail_after(5):  # no timeout involved: EOF fails the call
            async with trio.open_nursery() as calls:
                for _ in range(3):
                    calls.start_soon(pending)
                await peer.started.wait()
                server_scope.cancel()  # the peer dies with three calls in flight
        assert len(errors) == 3
        assert not ch.connected
        nursery.cancel_scope.cancel()


async def test_reset_fails_pending_and_reconnects(served: tuple[int, Peer, trio.Nursery]) -> None:
    port, peer, nursery = served
    ch = channel(port, nursery)
    failures: list[Exception] = []

    async def pending() -> None:
        try:
            await ch.unary(b"/t.T/Hang", b"")
        except WorkerUnavailable as exc:
            failures.append(exc)

    with trio.fail_after(5):
        async with trio.open_nursery() as calls:
            calls.start_soon(pending)
            await peer.started.wait()
            ch.reset("reset by the watchdog")
    assert "reset by the watchdog" in str(failures[0])
    assert await ch.unary(b"/t.T/Echo", b"x") == b"x"
    assert ch.connects == 2


async def test_stream_cap_queues_extra_calls(served: tuple[int, Peer, trio.Nursery]) -> None:
    port, peer, nursery = served
    ch = channel(port, nursery, max_concurrent_streams=2)
    async with trio.open_nursery() as calls:
        for _ in range(5):
            calls.start_soon(ch.unary, b"/t.T/Gated", b"")
        with trio.fail_after(5):
            await peer.started.wait()
            await trio.testing.wait_all_tasks_blocked()
        assert peer.in_flight == 2
        peer.gate.set()
    assert peer.max_in_flight == 2


async def test_uncapped_calls_do_not_queue_behind_a_full_cap(
    served: tuple[int, Peer, trio.Nursery],
) -> None:
    port, peer, nursery = served
    ch = channel(port, nursery, max_concurrent_streams=2)
    async with trio.open_nursery() as calls:
        for _ in range(3):
            calls.start_soon(ch.unary, b"/t.T/Gated", b"")
        with trio.fail_after(5):
            await peer.started.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert peer.in_flight == 2  # the cap is full, one call waits
            assert await ch.unary(b"/t.T/Echo", b"ping", uncapped=True) == b"ping"
        peer.gate.set()


async def test_send_limit() -> None:
    async with trio.open_nursery() as nursery:
        ch = Channel("127.0.0.1:1", nursery, max_send_message_bytes=10)
        with pytest.raises(GrpcError) as caught:
            await ch.unary(b"/t.T/Echo", b"x" * 11)
    assert caught.value.code is StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture
def grpcio_server() -> Iterator[int]:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        if request == b"fail":
            context.set_trailing_metadata((("x-detail", "why"),))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not ready")
        return request[::-1]

    handler = grpc.method_handlers_generic_handler(
        "t.T", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(None)


async def test_interop_with_grpcio_server(grpcio_server: int) -> None:
    async with trio.open_nursery() as nursery:
        ch = Channel(f"127.0.0.1:{grpcio_server}", nursery)
        assert await ch.unary(b"/t.T/Echo", b"abc") == b"cba"
        with pytest.raises(GrpcError) as caught:
            await ch.unary(b"/t.T/Echo", b"fail", deadline=trio.current_time() + 5)
        assert caught.value.code is StatusCode.FAILED_PRECONDITION
        assert caught.value.message == "not ready"
        assert (b"x-detail", b"why") in caught.value.trailers
        with pytest.raises(GrpcError) as caught:
            await ch.unary(b"/t.T/Nope", b"")
        assert caught.value.code is StatusCode.UNIMPLEMENTED
        nursery.cancel_scope.cancel()
