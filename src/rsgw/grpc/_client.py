"""The gRPC client shell: one HTTP/2 connection to one peer, many unary calls on it.

Theory of operation. A `Channel` holds at most one live `ChannelConnection`
(`rsgw.grpc._channel_connection`). The first call connects (bounded by
`connect_timeout`; concurrent callers wait for the same attempt); a connection
that dies or goes away is dropped, and the next call connects again. Each
connection runs its `Transport` (reader and writer) in the nursery the channel
was given. A call holds one of `max_concurrent_streams`
slots, starts its stream on the connection core, and waits for its `CallEnded`.

How calls fail is decided by the core (`rsgw.grpc.protocol._connection`), which the
gateway's failover rule relies on:
- the peer answered with a status: `GrpcError` with its code, message and extra
  trailers, unchanged;
- the connection could not be made, or the call was refused or lost before a
  response arrived: `WorkerUnavailable` (the request certainly did not run);
- the connection died after response headers arrived: `ResponseInterrupted`;
- the deadline passed: `GrpcError(DEADLINE_EXCEEDED)`, and the stream is reset.
A cancelled caller resets its stream (RST_STREAM CANCEL) so the peer stops work.

Invariants: every pending call on a connection is failed exactly once when the
connection ends; `reset()` does the same on purpose (the prober's watchdog), and
never blocks.
"""

from __future__ import annotations

import contextlib
import math
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Literal, overload

import trio

from rsgw.base._body import Body
from rsgw.base._errors import GrpcError, WorkerUnavailable
from rsgw.base._status import StatusCode
from rsgw.grpc._channel_connection import ChannelConnection
from rsgw.grpc._streams import ClientStream
from rsgw.grpc.protocol._compression import ACCEPT_ENCODING, Compressed, decompress, plain
from rsgw.grpc.protocol._framing import DEFAULT_MAX_MESSAGE_BYTES, too_large
from rsgw.grpc.protocol._metadata import CONTENT_TYPE, HeaderBlock, format_timeout
from rsgw.http2._hpack import encode_headers
from rsgw.runtime._net import TCP, Network
from rsgw.runtime._tls import connect as tls_connect

#: How `on_connect` calls the peer: `send(path, request) -> reply`.
Send = Callable[[bytes, bytes], Awaitable[bytes]]

#: Stands in for the deadline scope when the caller holds one (`enforce_deadline=False`).
_UNSCOPED: contextlib.nullcontext[None] = contextlib.nullcontext()

#: Concurrent calls per channel (the original's `max_concurrent_streams_per_worker`).
DEFAULT_MAX_CONCURRENT_STREAMS = 32
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Paths whose request header block a channel keeps (its callers use a few methods).
_MAX_BLOCKS = 64


