"""The REST listener: rsgw's own HTTP/1.1 server on trio.

Theory of operation. One task per connection, and nothing else: the request head
and body are parsed on that task, the door (`RestDoor.respond`) runs inline on it,
and the reply goes out in one send, head and body together. Every HTTP/1.x request is
read by rsgw's own strict, sans-IO reader: `rsgw.rest._http1` for the head (the usual
request by a few regular expressions), `rsgw.rest._chunked` for a chunked body. What
it refuses (framing a proxy could read otherwise, RFC 9112's rules) is answered with
the refusal's status and `Connection: close`, and the connection ends: after a framing
error, where the next request would start is not known. Keep-alive connections are
served request after request (HTTP/1.0 ones only if they asked for keep-alive);
pipelined requests are answered in order (the next is parsed only once the last is
answered). `Expect: 100-continue` is answered when the body is first waited for, and
HEAD gets the head only.

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
(the same `rsgw.runtime._net.Acceptor` as the gRPC listener's), and a request body to the
door's `max_body_bytes` (`grpc.max_recv_msg_bytes`). A body that does not arrive
with its head waits for a grant of the upload budget the gRPC port uses too
(`rsgw.base._uploads`; a chunked body asks for `max_body_bytes`, see `_body`) before more
of it is read: the client waits in TCP's flow control; a full budget answers 429.
"""

from __future__ import annotations

import logging
import math
import sys
from urllib.parse import unquote_to_bytes

import trio
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from rsgw.base._limits import ConnectionLimits
from rsgw.base._peer import Peer, peer_of
from rsgw.base._uploads import Share, Ticket, UploadBudget, unfinished_refusal
from rsgw.rest._chunked import ChunkedBody
from rsgw.rest._connections import LINGER_SECONDS, RECEIVE_BYTES, Replayed, close_with
from rsgw.rest._door import Response, RestDoor, error_response, too_large
from rsgw.rest._http1 import (
    CONTINUE,
    NEED_DATA,
    Head,
    Refusal,
    parse_head,
    response_bytes,
)
from rsgw.runtime._admin import REST_KEEP_ALIVE_SECONDS, hypercorn_config, wrap_asgi
from rsgw.runtime._net import Acceptor, bind_tcp, bound_port
from rsgw.runtime._tls import ServerTls, peer_identity

logger = logging.getLogger(__name__)

