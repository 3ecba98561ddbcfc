"""A request with hostile header bytes ends that call cleanly and costs no other call.

Over a real socket to rsgw's gRPC server: each hostile request shares its
connection with a good call sent after it, which must be answered; the hostile
one gets a gRPC status (or RST_STREAM), never a connection reset or a crash.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from rsgw.base._call import CallContext
from rsgw.base._status import StatusCode
from rsgw.grpc._server import GrpcServer
from tests.reliability.hostile import Header, HostileConnection, grpc_headers

ECHO = b"/t.Test/Echo"
NOT_UTF8 = b"\xff\xfe\x80bad"


async def _echo(request: bytes, call: CallContext) -> bytes:
    return request


@asynccontextmanager
async def serving() -> AsyncIterator[int]:
    server = GrpcServer({ECHO.decode(): _echo})
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(server.serve, "127.0.0.1", 0)
        yield port
        nursery.cancel_scope.cancel()


HOSTILE: dict[str, list[Header]] = {
    "path": grpc_headers(b"/t.Test/" + NOT_UTF8),
    "method": [(b":method", NOT_UTF8), *grpc_headers()[1:]],
    "content-type": grpc_headers(content_type=b"application/grpc" + NOT_UTF8),
    "content-type-not-grpc": grpc_headers(content_type=NOT_UTF8),
    "grpc-encoding": [*grpc_headers(), (b"grpc-encoding", NOT_UTF8)],
    "grpc-accept-encoding": [*grpc_headers(), (b"grpc-accept-encoding", NOT_UTF8)],
    "grpc-timeout": [*grpc_headers(), (b"grpc-timeout", NOT_UTF8)],
    "metadata": [*grpc_headers(), (b"x-custom", NOT_UTF8)],
    "authority": grpc_headers(authority=NOT_UTF8),
    "te": grpc_headers(te=NOT_UTF8),
    "huge-path": grpc_headers(b"/" + b"p" * 60_000),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_hostile_header_costs_only_its_call(case: str) -> None:
    async with serving() as port:
        conn = await HostileConnection.open(port)
        try:
            with trio.fail_after(10):
                bad = await conn.call(HOSTILE[case], b"x")
                good = await conn.call(grpc_headers(ECHO), b"hello")
                bad_outcome, good_outcome = await conn.wait(bad, good)
        finally:
            await conn.aclose()
        assert conn.terminated is None, f"{case}: connection ended {conn.terminated}"
        assert good_outcome.status == StatusCode.OK and good_outcome.data.endswith(b"hello")
        assert bad_outcome.ended
        if bad_outcome.status is not None and bad_outcome.status != StatusCode.OK:
            assert len(bad_outcome.message) <= 600  # bounded, whatever the client sent
