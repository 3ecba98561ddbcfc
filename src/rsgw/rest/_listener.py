"""The REST listener: rsgw's own HTTP/1.1 server on trio.

Theory of operation. One task per connection, and nothing else: the request head
and body are parsed on that task, the door (`RestDoor.respond`) runs inline on it,
and the reply goes out in one send, head and body together. The usual request is
read by `rsgw.rest._http1` (a few regular expressions); from the first request that
is anything else, the connection is h11's (sans-IO), which serves the rest of it or
answers the error. Keep-alive connections are served request after request;
pipelined requests are answered in order (the next is parsed only once the last is
answered). `Expect: 100-continue` is answered when the body is first waited for,
chunked request bodies are read as h11 delivers them, and HEAD gets the head only.

Why not hypercorn, which served this port at first: its HTTP/1.1 costs about 0.9 ms
of CPU per call (a task and a memory channel per request, a keep-alive timer started
as a new task after every reply, a lock and a shielded scope around each of its two
sends), four times what the whole gRPC call costs (docs/benchmarks.md, "REST front
door"). Here the timers are one cancel scope per connection whose deadline moves:
the request head must be complete within `header_seconds` of the connection or of
its first bytes (a slowloris is cut), an idle keep-alive connection is closed after
`REST_KEEP_ALIVE_SECONDS`, a body that stalls for `header_seconds` ends its
connection, and while the door works there is no deadline (the call has its own).

HTTP/2 is still hypercorn's: a cleartext connection that opens with the HTTP/2
preface (h2c with prior knowledge), or a TLS one that chose `h2` by ALPN, is handed
to hypercorn's per-connection server, which serves the door as an ASGI app. An
HTTP/1.1 `Upgrade: h2c` is not taken up: the request is answered in HTTP/1.1, which
is what curl then expects (httpx never asks).

A graceful stop (`aclose`) is the gRPC port's: the listening socket closes, idle
connections close, a call in flight finishes and its reply says `Connection: close`,
HTTP/2 connections are told to end (hypercorn's GOAWAY) and close once idle; what is
still running when the grace is up is answered 503, "server shutting down".

Limits come from the gRPC port's `connections:` block (`ConnectionLimits`): the head
is held to `max_header_list_bytes`, connections served at once to `max_connections`
(the same `rsgw._net.Acceptor` as the gRPC listener's), and a request body to the
door's `max_body_bytes` (`grpc.max_recv_msg_bytes`). A body of known length that does
not arrive with its head waits for a grant of the upload budget the gRPC port uses
too (`rsgw._uploads`) before more of it is read: meanwhile the client waits in TCP's
flow control, and a budget that cannot take it answers 429.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

import h11
import trio
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from rsgw._admin import REST_KEEP_ALIVE_SECONDS, hypercorn_config, wrap_asgi
from rsgw._net import Acceptor, bind_tcp, bound_port
from rsgw._peer import Peer, peer_of
from rsgw._tls import ServerTls, peer_identity
from rsgw._uploads import Share, Ticket, UploadBudget, unfinished_refusal
from rsgw.grpc._limits import ConnectionLimits
from rsgw.rest._door import Response, RestDoor, error_response, too_large
from rsgw.rest._http1 import NEED_DATA, TOO_LARGE, Head, parse_head, response_bytes

logger = logging.getLogger(__name__)

#: What one receive asks the kernel for.
RECEIVE_BYTES = 64 * 1024
#: Replies longer than this are sent in pieces this long, each with its own deadline.
SEND_PIECE_BYTES = 1024 * 1024
#: How long a connection closed after an error lingers to read what its client still
#: sends (so the kernel does not reset the connection before the answer is read).
LINGER_SECONDS = 1.0
#: What an HTTP/2 connection opens with (RFC 9113 §3.4).
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_CLOSE = (b"connection", b"close")
_CONTINUE = h11.InformationalResponse(status_code=100, headers=[])


class RestListener:
    """Serves a `RestDoor` on HTTP/1.1 (and HTTP/2 through hypercorn); see the module
    docstring.

    Args:
        door: answers each request.
        limits: the gRPC port's connection limits.
        tls: HTTPS only, with this context (ALPN `h2` and `http/1.1`).
        max_concurrent_streams: an HTTP/2 connection's stream limit.
        keep_alive_seconds: how long an idle keep-alive connection is kept.
        upload_budget: the unfinished request bytes both ports share (None: none).
    """

    def __init__(
        self,
        door: RestDoor,
        *,
        limits: ConnectionLimits | None = None,
        tls: ServerTls | None = None,
        max_concurrent_streams: int | None = None,
        keep_alive_seconds: float = REST_KEEP_ALIVE_SECONDS,
        upload_budget: UploadBudget | None = None,
    ) -> None:
        self._door = door
        #: Without a budget, one that grants every body at once (the same code path).
        self._uploads = upload_budget or UploadBudget(sys.maxsize, 0)
        self._limits = ConnectionLimits() if limits is None else limits
        self._tls = tls
        self._keep_alive = keep_alive_seconds
        #: Connections open now (HTTP/1.1 and HTTP/2).
        self.connections = 0
        #: HTTP/1.1 connections waiting for a request head (the first, or the next on a
        #: kept-alive connection), oldest first, by their timer: at the connection cap
        #: the oldest is closed to make room for a new client.
        self._waiting: dict[trio.CancelScope, None] = {}
        #: Connections closed to make room at the cap.
        self.evicted = 0
        self._acceptor = Acceptor(
            self._limits.max_connections, lambda: self.connections, self._make_room
        )
        self._h2_config = hypercorn_config(tls, self._limits, max_concurrent_streams)
        self._h2_app = wrap_asgi(door, self._h2_config)
        self._h2_context = WorkerContext(None)
        #: What a graceful stop cuts when its grace is up, by the connections' timers:
        #: HTTP/1.1 connections in the door (each answered 503), HTTP/2 connections.
        self._calls: set[trio.CancelScope] = set()
        self._h2_connections: set[trio.CancelScope] = set()
        self._cut: frozenset[trio.CancelScope] = frozenset()
        self._accepting = trio.CancelScope()
        self._closing = False
        self._drained = trio.Event()  # set once closing with no connection left
        self._closed = trio.Event()

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on `host:port`, report the bound port, serve until cancelled.

        Cancelled, the listening socket closes first, then every connection (a call
        in flight is cut short with it).

        Raises:
            ListenError: the address is busy or cannot be bound.
        """
        sock = bind_tcp(host, port)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._accept, listener, nursery)
                task_status.started(bound_port(sock))
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        try:
            with self._accepting:
                await self._acceptor.run(listener, self._serve_connection, nursery)
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()  # no new clients once stopping

    async def aclose(self, grace: float) -> int:
        """Stop taking connections and let calls in flight finish within `grace` seconds;
        what still runs then is answered 503. Returns how many calls (HTTP/2: how many
        connections) were cut short. Connections end; `serve` keeps running until
        cancelled. A second caller waits for the first."""
        if self._closing:
            await self._closed.wait()
            return 0
        self._closing = True
        self._accepting.cancel()
        await self._h2_context.terminated.set()  # hypercorn: GOAWAY, close when idle
        for timer in list(self._waiting):  # idle connections end now
            timer.cancel()
        self._waiting.clear()
        if self.connections == 0:
            self._drained.set()
        with trio.move_on_after(grace):
            await self._drained.wait()
        self._cut = frozenset(self._calls)
        cut = len(self._calls) + len(self._h2_connections)
        for timer in (*self._calls, *self._h2_connections):
            timer.cancel()
        with trio.move_on_after(LINGER_SECONDS):
            await self._drained.wait()
        self._closed.set()
        return cut

    def _make_room(self) -> None:
        """The cap is reached: close the connection that has waited longest for a
        request, if one is waiting (a call in progress is never cut)."""
        for timer in self._waiting:
            del self._waiting[timer]
            timer.cancel()
            self.evicted += 1
            return

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        timer = trio.CancelScope(deadline=trio.current_time() + self._limits.header_seconds)
        self._waiting[timer] = None
        try:
            # The one timer of the connection: its deadline moves as the connection
            # goes from waiting for a head, to running the door, to idling.
            with timer:
                if self._tls is not None:
                    stream = await self._tls.accept(stream)
                    if stream.selected_alpn_protocol() == "h2":
                        self._waiting.pop(timer, None)
                        timer.deadline = math.inf  # hypercorn's timers from here
                        await self._serve_h2(stream, timer)
                        return
                first = await stream.receive_some(RECEIVE_BYTES)
                while first and len(first) < len(H2_PREFACE) and H2_PREFACE.startswith(first):
                    more = await stream.receive_some(RECEIVE_BYTES)
                    if not more:
                        return
                    first += more
                if first.startswith(H2_PREFACE) and self._tls is None:
                    self._waiting.pop(timer, None)
                    timer.deadline = math.inf
                    await self._serve_h2(_Replayed(stream, bytes(first)), timer)
                    return
                if first:
                    await self._serve_http1(stream, bytes(first), timer)
            if timer in self._cut:  # the drain's grace ran out while it was in the door
                await _close_with(stream, _SHUTTING_DOWN)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went
        finally:
            self._waiting.pop(timer, None)
            with trio.CancelScope(shield=True), trio.move_on_after(LINGER_SECONDS):
                await stream.aclose()
            self.connections -= 1
            self._acceptor.release()
            if self._closing and self.connections == 0:
                self._drained.set()

    async def _serve_h2(self, stream: trio.abc.Stream, timer: trio.CancelScope) -> None:
        """One HTTP/2 connection, served by hypercorn (the door as an ASGI app)."""
        server = TCPServer(
            self._h2_app,
            self._h2_config,
            self._h2_context,
            ConnectionState({}),
            stream,  # type: ignore[arg-type]  # duck-typed: a TLS stream, or one with .socket
        )
        self._h2_connections.add(timer)
        try:
            await server.run()
        finally:
            self._h2_connections.discard(timer)

    async def _serve_http1(
        self, stream: trio.abc.Stream, buffer: bytes, timer: trio.CancelScope
    ) -> None:
        """HTTP/1.1 requests on `stream` (whose first bytes were `buffer`) until the client
        or a timer ends the connection: read by `rsgw.rest._http1` while they are the
        usual kind, by h11 from the first one that is not."""
        limits = self._limits
        door = self._door
        max_body = door.max_body_bytes
        max_head = limits.max_header_list_bytes
        peer = peer_of(stream, peer_identity(stream))
        idle = False
        while True:
            head = parse_head(buffer, max_head)
            while head is NEED_DATA:
                data = await stream.receive_some(RECEIVE_BYTES)
                if not data:
                    return  # the client closed the connection
                buffer += data
                head = parse_head(buffer, max_head)
                if idle and head is NEED_DATA:  # a new request's head has a while to come
                    idle = False
                    timer.deadline = trio.current_time() + limits.header_seconds
            if not isinstance(head, Head):
                if head is TOO_LARGE:
                    error = error_response(431, f"request head larger than {max_head} bytes")
                    await _close_with(stream, response_bytes(431, error.headers, error.body, True))
                else:
                    await self._serve_h11(stream, buffer, timer, peer)
                return
            idle = False
            self._waiting.pop(timer, None)
            timer.deadline = math.inf
            if head.body_length > max_body:
                too_long = error_response(413, too_large(max_body))
                await _close_with(
                    stream, response_bytes(413, too_long.headers, too_long.body, True)
                )
                return
            end = head.body_start + head.body_length
            if len(buffer) >= end:
                body, buffer = buffer[head.body_start : end], buffer[end:]
            else:
                ticket = await self._reserve(stream, head.body_length)
                if ticket is None:
                    return
                try:
                    body, buffer = await self._rest_of_body(stream, buffer, head, timer)
                finally:
                    ticket.release()
                if not body and head.body_length:
                    return  # the client went before its body ended
            method = head.method.decode("ascii")
            response = await self._call(method, head.target, head.headers, body, peer, timer)
            close = head.close or self._closing
            reply = b"" if method == "HEAD" else response.body
            await self._write(
                stream, response_bytes(response.status, response.headers, reply, close), timer
            )
            if close:
                return
            idle = True
            self._waiting[timer] = None

    async def _call(
        self,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        peer: Peer,
        timer: trio.CancelScope,
    ) -> Response:
        """The door's answer, the connection (by its timer) counted as in a call: a
        graceful stop's cut ends it, and `_serve_connection` answers 503."""
        self._calls.add(timer)
        try:
            return await self._door.respond(method, _path(target), headers, body, peer)
        finally:
            self._calls.discard(timer)

    async def _reserve(self, stream: trio.abc.Stream, size: int) -> Ticket | None:
        """A granted ticket for a body of `size` bytes still arriving, waited for while
        the budget is spent (the client waits in TCP's flow control, as nothing more
        is read); None: refused, answered 429 and the connection closed."""
        budget = self._uploads
        granted = trio.Event()
        share = Share(self._limits.max_buffered_bytes)
        ticket = budget.request(size, share, lambda _: granted.set())
        if ticket is None:
            error = error_response(429, unfinished_refusal(size, budget))
            await _close_with(stream, response_bytes(429, error.headers, error.body, True))
            return None
        if not ticket.granted:
            try:
                await granted.wait()
            except BaseException:
                ticket.release()
                raise
        return ticket

    async def _rest_of_body(
        self, stream: trio.abc.Stream, buffer: bytes, head: Head, timer: trio.CancelScope
    ) -> tuple[bytes, bytes]:
        """The body that `buffer` holds the start of, and the bytes after it; (b"", b"")
        if the client closes first. A body that stalls for `header_seconds` ends its
        connection."""
        chunks = [buffer[head.body_start :]]
        have, need = len(chunks[0]), head.body_length
        while have < need:
            timer.deadline = trio.current_time() + self._limits.header_seconds
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                return b"", b""
            chunks.append(bytes(data))
            have += len(data)
        timer.deadline = math.inf
        whole = b"".join(chunks)
        if have == need:
            return whole, b""
        return whole[:need], whole[need:]

    async def _serve_h11(
        self, stream: trio.abc.Stream, data: bytes, timer: trio.CancelScope, peer: Peer
    ) -> None:
        """The rest of the connection, from the request at the front of `data`, read and
        answered through h11."""
        limits = self._limits
        door = self._door
        max_body = door.max_body_bytes
        connection = h11.Connection(
            h11.SERVER, max_incomplete_event_size=limits.max_header_list_bytes
        )
        connection.receive_data(data)
        idle = False
        try:
            while True:
                event = connection.next_event()
                while event is h11.NEED_DATA:  # the head is not all here yet
                    data = bytes(await stream.receive_some(RECEIVE_BYTES))
                    if idle and data:  # a new request's first bytes: its head has a while
                        idle = False
                        timer.deadline = trio.current_time() + limits.header_seconds
                    connection.receive_data(data)
                    event = connection.next_event()
                if type(event) is not h11.Request:
                    return  # the client closed the connection
                self._waiting.pop(timer, None)
                timer.deadline = math.inf
                request: h11.Request = event
                headers = [(name, value) for _, name, value in request.headers._full_items]
                length = _content_length(headers)
                body = None
                if length is None or length <= max_body:
                    ticket = None
                    if length is not None and length > RECEIVE_BYTES:
                        ticket = await self._reserve(stream, length)
                        if ticket is None:
                            return
                    try:
                        body = await self._body(stream, connection, timer, max_body)
                    finally:
                        if ticket is not None:
                            ticket.release()
                if body is None:
                    too_long = error_response(413, too_large(max_body))
                    await _close_with(stream, _h11_reply(connection, too_long, False, True))
                    return
                method = request.method.decode("ascii")
                response = await self._call(method, request.target, headers, body, peer, timer)
                reply = _h11_reply(connection, response, method == "HEAD", self._closing)
                await self._write(stream, reply, timer)
                if connection.our_state is h11.MUST_CLOSE or self._closing:
                    return
                connection.start_next_cycle()
                idle = True
                self._waiting[timer] = None
        except h11.RemoteProtocolError as exc:
            error = error_response(exc.error_status_hint, f"bad request: {exc}")
            await _close_with(stream, _h11_reply(connection, error, False, True))

    async def _body(
        self,
        stream: trio.abc.Stream,
        connection: h11.Connection,
        timer: trio.CancelScope,
        max_body: int,
    ) -> bytes | None:
        """The request's whole body as it came (None past `max_body`)."""
        chunks: list[bytes] = []
        size = 0
        waited = False
        while True:
            event = connection.next_event()
            kind = type(event)
            if kind is h11.Data:
                chunk = event.data  # type: ignore[union-attr]  # a Data event
                size += len(chunk)
                if size > max_body:
                    return None
                chunks.append(chunk)
            elif kind is h11.EndOfMessage:
                break
            else:  # NEED_DATA: a body that stalls for header_seconds ends its connection
                if connection.they_are_waiting_for_100_continue:
                    await stream.send_all(connection.send(_CONTINUE) or b"")
                waited = True
                timer.deadline = trio.current_time() + self._limits.header_seconds
                connection.receive_data(bytes(await stream.receive_some(RECEIVE_BYTES)))
        if waited:
            timer.deadline = math.inf
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _write(self, stream: trio.abc.Stream, out: bytes, timer: trio.CancelScope) -> None:
        """Send `out` in one send (in pieces past `SEND_PIECE_BYTES`, each given
        `header_seconds`); the keep-alive timer starts."""
        if len(out) <= SEND_PIECE_BYTES:
            timer.deadline = trio.current_time() + self._keep_alive  # the send, then idling
            await stream.send_all(out)
            return
        view = memoryview(out)
        for start in range(0, len(out), SEND_PIECE_BYTES):
            timer.deadline = trio.current_time() + self._limits.header_seconds
            await stream.send_all(view[start : start + SEND_PIECE_BYTES])
        timer.deadline = trio.current_time() + self._keep_alive


