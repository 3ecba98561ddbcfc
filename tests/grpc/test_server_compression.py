"""Compression in the server and client shells: who sees what compressed, and when.

On memory streams with rsgw's channel (autojump clock), and over a real socket
with a bare HTTP/2 client for what rsgw's channel never does (send no
`grpc-accept-encoding`, name an encoding nobody reads).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio
from trio.testing import MockClock

from rsgw.base._body import Body, Gathered
from rsgw.base._call import CallContext
from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer
from rsgw.grpc._streams import ServerStream
from rsgw.grpc.protocol._compression import Compressed, Deflated, Gzipped, compress, decompress
from tests.helpers import raw_h2_unary
from tests.memory import MemoryNetwork

LIMIT = 1024 * 1024
ECHO, RAW, STREAM = b"/t.Test/Echo", b"/t.Test/Raw", b"/t.Test/Stream"


class Seen:
    """The types of the requests each handler was given."""

    def __init__(self) -> None:
        self.types: list[type[bytes] | type[Gathered]] = []

    async def echo(self, request: bytes, call: CallContext) -> bytes:
        self.types.append(type(request))
        return request

    async def passing(self, request: Body, call: CallContext) -> Body:
        self.types.append(type(request))
        return request

    async def stream(self, stream: ServerStream) -> None:
        async for message in stream:
            self.types.append(type(message))
            await stream.send(message)


def _server(seen: Seen, **options: object) -> GrpcServer:
    return GrpcServer(
        {ECHO.decode(): seen.echo},
        stream_handlers={STREAM.decode(): seen.stream},
        pass_through={RAW.decode(): seen.passing},
        max_receive_message_bytes=LIMIT,
        max_send_message_bytes=LIMIT,
        **options,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def serving(seen: Seen, **options: object) -> AsyncIterator[Channel]:
    network = MemoryNetwork()
    server = _server(seen, **options)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("s", 0, network=network, **kw))
        yield Channel(f"s:{port}", nursery, network=network)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("kind", [Gzipped, Deflated])
async def test_handlers_see_plain_requests_unless_raw(
    kind: type[Compressed], autojump_clock: MockClock
) -> None:
    seen = Seen()
    packed = compress(b"hello" * 100, kind)
    async with serving(seen) as channel:
        assert await channel.unary(ECHO, packed) == b"hello" * 100
        raw_reply = await channel.unary(RAW, packed, raw=True)
        assert type(raw_reply) is kind and raw_reply == packed  # relayed as it came
        assert await channel.unary(RAW, packed) == b"hello" * 100  # decompressed for us
    assert seen.types == [bytes, kind, kind]


async def test_response_encoding_compresses_for_clients_that_accept_it(
    autojump_clock: MockClock,
) -> None:
    async with serving(Seen(), response_encoding=Deflated) as channel:
        reply = await channel.unary(ECHO, b"x" * 1000, raw=True)
        assert type(reply) is Deflated
        assert decompress(reply, LIMIT) == b"x" * 1000
        assert await channel.unary(ECHO, b"x" * 1000) == b"x" * 1000


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (lambda: compress(bytes(8 * LIMIT), Gzipped), StatusCode.RESOURCE_EXHAUSTED),
        (lambda: Gzipped(b"garbage"), StatusCode.INTERNAL),
    ],
)
async def test_bad_compressed_requests_fail_only_their_call(
    make: Callable[[], Compressed], code: StatusCode, autojump_clock: MockClock
) -> None:
    async with serving(Seen()) as channel:
        with pytest.raises(GrpcError) as caught:
            await channel.unary(ECHO, make())
        assert caught.value.code is code
        assert await channel.unary(ECHO, b"after") == b"after"
        assert channel.connects == 1


async def test_streamed_messages_are_decompressed_as_read(autojump_clock: MockClock) -> None:
    seen = Seen()
    async with serving(seen) as channel:
        gzip_header = ((b"grpc-encoding", b"gzip"),)
        async with channel.stream(STREAM, deadline=math.inf, metadata=gzip_header) as stream:
            await stream.send(compress(b"one", Gzipped))
            await stream.send(b"two")  # a plain message on a compressed call is fine
            stream.end()
            assert [reply async for reply in stream] == [b"one", b"two"]
    assert seen.types == [bytes, bytes]


async def test_over_a_socket_without_accept_encoding() -> None:
    seen = Seen()
    server = _server(seen, response_encoding=Gzipped)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, "127.0.0.1", 0)
        with trio.fail_after(10):
            packed = compress(b"abc", Gzipped)
            headers = [("grpc-encoding", "gzip")]
            # No grpc-accept-encoding: identity only, even for a raw handler's reply.
            reply = await raw_h2_unary(port, RAW.decode(), packed, headers=headers, flag=1)
            assert (reply.status, reply.messages, reply.flags) == (0, (b"abc",), (0,))
            accepted = [*headers, ("grpc-accept-encoding", "gzip")]
            reply = await raw_h2_unary(port, ECHO.decode(), packed, headers=accepted, flag=1)
            assert (reply.flags, reply.fields["grpc-encoding"]) == ((1,), "gzip")
            assert decompress(Gzipped(reply.messages[0]), 10) == b"abc"
            # An encoding nobody reads: UNIMPLEMENTED, saying which ones we do.
            reply = await raw_h2_unary(
                port, ECHO.decode(), b"x", headers=[("grpc-encoding", "br")], flag=1
            )
            assert (reply.status, reply.message) == (
                StatusCode.UNIMPLEMENTED,
                "message encoding 'br' not supported",
            )
            assert reply.fields["grpc-accept-encoding"] == "identity,deflate,gzip"
            # A compressed flag on a call that named no encoding.
            reply = await raw_h2_unary(port, ECHO.decode(), b"x", flag=1)
            assert reply.status == StatusCode.INTERNAL
        nursery.cancel_scope.cancel()
