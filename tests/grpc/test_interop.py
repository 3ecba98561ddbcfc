"""rsgw's gRPC server and channel against grpcio, over real loopback sockets.

The smaller, real-socket half of the gRPC shell tests (the rest run on memory
streams in test_server.py and test_client.py): what a foreign peer does that ours
might not (grpcio's own RST_STREAM on cancel, its deadline, its GOAWAY), and the
TCP listener's own behaviour (a busy port). grpcio is blocking, so its client
calls run in a thread (`trio.to_thread`); our side runs in the test's Trio run.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
import trio

from rsgw.base._errors import GrpcError, ListenError
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer
from rsgw.runtime._net import bind_tcp, bound_port
from tests.grpc.test_server import Handlers

LIMIT = 1024 * 1024


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, Handlers]]:
    handlers = Handlers()
    routes = {
        f"/t.Test/{name}": getattr(handlers, name.lower())
        for name in ("Echo", "Slow", "Gated", "Boom", "Refuse", "Missing", "Deadline")
    }
    server = GrpcServer(routes, max_receive_message_bytes=LIMIT, max_send_message_bytes=LIMIT)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, "127.0.0.1", 0)
        yield port, handlers
        nursery.cancel_scope.cancel()


def channel(port: int) -> grpc.Channel:
    return grpc.insecure_channel(
        f"127.0.0.1:{port}",
        options=[
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
        ],
    )


def call(port: int, method: str, body: bytes = b"", **kwargs: Any) -> Any:
    with channel(port) as ch:
        return ch.unary_unary(f"/t.Test/{method}")(body, **kwargs)


async def call_in_thread(port: int, method: str, body: bytes = b"", **kwargs: Any) -> Any:
    return await trio.to_thread.run_sync(lambda: call(port, method, body, **kwargs))


async def expect_error(fn: Callable[[], Any]) -> grpc.RpcError:
    try:
        await trio.to_thread.run_sync(fn)
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the call succeeded")


async def test_echo(served: tuple[int, Handlers]) -> None:
    port, _ = served
    assert await call_in_thread(port, "Echo", b"hello") == b"hello"
    assert await call_in_thread(port, "Echo", b"") == b""


async def test_unknown_method_is_unimplemented(served: tuple[int, Handlers]) -> None:
    port, _ = served
    err = await expect_error(lambda: call(port, "Nope", b"x"))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "/t.Test/Nope" in err.details()


async def test_oversized_message_fails_only_its_call(served: tuple[int, Handlers]) -> None:
    port, handlers = served

    def both_on_one_connection() -> tuple[Any, Any]:
        with channel(port) as ch:
            gated = ch.unary_unary("/t.Test/Gated").future(b"")
            big = ch.unary_unary("/t.Test/Echo").future(b"x" * (LIMIT + 1))
            try:
                big.result()
            except grpc.RpcError as exc:
                big_error = exc
            trio.from_thread.run_sync(handlers.gate.set)
            return big_error, gated.result(timeout=10)

    big_error, gated_reply = await trio.to_thread.run_sync(both_on_one_connection)
    assert big_error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{LIMIT + 1} vs. {LIMIT}" in big_error.details()
    assert gated_reply == b"opened"
    assert await call_in_thread(port, "Echo", b"after") == b"after"


async def test_client_cancel_cancels_the_handler(served: tuple[int, Handlers]) -> None:
    port, handlers = served
    ch = channel(port)
    try:
        future = ch.unary_unary("/t.Test/Slow").future(b"")
        with trio.fail_after(10):
            await handlers.slow_started.wait()
            future.cancel()  # grpcio sends RST_STREAM
            await handlers.slow_cancelled.wait()
        assert future.cancelled()
    finally:
        ch.close()
    assert await call_in_thread(port, "Echo", b"alive") == b"alive"


async def test_client_deadline_cancels_the_handler(served: tuple[int, Handlers]) -> None:
    port, handlers = served
    err = await expect_error(lambda: call(port, "Slow", timeout=0.3))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    with trio.fail_after(10):
        await handlers.slow_cancelled.wait()


async def test_grpc_error_and_rsgw_error_keep_their_status(served: tuple[int, Handlers]) -> None:
    port, _ = served
    err = await expect_error(lambda: call(port, "Refuse"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.details() == "not now"
    assert ("x-why", "because") in tuple(err.trailing_metadata())
    err = await expect_error(lambda: call(port, "Missing", b"thing"))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details() == "no such thing: thing"


async def test_many_concurrent_calls_on_one_connection(served: tuple[int, Handlers]) -> None:
    port, _ = served

    def burst() -> list[bytes]:
        with channel(port) as ch:
            echo = ch.unary_unary("/t.Test/Echo")
            futures = [echo.future(str(i).encode() * 100) for i in range(200)]
            return [f.result(timeout=20) for f in futures]

    replies = await trio.to_thread.run_sync(burst)
    assert replies == [str(i).encode() * 100 for i in range(200)]


async def test_graceful_close_lets_calls_finish() -> None:
    handlers = Handlers()
    server = GrpcServer({"/t.Test/Gated": handlers.gated, "/t.Test/Echo": handlers.echo})
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, "127.0.0.1", 0)
        result: list[bytes] = []

        async def client() -> None:
            result.append(await call_in_thread(port, "Gated"))

        nursery.start_soon(client)
        with trio.fail_after(10):  # the call is in flight before we close
            await handlers.gated_started.wait()
        closer = trio.Event()

        async def close() -> None:
            await server.aclose(grace=10)
            closer.set()

        nursery.start_soon(close)
        handlers.gate.set()
        with trio.fail_after(10):
            await closer.wait()
    assert result == [b"opened"]


async def test_busy_port_is_a_listen_error() -> None:
    sock = bind_tcp("127.0.0.1", 0)
    try:
        port = bound_port(sock)
        with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{port}: address"):
            bind_tcp("127.0.0.1", port)
        server = GrpcServer({})
        with pytest.raises(ListenError):
            await server.serve("127.0.0.1", port)
    finally:
        sock.close()


def test_busy_port_fails_the_worker_with_one_line() -> None:
    sock = bind_tcp("127.0.0.1", 0)
    try:
        port = bound_port(sock)
        done = subprocess.run(
            [sys.executable, "-m", "rsgw", "worker", "--port", str(port), "--metrics-port", "-1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        sock.close()
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"rsgw worker: cannot listen on 127.0.0.1:{port}: address already in use"
    ]


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