#: Replies longer than this are sent in pieces this long, each with its own deadline.
SEND_PIECE_BYTES = 1024 * 1024
#: What an HTTP/2 connection opens with (RFC 9113 §3.4).
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


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
                    await self._serve_h2(Replayed(stream, bytes(first)), timer)
                    return
                if first:
                    await self._serve_http1(stream, bytes(first), timer)
            if timer in self._cut:  # the drain's grace ran out while it was in the door
                await close_with(stream, _SHUTTING_DOWN)
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
        """HTTP/1.x requests on `stream` (whose first bytes were `buffer`), read by
        `rsgw.rest._http1` and `rsgw.rest._chunked`, until the client, a timer or a
        refused request ends the connection."""
        limits = self._limits
        max_body = self._door.max_body_bytes
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
                if not isinstance(head, Refusal):  # TOO_LARGE
                    head = Refusal(431, f"request head larger than {max_head} bytes")
                await close_with(stream, _refused(head))
                return
            idle = False
            self._waiting.pop(timer, None)
            timer.deadline = math.inf
            start, end = head.body_start, head.body_start + head.body_length
            ticket: Ticket | None = None
            body: bytes | bytearray
            if not head.chunked and head.body_length <= max_body and len(buffer) >= end:
                body, buffer = buffer[start:end], buffer[end:]  # the usual: all here
            else:
                read = await self._body(stream, buffer, head, timer)
                if read is None:
                    return
                body, buffer, ticket = read
                del read  # `del body` below frees it
            try:  # the body's ticket is held until its answer has gone
                method = head.method.decode("ascii")
                reserved = ticket.size - len(body) if ticket is not None else 0
                response = await self._call(method, head, body, peer, timer, reserved)
                del body
                close = head.close or self._closing
                reply = b"" if method == "HEAD" else response.body
                out = response_bytes(
                    response.status, response.headers, reply, close, head.version == b"1.0"
                )
                del response, reply
                await self._write(stream, out, timer)
                del out
            finally:
                if ticket is not None:
                    ticket.release()
            if close:
                return
            idle = True
            self._waiting[timer] = None

    async def _call(
        self,
        method: str,
        head: Head,
        body: bytes | bytearray,
        peer: Peer,
        timer: trio.CancelScope,
        reserved: int,
    ) -> Response:
        """The door's answer, the connection (by its timer) counted as in a call: a
        graceful stop's cut ends it, and `_serve_connection` answers 503. `reserved`
        is what the body's ticket holds beyond the body (`RestDoor.body_reservation`)."""
        self._calls.add(timer)
        try:
            path = _path(head.target)
            return await self._door.respond(method, path, head.headers, body, peer, reserved)
        finally:
            self._calls.discard(timer)

    async def _body(
        self, stream: trio.abc.Stream, buffer: bytes, head: Head, timer: trio.CancelScope
    ) -> tuple[bytes | bytearray, bytes, Ticket | None] | None:
        """The body of `head` (`buffer` may hold its start), the bytes after it, and
        the upload budget ticket that holds it (the caller releases it once the answer
        has gone); None if it was refused (answered, the connection closing) or the
        client went first.

        A body not all here waits for an upload budget ticket before more is read: a
        Content-Length body asks for what the door says it will cost
        (`RestDoor.body_reservation`: an all-JSON infer body twice its length). A
        chunked body declares no size, and tickets asked for as chunks announce sizes
        would break the budget's rule that a granted body can always finish (two
        half-sent bodies could each wait for the other's grant): it asks for
        `max_body_bytes`, the most it can be, so it waits longer on a busy budget."""
        max_body = self._door.max_body_bytes
        decoder = None
        if head.chunked:
            decoder = ChunkedBody(max_body, self._limits.max_header_list_bytes)
            refusal = decoder.feed(buffer[head.body_start :])
            if decoder.done:
                return decoder.body(), decoder.rest, None
            size = max_body
        else:
            refusal = Refusal(413, too_large(max_body)) if head.body_length > max_body else None
            path = _path(head.target)
            size = self._door.body_reservation(path, head.headers, head.body_length)
        if refusal is not None:
            await close_with(stream, _refused(refusal))
            return None
        ticket = await self._reserve(stream, size)
        if ticket is None:
            return None
        read: tuple[bytes | bytearray, bytes] | None = None
        try:
            if head.expect_continue and len(buffer) == head.body_start:
                await stream.send_all(CONTINUE)  # the client waits for it to send the body
            if decoder is None:
                read = await self._rest_of_body(stream, buffer, head, timer)
                return None if read is None else (*read, ticket)
            while not decoder.done:  # a body that stalls for header_seconds ends it all
                timer.deadline = trio.current_time() + self._limits.header_seconds
                data = await stream.receive_some(RECEIVE_BYTES)
                if not data:
                    return None
                refusal = decoder.feed(bytes(data))
                if refusal is not None:
                    await close_with(stream, _refused(refusal))
                    return None
            timer.deadline = math.inf
            read = decoder.body(), decoder.rest
            return (*read, ticket)
        finally:
            if read is None:
                ticket.release()

    async def _reserve(self, stream: trio.abc.Stream, size: int) -> Ticket | None:
        """A granted ticket for a body of `size` bytes still arriving, waited for while
        the budget is spent (the client waits in TCP's flow control, as nothing more
        is read); None: refused, answered 429 and the connection closed."""
        budget = self._uploads
        granted = trio.Event()
        share = Share(self._limits.max_buffered_bytes)
        ticket = budget.request(size, share, lambda _: granted.set())
        if ticket is None:
            await close_with(stream, _refused(Refusal(429, unfinished_refusal(size, budget))))
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
    ) -> tuple[bytearray, bytes] | None:
        """The body that `buffer` holds the start of, and the bytes after it; None if
        the client closes first. A body that stalls for `header_seconds` ends its
        connection. Read into one buffer of its length: no pieces joined (a copy)."""
        need = head.body_length
        body = bytearray(need)
        first = buffer[head.body_start : head.body_start + need]
        body[: len(first)] = first
        have = len(first)
        rest = b""
        while have < need:
            timer.deadline = trio.current_time() + self._limits.header_seconds
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                return None
            taken = min(len(data), need - have)
            body[have : have + taken] = data[:taken]
            have += taken
            rest = bytes(data[taken:])
        timer.deadline = math.inf
        return body, rest

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


def _refused(refusal: Refusal) -> bytes:
    """The answer to `refusal`, with `Connection: close`."""
    error = error_response(refusal.status, refusal.message)
    return response_bytes(refusal.status, error.headers, error.body, True)


_SHUTTING_DOWN = _refused(
    Refusal(503, "server shutting down: the call did not finish within the drain")
)


def _path(target: bytes) -> str:
    """The request target's path, percent-decoded, as ASGI's `scope["path"]` is."""
    path = target.partition(b"?")[0]
    if b"%" in path:
        path = unquote_to_bytes(path)
    return path.decode("utf-8", "replace")