async def _close_with(stream: trio.abc.Stream, out: bytes) -> None:
    """Send `out` (an answer, or nothing) and end the connection, reading for a while
    what the client still sends so that the answer arrives (closing with unread input
    makes the kernel reset the connection, which can destroy what was sent)."""
    with trio.move_on_after(LINGER_SECONDS) as linger:
        linger.shield = True  # the connection's timer may have just run out
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            if out:
                await stream.send_all(out)
            if isinstance(stream, trio.SocketStream):
                await stream.send_eof()
            while await stream.receive_some(RECEIVE_BYTES):
                pass


def _h11_reply(connection: h11.Connection, response: Response, head: bool, close: bool) -> bytes:
    """`response` as h11 writes it on `connection`; b"" if an answer can no longer be
    sent there."""
    if connection.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return b""
    headers = [*response.headers, _CLOSE] if close else response.headers
    status = response.status
    try:
        out = connection.send(
            h11.Response(status_code=status, headers=headers, reason=_REASONS.get(status, b""))
        )
        body = b"" if head else response.body
        if body:
            out = (out or b"") + (connection.send(h11.Data(data=body)) or b"")
        return (out or b"") + (connection.send(h11.EndOfMessage()) or b"")
    except h11.LocalProtocolError:
        return b""


def _shutting_down() -> bytes:
    error = error_response(503, "server shutting down: the call did not finish within the drain")
    return response_bytes(503, error.headers, error.body, True)


_SHUTTING_DOWN = _shutting_down()


class _Replayed(trio.abc.Stream):
    """A socket stream whose first bytes, already read, are received again (what
    hypercorn is handed for an h2c connection: it reads the preface itself)."""

    def __init__(self, stream: trio.abc.Stream, first: bytes) -> None:
        self._stream = stream
        self._first = first

    @property
    def socket(self) -> Any:
        """The socket under it (hypercorn asks it for the peer's address)."""
        return getattr(self._stream, "socket", None)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._first:
            first, self._first = self._first, b""
            return first
        return bytes(await self._stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if isinstance(self._stream, trio.SocketStream):
            await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared body length (h11 has checked it is a number), or None."""
    for name, value in headers:
        if name == b"content-length":
            return int(value)
    return None


def _path(target: bytes) -> str:
    """The request target's path, percent-decoded, as ASGI's `scope["path"]` is."""
    path = target.partition(b"?")[0]
    if b"%" in path:
        path = unquote_to_bytes(path)
    return path.decode("utf-8", "replace")