class Channel:
    """Unary calls over raw bytes to one peer (`host:port`), on one HTTP/2 connection.

    Args:
        target: `host:port` of the peer.
        nursery: where connection tasks run; the channel lives as long as it does.
        network: how to reach `target` (TCP unless a test or an embedder says otherwise).
        max_concurrent_streams: calls in flight at once; more wait for a slot.
        max_receive_message_bytes / max_send_message_bytes: message limits.
        connect_timeout: bound on one connection attempt.
        on_connect: run on every new connection before any call may use it, with a
            way to make calls on it (`send(path, request) -> reply`): what a peer
            must be told first (the gateway registers shared memory again).
        ssl_context: speak TLS (`rsgw.runtime._tls.client_context`), checking the peer's
            certificate against the target's host name.
    """

    def __init__(
        self,
        target: str,
        nursery: trio.Nursery,
        *,
        network: Network = TCP,
        max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
        max_receive_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_send_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        on_connect: Callable[[Send], Awaitable[None]] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.target = target
        self._ssl_context = ssl_context
        self.on_connect = on_connect
        self._nursery = nursery
        self._network = network
        self._slots = trio.Semaphore(max_concurrent_streams)
        self.max_receive_message_bytes = max_receive_message_bytes
        self.max_send_message_bytes = max_send_message_bytes
        self.connect_timeout = connect_timeout
        self._connection: ChannelConnection | None = None
        self._connect_lock = trio.Lock()
        self._closed = False
        self._request_prefix: HeaderBlock = (
            (b":method", b"POST"),
            (b":scheme", b"http" if ssl_context is None else b"https"),
            (b":authority", target.encode()),
        )
        self._request_suffix: HeaderBlock = (
            (b"content-type", CONTENT_TYPE),
            (b"te", b"trailers"),
            (b"grpc-accept-encoding", ACCEPT_ENCODING),
        )
        #: Request header blocks by path, their constant part (`_headers`).
        self._blocks: dict[bytes, bytes] = {}
        #: Connections made so far (a reset or a dead peer makes the next call reconnect).
        self.connects = 0

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.usable

    def liveness(self) -> tuple[int, int]:
        """(calls waiting, reads so far) of the live connection; (0, 0) without one."""
        connection = self._connection
        if connection is None:
            return 0, 0
        return connection.pending, connection.reads

    @property
    def peer_stream_limit(self) -> int | None:
        """How many calls the server lets this channel have open now (None: no connection)."""
        connection = self._connection
        return None if connection is None else connection.connection.peer_stream_limit

    def ping(self) -> None:
        """Send a PING on the live connection, if there is one (see `liveness`)."""
        if self._connection is not None:
            self._connection.ping()

    def reset(self, reason: str = "channel reset") -> None:
        """Drop the connection now: its pending calls fail, the next call reconnects."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close(reason)

    def close_nowait(self) -> None:
        """Close now: calls in flight fail, later ones raise `WorkerUnavailable`."""
        self._closed = True
        self.reset("channel closed")

    async def aclose(self) -> None:
        self.close_nowait()

    @overload
    async def unary(
        self,
        path: bytes,
        request: Body,
        *,
        deadline: float = ...,
        metadata: HeaderBlock = ...,
        uncapped: bool = ...,
        enforce_deadline: bool = ...,
        raw: Literal[False] = ...,
    ) -> bytes: ...

    @overload
    async def unary(
        self,
        path: bytes,
        request: Body,
        *,
        deadline: float = ...,
        metadata: HeaderBlock = ...,
        uncapped: bool = ...,
        enforce_deadline: bool = ...,
        raw: Literal[True],
    ) -> Body: ...

    async def unary(
        self,
        path: bytes,
        request: Body,
        *,
        deadline: float = math.inf,
        metadata: HeaderBlock = (),
        uncapped: bool = False,
        enforce_deadline: bool = True,
        raw: bool = False,
    ) -> Body:
        """Call `path` with `request`; return the response message.

        A `Compressed` request goes out compressed (decompressed first if the peer
        said it does not read that encoding), a `Gathered` one as its pieces. The
        reply comes back decompressed, or, with `raw`, as it came (a pass-through
        relays it compressed, or `Gathered` if it was large).

        Args:
            deadline: absolute, on the Trio clock; forwarded as `grpc-timeout`.
            uncapped: skip the stream cap. For the gateway's own control-plane calls
                (health probes, metadata polls): a few per round, and they must not
                queue behind a full load of inference, or a busy worker looks hung.
            enforce_deadline: False when the caller already runs under a cancel scope
                with this deadline (the gateway's request path): the call then raises
                `trio.Cancelled` there, its stream reset, and we save a scope per call.

        Raises:
            GrpcError: the peer's status, or DEADLINE_EXCEEDED at `deadline`.
            WorkerUnavailable: no connection, or the call was refused or lost before
                a response arrived (`ResponseInterrupted` if after).
        """
        if len(request) > self.max_send_message_bytes:
            raise too_large(len(request), self.max_send_message_bytes, "sent")
        scope: trio.CancelScope | None
        with trio.CancelScope(deadline=deadline) if enforce_deadline else _UNSCOPED as scope:
            slots = None if uncapped else self._slots
            if slots is not None:
                if slots.value:  # free: no schedule point here, waiting for the reply is one
                    slots.acquire_nowait()
                else:
                    await slots.acquire()
            try:
                connection = await self._connect()
                headers = self._headers(path, deadline, metadata)
                if type(request) is not bytes:
                    accepts = connection.connection.peer_accepts
                    request, naming = self._encoded(request, accepts)
                    headers += naming
                reply = await connection.call(headers, request, raw)
            finally:
                if slots is not None:
                    slots.release()
            if raw or type(reply) is bytes:
                return reply
            return plain(reply, self.max_receive_message_bytes)
        assert scope is not None and scope.cancelled_caught
        raise GrpcError(StatusCode.DEADLINE_EXCEEDED, f"deadline exceeded calling {self.target}")

    @asynccontextmanager
    async def stream(
        self, path: bytes, *, deadline: float = math.inf, metadata: HeaderBlock = ()
    ) -> AsyncIterator[ClientStream]:
        """A streaming call to `path` for the duration of the block.

        The call holds one of the channel's stream slots while open; `deadline` is
        sent as `grpc-timeout` (the peer enforces it; the caller's own cancel scope
        is what stops waiting here). Leaving the block before the call ended resets
        it (RST_STREAM CANCEL).

        Raises:
            WorkerUnavailable: no connection, or it took no new stream.
        """
        async with self._slots:
            connection = await self._connect()
            stream_id, stream = connection.open_stream(self._headers(path, deadline, metadata))
            try:
                yield stream
            finally:
                if not stream.ended:
                    connection.abandon(stream_id)

    def _encoded(self, request: Body, accepts: frozenset[bytes] | None) -> tuple[Body, bytes]:
        """A compressed request as the peer can read it, and the header naming its
        encoding (encoded; b"" when it goes uncompressed)."""
        if not isinstance(request, Compressed):
            return request, b""
        if accepts is not None and request.encoding not in accepts:
            return decompress(request, self.max_send_message_bytes), b""
        return request, encode_headers(((b"grpc-encoding", request.encoding),))

    def _headers(self, path: bytes, deadline: float, metadata: HeaderBlock) -> bytes:
        """A call's request header block: the path's constant part, encoded once,
        then its timeout and metadata."""
        block = self._blocks.get(path)
        if block is None:
            if len(self._blocks) >= _MAX_BLOCKS:
                self._blocks.clear()
            headers = (*self._request_prefix, (b":path", path), *self._request_suffix)
            block = self._blocks[path] = encode_headers(headers)
        if deadline != math.inf:
            timeout = format_timeout(deadline - trio.current_time())
            block += encode_headers(((b"grpc-timeout", timeout),))
        if metadata:
            block += encode_headers(metadata)
        return block

    async def _connect(self) -> ChannelConnection:
        connection = self._connection
        if connection is not None and connection.usable:
            return connection
        async with self._connect_lock:
            connection = self._connection
            if connection is not None and connection.usable:
                return connection
            if self._closed:
                raise WorkerUnavailable(f"channel to {self.target} is closed")
            stream: trio.abc.Stream | None = None
            with trio.move_on_after(self.connect_timeout):
                stream = await self._open_stream()
            if stream is None:
                raise WorkerUnavailable(
                    f"cannot connect to {self.target}: no answer within {self.connect_timeout}s"
                )
            connection = ChannelConnection(self, stream)
            self.connects += 1
            self._nursery.start_soon(connection.run)
            # The peer's SETTINGS first (one round trip per connection): calls opened
            # before its stream limit is known could exceed it, which costs the whole
            # connection rather than one stream.
            with trio.move_on_after(self.connect_timeout):
                await connection.settled()
            if self.on_connect is not None:
                # Handed out only after this: other callers wait on the lock meanwhile.
                await self.on_connect(partial(self._first_call, connection))
            self._connection = connection
            return connection

    async def _open_stream(self) -> trio.abc.Stream:
        """A connected stream to the target, through the TLS handshake if TLS is on.

        A failed or cancelled handshake closes the socket: never a cleartext stream
        where TLS was asked for.
        """
        try:
            stream = await self._network.connect(self.target)
        except OSError as exc:
            raise WorkerUnavailable(
                f"cannot connect to {self.target}: {exc.strerror or exc}"
            ) from exc
        if self._ssl_context is None:
            return stream
        host = self.target.rsplit(":", 1)[0].strip("[]")
        try:
            return await tls_connect(stream, self._ssl_context, host)
        except trio.BrokenResourceError as exc:
            raise WorkerUnavailable(
                f"TLS handshake with {self.target} failed: {exc.__cause__ or exc}"
            ) from exc

    async def _first_call(
        self, connection: ChannelConnection, path: bytes, request: bytes
    ) -> bytes:
        """A call `on_connect` makes on a connection not yet handed out (bounded)."""
        deadline = trio.current_time() + self.connect_timeout
        with trio.move_on_at(deadline):
            reply = await connection.call(self._headers(path, deadline, ()), request)
            return plain(reply, self.max_receive_message_bytes)
        connection.close(f"no answer within {self.connect_timeout}s while connecting")
        raise WorkerUnavailable(f"{self.target} did not answer while connecting")

    def forget(self, connection: ChannelConnection) -> None:
        if self._connection is connection:
            self._connection = None
