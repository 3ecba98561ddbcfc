"""The gRPC server shell: a listener, and per connection a thin loop over its core.

Theory of operation. Each accepted stream gets a `ServerConnection` (the sans-IO
core, which owns every call's state) and a `Transport` (which reads into it and
writes out of it). This module only decides what to run: a call whose path has
no handler is answered UNIMPLEMENTED; a unary call's handler starts once the
client has sent its one message and half-closed, in the connection's nursery,
under a cancel scope carrying the call's deadline; a call that ends before its
handler does (the client reset it, the connection died) has its scope cancelled.

Handlers are `async def handler(request: bytes, call: CallContext) -> bytes`,
registered by full method path. They raise any `RsgwError` to fail a call with
its status (`GrpcError` to choose one); any other exception becomes INTERNAL.
Streaming handlers take a `ServerStream`, fed by the same `MessageReceived` /
`HalfClosed` events.

Compression (gzip, deflate): a handler sees its request decompressed, unless its
path is one of `raw_paths` (a pass-through), which gets a compressed request as it
came (`rsgw.grpc._compression.Compressed`) and may answer with a compressed
reply; a large request on such a path may also come `Gathered` (in the pieces it
arrived in, `rsgw.grpc._framing`), and the reply may be one. A reply goes out
compressed only in an encoding the client accepts: a compressed reply it does not
accept is decompressed, and with `response_encoding` set, a plain reply is
compressed when the client accepts that encoding. Streamed messages are
decompressed as the handler reads them and sent as they are given.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial

import outcome
import trio

from rsgw._call import CallContext, UnaryHandler
from rsgw._errors import GrpcError, RsgwError, shown
from rsgw._net import TCP, Network
from rsgw._peer import peer_of
from rsgw._process import give_back_memory
from rsgw._status import StatusCode
from rsgw._tls import ServerTls, peer_identity
from rsgw.grpc._calls import (
    CallEnded,
    CallStarted,
    ConnectionTerminated,
    EndCause,
    Event,
    HalfClosed,
    MessageReceived,
    OutboxDrained,
)
from rsgw.grpc._compression import Compressed, compress, decompress
from rsgw.grpc._connection import ConnectionState
from rsgw.grpc._framing import DEFAULT_MAX_MESSAGE_BYTES, joined
from rsgw.grpc._h2 import DEFAULT_MAX_FRAME_BYTES, DEFAULT_WINDOW_BYTES
from rsgw.grpc._intake import Intake
from rsgw.grpc._limits import ConnectionLimits, StreamShare
from rsgw.grpc._server_connection import ServerConnection
from rsgw.grpc._streams import ServerStream, StreamHandler
from rsgw.grpc._transport import RECEIVE_BYTES, Transport

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENT_STREAMS = 1024
#: How long a graceful stop waits for idle clients to hang up after GOAWAY.
LINGER_SECONDS = 1.0
#: How long a graceful stop lets calls in flight finish.
DEFAULT_GRACE_SECONDS = 5.0
#: accept() failures that mean "out of a resource for now", not "the listener is
#: broken": the same ones trio's `serve_listeners` sleeps on and retries.
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY_SECONDS = 0.1
#: How often every connection's timers and flood budget are looked at.
SWEEP_SECONDS = 1.0
#: A connection whose bytes complete no frame for `header_seconds` is a slowloris
#: unless they came at least this fast (a slow link sending one big frame).
SLOW_BYTES_PER_SECOND = 1024
#: Handler tasks a connection keeps between unary calls (`_run_unaries`).
IDLE_RUNNERS = 64


@dataclass(slots=True, eq=False)
class _Pending:
    """A call this connection serves: its handler, what it received, its cancel scope.

    A unary call collects its one message in `messages` and runs once the client
    half-closes; a streaming call (`stream` set) runs at once and is fed as it goes.
    """

    handler: UnaryHandler | None
    call: CallContext
    #: The handler takes compressed requests as they came (a pass-through).
    raw: bool = False
    #: The method's own time limit (`GrpcServer(timeouts=)`), if it has one.
    timeout: float | None = None
    messages: list[bytes] = field(default_factory=list)
    stream: ServerStream | None = None
    scope: trio.CancelScope | None = None
    ended: bool = False
    #: Why the server cut the call short (it was still running when the drain ended).
    abandoned: str = ""


class GrpcServer:
    """A gRPC server for unary methods over raw bytes.

    Args:
        handlers: full method path (`/package.Service/Method`) to handler.
        stream_handlers: the same, for streaming methods (see `ServerStream`).
        on_refused: called with (path, status) for each call refused before any
            handler ran, so a service can count those too.
        max_receive_message_bytes: larger request messages fail their own call
            with RESOURCE_EXHAUSTED; other calls on the connection go on.
        max_send_message_bytes: larger responses fail with RESOURCE_EXHAUSTED.
        raw_paths: unary methods whose handlers take compressed requests as they
            came and may answer compressed (see the module docstring).
        timeouts: unary methods' own time limits, in seconds from when the handler
            starts: a call whose client set no sooner deadline is cut short then
            (DEADLINE_EXCEEDED, or what `CallContext.limit` chose).
        response_encoding: compress unary replies in this encoding where the client
            accepts it (None: never compress a reply ourselves).
        limits: what one client connection may cost (`ConnectionLimits`): header
            size, buffered bytes, flood budget, idle and slow-header timeouts, and
            the number of connections served at once.
        max_running_calls: with this many calls running, stop reading from every
            connection until some finish (0: never stop). Work the server cannot do
            now then waits in the clients, where a deadline that passes costs the
            server nothing, instead of being read, parsed and refused.

    Serve with `await nursery.start(server.serve, host, port)`, which returns the
    bound port once the socket listens, or `serve_listener` on any Trio listener.
    `aclose()` stops gracefully: no new connections, GOAWAY to every client,
    calls in flight get `grace` seconds.
    """

    def __init__(
        self,
        handlers: Mapping[str, UnaryHandler],
        *,
        stream_handlers: Mapping[str, StreamHandler] | None = None,
        on_refused: Callable[[bytes, StatusCode], None] | None = None,
        max_receive_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_send_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        raw_paths: Collection[str] = (),
        timeouts: Mapping[str, float] | None = None,
        response_encoding: type[Compressed] | None = None,
        limits: ConnectionLimits | None = None,
        max_running_calls: int = 0,
        tls: ServerTls | None = None,
    ) -> None:
        self._handlers = {path.encode(): handler for path, handler in handlers.items()}
        self._raw_paths = frozenset(path.encode() for path in raw_paths)
        self._timeouts = {path.encode(): seconds for path, seconds in (timeouts or {}).items()}
        self.response_encoding = response_encoding
        self._stream_handlers = {
            path.encode(): handler for path, handler in (stream_handlers or {}).items()
        }
        #: Told of every call refused before a handler ran (path, status): an unknown
        #: method, a malformed or oversized request. Handlers count their own calls.
        self.on_refused = on_refused
        self.max_receive_message_bytes = max_receive_message_bytes
        self.max_send_message_bytes = max_send_message_bytes
        self._max_concurrent_streams = max_concurrent_streams
        self._window_bytes = window_bytes
        self._max_frame_bytes = max_frame_bytes
        self._connections: set[_ServerConnection] = set()
        #: One per listener: cancelled when the server starts closing.
        self._accepting: set[trio.CancelScope] = set()
        self._closing = False
        self._closed = trio.Event()
        self._accept_warned_at = -math.inf
        self.limits = ConnectionLimits() if limits is None else limits
        cap = self.limits.max_connections
        self._connection_slots = trio.Semaphore(cap) if cap > 0 else None
        self._sweeping = False
        self.intake = Intake(max_running_calls)
        self.tls = tls
        self._share: StreamShare | None = None
        if max_running_calls:
            self._share = StreamShare(max_running_calls, max_concurrent_streams)
            self.intake.on_full = self._saturated

    async def serve(
        self,
        host: str,
        port: int,
        *,
        network: Network = TCP,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on `host:port`, report the bound port, serve until cancelled or closed.

        Raises:
            ListenError: the address is busy or cannot be bound.
        """
        listener, bound = network.listen(host, port)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.serve_listener, listener)
            task_status.started(bound)

    async def serve_listener(
        self,
        listener: trio.abc.Listener[trio.abc.Stream],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve every connection `listener` accepts until cancelled or `aclose()`d."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._accept_loop, listener, nursery)
                if not self._sweeping:
                    self._sweeping = True
                    nursery.start_soon(self._sweep)
                task_status.started()
                await self._closed.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()

    async def _accept_loop(
        self, listener: trio.abc.Listener[trio.abc.Stream], nursery: trio.Nursery
    ) -> None:
        try:
            with trio.CancelScope() as accepting:
                self._accepting.add(accepting)
                if self._closing:
                    accepting.cancel()
                while True:
                    slots = self._connection_slots
                    if slots is not None:
                        await slots.acquire()  # at the cap: new clients wait in the backlog
                    try:
                        stream = await listener.accept()
                    except BaseException as exc:
                        if slots is not None:
                            slots.release()
                        if not isinstance(exc, OSError) or exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                            raise
                        self._accept_failed(exc)
                        await trio.sleep(ACCEPT_RETRY_SECONDS)
                        continue
                    nursery.start_soon(self._serve_connection, stream)
        finally:
            # Closing, or cancelled: the listening socket goes now, so new connections
            # are refused (and a client or balancer tries elsewhere) rather than left
            # in the backlog while the open ones finish (they may linger a second).
            with trio.CancelScope(shield=True):
                await listener.aclose()

    def _accept_failed(self, exc: OSError) -> None:
        """Out of file descriptors or memory: say so (at most every 10 s), keep serving."""
        now = trio.current_time()
        if now - self._accept_warned_at >= 10.0:
            self._accept_warned_at = now
            logger.warning(
                "cannot accept a connection now; retrying",
                extra={"error": exc.strerror or str(exc), "connections": len(self._connections)},
            )

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        try:
            # Nothing is set up until the client speaks: a connection that never does
            # (a port scan, a flood of idle sockets) costs a socket and a waiting task.
            first = b""
            with trio.move_on_after(self.limits.header_seconds):
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    if self.tls is not None:
                        stream = await self.tls.accept(stream)
                    first = bytes(await stream.receive_some(RECEIVE_BYTES))
            if first:
                await self._serve_client(stream, first)
        finally:
            if self._connection_slots is not None:
                self._connection_slots.release()
            with trio.CancelScope(shield=True), trio.move_on_after(LINGER_SECONDS):
                await stream.aclose()

    async def _serve_client(self, stream: trio.abc.Stream, first: bytes) -> None:
        connection = _ServerConnection(self, stream)
        self._connections.add(connection)
        if self._closing:
            connection.go_away()
        try:
            await connection.run(first)
        finally:
            connection.quiet.set()
            connection.ended.set()
            self._connections.discard(connection)

    async def _sweep(self) -> None:
        """Every `SWEEP_SECONDS`: refill flood budgets, close idle and stuck connections."""
        while True:
            await trio.sleep(SWEEP_SECONDS)
            now = trio.current_time()
            for connection in list(self._connections):
                connection.sweep(now)
            if self.tls is not None:
                self.tls.reload_if_changed()
            if self._share is not None:
                limit = self._share.sample(now, self.intake.running, self._busy_connections())
                if limit is not None:
                    self._limit_streams(limit)
            give_back_memory()  # what a burst of large messages grew, back to the kernel

    def _saturated(self) -> None:
        """The running-call cap was reached: hold busy connections to their share.

        Once sharing, the sweep adjusts the shares; this stays out of the hot path.
        """
        assert self._share is not None
        if not self._share.sharing:
            limit = self._share.saturated(self._busy_connections())
            if limit is not None:
                self._limit_streams(limit)

    def _busy_connections(self) -> int:
        return sum(1 for c in self._connections if c.connection.active_calls)

    def _limit_streams(self, limit: int) -> None:
        for connection in self._connections:
            connection.connection.limit_streams(limit)
            connection.transport.flush()

    @property
    def closing(self) -> bool:
        """True from the moment `aclose()` starts."""
        return self._closing

    def resize(self, max_running_calls: int) -> None:
        """A new running-call cap (the gateway's workers changed). A server built
        without one stays without one."""
        if self._share is None:
            return
        self.intake.resize(max_running_calls)
        self._share.resize(max_running_calls)

    async def aclose(self, grace: float = DEFAULT_GRACE_SECONDS) -> int:
        """Stop accepting, send GOAWAY, let calls in flight finish within `grace`.

        The listening sockets close at once. Calls still running when `grace` is up
        end UNAVAILABLE saying the server is shutting down (a client may retry
        that elsewhere), not with a torn connection. Returns how many were cut
        short that way.
        """
        if self._closing:
            await self._closed.wait()
            return 0
        self._closing = True
        for accepting in self._accepting:
            accepting.cancel()
        for connection in list(self._connections):
            connection.go_away()
        with trio.move_on_after(grace):
            for connection in list(self._connections):
                await connection.quiet.wait()
        reason = f"server shutting down: the call did not finish within the {grace:g} s drain"
        cut = sum(connection.abandon(reason) for connection in list(self._connections))
        # Lingering close: let each client hang up first. Closing a socket with
        # unread input makes the kernel send a reset, which can destroy the last
        # answers still on their way to the client.
        with trio.move_on_after(LINGER_SECONDS):
            for connection in list(self._connections):
                await connection.ended.wait()
        self._closed.set()
        return cut

    @property
    def stream_limit(self) -> int:
        """The calls a client connection may have open now (its share while saturated)."""
        return self._max_concurrent_streams if self._share is None else self._share.current

    def lookup(self, path: bytes) -> UnaryHandler | None:
        return self._handlers.get(path)

    def stream_lookup(self, path: bytes) -> StreamHandler | None:
        return self._stream_handlers.get(path)


class _ServerConnection:
    """One connection: the core, its transport, and the calls it runs handlers for."""

    def __init__(self, server: GrpcServer, stream: trio.abc.Stream) -> None:
        self._server = server
        self.connection = ServerConnection(
            limits=server.limits,
            gather_paths=server._raw_paths,
            max_receive_message_bytes=server.max_receive_message_bytes,
            max_send_message_bytes=server.max_send_message_bytes,
            window_bytes=server._window_bytes,
            max_frame_bytes=server._max_frame_bytes,
            max_concurrent_streams=server.stream_limit,
        )
        self.transport = Transport(self.connection, stream)
        self.transport.after_write = self._after_write
        if server.intake.limit:
            self.transport.intake = server.intake
        self._client = peer_of(stream, peer_identity(stream))
        self._peer = self._client.address
        self._calls: dict[int, _Pending] = {}
        self._nursery: trio.Nursery | None = None
        #: Handler tasks waiting for the next unary call (`_run_unaries`).
        self._idle_runners: list[trio.lowlevel.Task] = []
        #: Set once GOAWAY has left and no call is in flight.
        self.quiet = trio.Event()
        #: Set when the connection is over (the client hung up, or we closed it).
        self.ended = trio.Event()
        now = trio.current_time()
        #: The sweep's view: when it last saw frames (or calls), and bytes without them.
        self._active_at = self._refilled_at = now
        self._frames_seen = 0
        self._stuck_since: float | None = None
        self._stuck_bytes = 0

    def sweep(self, now: float) -> None:
        """The server's periodic look (see `ConnectionLimits`): refill, idle, slowloris."""
        limits = self._server.limits
        core = self.connection
        if now - self._refilled_at >= limits.refill_seconds:
            core.guard.refill()
            self._refilled_at = now
        if core.frames != self._frames_seen or core.active_calls:
            self._frames_seen = core.frames
            self._active_at = now
            self._stuck_since = None
            return
        received = self.transport.received_bytes
        if core.frames == 0 or received != self._stuck_bytes:  # bytes, but no frame from them
            if self._stuck_since is None:
                self._stuck_since, self._stuck_bytes = now, received
            stuck_for = now - self._stuck_since
            slow = received - self._stuck_bytes < SLOW_BYTES_PER_SECOND * stuck_for
            if stuck_for >= limits.header_seconds and slow:
                what = "no HTTP/2 preface" if core.frames == 0 else "bytes that complete no frame"
                self.close(f"sent {what} for {stuck_for:.0f} s")
                return
        if limits.idle_seconds and now - self._active_at >= limits.idle_seconds:
            self.close(f"idle for {now - self._active_at:.0f} s")

    def close(self, reason: str) -> None:
        """End the connection now: GOAWAY (what h2 can still send), then hang up."""
        logger.debug("closing a client connection", extra={"peer": self._peer, "why": reason})
        for event in self.connection.close(reason):
            self._dispatch(event)
        if self._nursery is not None:
            self._nursery.start_soon(self._hang_up)

    async def _hang_up(self) -> None:
        with trio.move_on_after(LINGER_SECONDS):
            await self.transport.flushed()
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    def go_away(self) -> None:
        """Take no new calls; GOAWAY follows the last answer (see `ServerConnection`)."""
        self.connection.go_away()
        self.transport.flush()

    def abandon(self, reason: str) -> int:
        """End every call still open with UNAVAILABLE `reason`; how many there were.

        A running handler is cancelled and answers `reason`; a call still receiving
        its request is refused with it at once.
        """
        error = GrpcError(StatusCode.UNAVAILABLE, reason)
        calls = list(self._calls.items())
        for stream_id, pending in calls:
            if pending.scope is not None:
                pending.abandoned = reason
                pending.scope.cancel()
            else:
                del self._calls[stream_id]
                self.connection.reject(stream_id, error)
        self.transport.flush()
        return len(calls)

    def _after_write(self) -> None:
        if self.connection.state is ConnectionState.CLOSED:
            self.quiet.set()  # the GOAWAY has left too

    async def run(self, first: bytes = b"") -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.transport.run(self._dispatch, first)
            nursery.cancel_scope.cancel()

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, MessageReceived):
            pending = self._calls.get(event.stream_id)
            if pending is not None:
                if pending.stream is not None:
                    pending.stream.deliver(event.message)
                else:
                    pending.messages.append(event.message)
        elif isinstance(event, CallStarted):
            self._on_started(event)
        elif isinstance(event, HalfClosed):
            self._on_half_closed(event.stream_id)
        elif isinstance(event, CallEnded):
            pending = self._calls.pop(event.stream_id, None)
            if pending is not None:
                pending.ended = True
                if pending.scope is not None:
                    pending.scope.cancel()
                elif event.cause is EndCause.FAILED and event.error is not None:
                    self._refused(pending.call.path.encode(), event.error.code)
        elif isinstance(event, OutboxDrained):
            pending = self._calls.get(event.stream_id)
            if pending is not None and pending.stream is not None:
                pending.stream.drained()
        elif isinstance(event, ConnectionTerminated):
            self.go_away()  # the client opens no more calls; finish these, then hang up

    def _on_started(self, event: CallStarted) -> None:
        head = event.head
        handler = self._server.lookup(head.path)
        stream_handler = None if handler else self._server.stream_lookup(head.path)
        if handler is None and stream_handler is None:
            error = GrpcError(StatusCode.UNIMPLEMENTED, f"unknown method {shown(head.path)}")
            self.connection.reject(event.stream_id, error)
            self._refused(head.path, error.code)
            return
        deadline = math.inf if head.timeout is None else trio.current_time() + head.timeout
        call = CallContext(
            head.path.decode(),
            deadline,
            head.metadata,
            self._peer,
            accept=head.accept,
            client=self._client,
        )
        if stream_handler is None:
            server = self._server
            self._calls[event.stream_id] = _Pending(
                handler, call, head.path in server._raw_paths, server._timeouts.get(head.path)
            )
            return
        stream = ServerStream(
            call, partial(self._send, event.stream_id), self._server.max_receive_message_bytes
        )
        pending = self._calls[event.stream_id] = _Pending(None, call, stream=stream)
        assert self._nursery is not None
        self._nursery.start_soon(self._run_stream, event.stream_id, pending, stream_handler)

    def _on_half_closed(self, stream_id: int) -> None:
        pending = self._calls.get(stream_id)
        if pending is None:
            return
        if pending.stream is not None:
            pending.stream.half_closed()
            return
        if len(pending.messages) != 1:
            del self._calls[stream_id]
            error = GrpcError(
                StatusCode.INTERNAL,
                f"unary call expects one request message, got {len(pending.messages)}",
            )
            self.connection.reject(stream_id, error)
            self._refused(pending.call.path.encode(), error.code)
            return
        assert self._nursery is not None
        self._server.intake.started()
        if self._idle_runners:
            handover = outcome.Value((stream_id, pending))
            trio.lowlevel.reschedule(self._idle_runners.pop(), handover)
        else:
            self._nursery.start_soon(self._run_unaries, stream_id, pending)

    async def _run_unaries(self, stream_id: int, pending: _Pending) -> None:
        """Run this unary call, then those `_on_half_closed` hands over while we wait.

        A task per call cost more than a small call's routing; a task kept between
        calls costs a wake-up. So does a cancel scope per call: the calls share one,
        which takes each call's deadline when it starts (and keeps it until the next
        one, so a method with a time limit costs one deadline setter per call), and
        which only a call that must end early cancels (its deadline, its client's
        reset, the drain); that call is answered and the next one gets a new scope.
        At most `IDLE_RUNNERS` tasks wait; the connection's end cancels them.
        """
        task = trio.lowlevel.current_task()
        idle = self._idle_runners

        def give_up(_: object) -> trio.lowlevel.Abort:
            idle.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        async def next_call() -> tuple[int, _Pending] | None:
            """Wait to be handed a call; None when enough tasks wait already."""
            if len(idle) >= IDLE_RUNNERS:
                return None
            idle.append(task)
            call: tuple[int, _Pending] = await trio.lowlevel.wait_task_rescheduled(give_up)
            return call

        handed: tuple[int, _Pending] | None = (stream_id, pending)
        while handed is not None:
            running: _Pending | None = None
            with trio.CancelScope() as scope:
                # A scope cancelled after a call was handed over, before this task ran
                # (the last call's kept deadline passing just then), must not cut that
                # call short: it goes to a fresh scope.
                while handed is not None and not scope.cancel_called:
                    stream_id, running = handed
                    handed = None
                    await self._run_unary(stream_id, running, scope)
                    running = None
                    if (handed := await next_call()) is None:
                        return
            # Cancelled for the call it ran: answer it. (A cancel that came too late to
            # stop the call it was meant for, or the last call's deadline passing, ends
            # an idle wait instead: nothing to answer.)
            if running is not None:
                self._answer(stream_id, running, None, *_cut_short(running))
            if handed is None:
                handed = await next_call()

    async def _run_unary(self, stream_id: int, pending: _Pending, scope: trio.CancelScope) -> None:
        """Run one call's handler under `scope` and answer it; `trio.Cancelled` (the
        scope's, for this call) leaves unanswered: `_run_unaries` answers it."""
        # Counted from the handover (`_on_half_closed`) to here, for the server's intake.
        call = pending.call
        code = StatusCode.OK
        message = ""
        response: bytes | None = None
        assert pending.handler is not None
        pending.scope = call.scope = scope
        if pending.timeout is not None:  # the method's own limit, if it is sooner
            call.deadline = min(call.deadline, trio.current_time() + pending.timeout)
        # The scope still holds the last call's deadline (not reset after each call: a
        # method with a time limit then costs one setter per call, not two).
        if scope.deadline != call.deadline:
            scope.deadline = call.deadline
        try:
            request = pending.messages.pop()
            if type(request) is not bytes and not pending.raw:
                request = decompress(request, self._server.max_receive_message_bytes)  # type: ignore[arg-type]  # not bytes: Compressed
            response = await pending.handler(request, call)
            if type(response) is not bytes or self._server.response_encoding is not None:
                response = self._recode(response, call)
        except Exception as exc:
            code, message = _failed(call, exc, "handler")
        finally:
            self._server.intake.ended()
            pending.scope = call.scope = None
        self._answer(stream_id, pending, response, code, message)

    def _answer(
        self,
        stream_id: int,
        pending: _Pending,
        response: bytes | None,
        code: StatusCode,
        message: str,
    ) -> None:
        if pending.ended:
            return  # the client reset the call, or the connection died
        self._calls.pop(stream_id, None)
        self.connection.send_response(stream_id, response, code, message, pending.call.trailers)
        self.transport.flush()

    async def _run_stream(self, stream_id: int, pending: _Pending, handler: StreamHandler) -> None:
        call = pending.call
        assert pending.stream is not None
        code = StatusCode.OK
        message = ""
        with trio.CancelScope(deadline=call.deadline) as scope:
            pending.scope = call.scope = scope
            try:
                await handler(pending.stream)
            except Exception as exc:
                code, message = _failed(call, exc, "stream handler")
        pending.scope = call.scope = None
        if pending.ended:
            return
        self._calls.pop(stream_id, None)
        if scope.cancelled_caught:
            code, message = _cut_short(pending)
        self.connection.end_call(stream_id, code, message, call.trailers)
        self.transport.flush()

    def _recode(self, response: bytes, call: CallContext) -> bytes:
        """A reply the client can read: compressed only in an encoding it accepts."""
        if isinstance(response, Compressed):
            if response.encoding in call.accept:
                return response
            return decompress(response, self._server.max_send_message_bytes)
        encoding = self._server.response_encoding
        if encoding is not None and encoding.encoding in call.accept:
            return compress(joined(response), encoding)
        return response

    def _refused(self, path: bytes, code: StatusCode) -> None:
        if self._server.on_refused is not None:
            self._server.on_refused(path, code)

    def _send(self, stream_id: int, message: bytes) -> bool:
        fits = self.connection.send_message(stream_id, message)
        self.transport.flush()
        return fits


def _failed(call: CallContext, exc: Exception, what: str) -> tuple[StatusCode, str]:
    """The status a handler's exception answers: an `RsgwError`'s own (its trailers
    added to the call's), anything else INTERNAL, logged as the bug it is."""
    if isinstance(exc, RsgwError):
        if exc.trailers:
            call.trailers = call.trailers + exc.trailers
        return exc.code, exc.message
    logger.exception("%s for %s failed", what, call.path)
    return StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"


def _cut_short(pending: _Pending) -> tuple[StatusCode, str]:
    """The status of a call whose handler was cancelled: its deadline, or the drain's end."""
    if pending.abandoned:
        return StatusCode.UNAVAILABLE, pending.abandoned
    if pending.call.expired is not None:
        error = pending.call.expired()
        return error.code, error.message
    return StatusCode.DEADLINE_EXCEEDED, "deadline exceeded"
