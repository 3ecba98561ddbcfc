"""The gRPC server shell: a listener, and per connection a thin loop over its core.

Theory of operation. `GrpcServer` listens, accepts, and gives each accepted stream
a `ServedConnection` (`rsgw.grpc._serving`), which dispatches its calls and runs
their handlers (`rsgw.grpc._handling`, which also says what a handler is and how
compression goes). This module holds what spans connections: the accept loop
(which waits out a shortage of file descriptors, and caps the connections served
at once), the periodic sweep of every connection (flood budgets, idle and stuck
clients, the running-call share, a certificate reloaded), and the graceful stop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping

import trio

from rsgw.base._call import PassThrough, TimeLimits, UnaryHandler
from rsgw.base._limits import ConnectionLimits, StreamShare
from rsgw.base._status import StatusCode
from rsgw.base._uploads import UploadBudget
from rsgw.grpc._intake import Intake
from rsgw.grpc._serving import LINGER_SECONDS, ServedConnection
from rsgw.grpc._streams import StreamHandler
from rsgw.grpc._transport import RECEIVE_BYTES
from rsgw.grpc.protocol._compression import Compressed
from rsgw.grpc.protocol._framing import DEFAULT_MAX_MESSAGE_BYTES
from rsgw.http2._h2 import DEFAULT_MAX_FRAME_BYTES, DEFAULT_WINDOW_BYTES
from rsgw.runtime._net import TCP, Acceptor, Network
from rsgw.runtime._process import give_back_memory
from rsgw.runtime._tls import ServerTls

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENT_STREAMS = 1024
#: How long a graceful stop lets calls in flight finish.
DEFAULT_GRACE_SECONDS = 5.0
#: How often every connection's timers and flood budget are looked at.
SWEEP_SECONDS = 1.0


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
        pass_through: unary methods whose handlers take requests as they came
            (compressed, or gathered if large) and may answer likewise (see
            `rsgw.grpc._handling`).
        time_limits: unary methods' own time limits, in seconds from when the handler
            starts: a call whose client set no sooner deadline is cut short then
            (DEADLINE_EXCEEDED, or what `CallContext.limit` chose).
        response_encoding: compress unary replies in this encoding where the client
            accepts it (None: never compress a reply ourselves).
        limits: what one client connection may cost (`ConnectionLimits`): header
            size, buffered bytes, flood budget, idle and slow-header timeouts, and
            the number of connections served at once.
        upload_budget: the unfinished request bytes every connection shares
            (`rsgw.base._uploads`): a large message waits for its grant in the client's
            flow control. None: each connection bounded alone (`limits`).
        window_bytes / connection_window_bytes: HTTP/2 receive windows, each stream's
            and the connection's (default: the stream's size). With an upload
            budget, the stream window is what a call sends before its grant.
        max_running_calls: with this many calls running, stop reading from every
            connection until some finish (0: never stop). Work the server cannot do
            now then waits in the clients, where a deadline that passes costs the
            server nothing, instead of being read, parsed and refused.
        intake: the running-call cap as an object built beforehand (its limit is then
            `max_running_calls`'s), for an owner that resizes it before the server
            exists: the gateway, whose cap follows its workers.

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
        pass_through: Mapping[str, PassThrough] | None = None,
        time_limits: TimeLimits | None = None,
        response_encoding: type[Compressed] | None = None,
        limits: ConnectionLimits | None = None,
        max_running_calls: int = 0,
        tls: ServerTls | None = None,
        upload_budget: UploadBudget | None = None,
        connection_window_bytes: int | None = None,
        intake: Intake | None = None,
    ) -> None:
        self._handlers = {path.encode(): handler for path, handler in handlers.items()}
        self._pass_through = {
            path.encode(): handler for path, handler in (pass_through or {}).items()
        }
        #: The pass-through paths, whose large requests arrive gathered.
        self.raw_paths = frozenset(self._pass_through)
        self.time_limits = {path.encode(): seconds for path, seconds in (time_limits or {}).items()}
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
        self.window_bytes = window_bytes
        self.connection_window_bytes = connection_window_bytes
        self.upload_budget = upload_budget
        self.max_frame_bytes = max_frame_bytes
        self._connections: set[ServedConnection] = set()
        #: One per listener: cancelled when the server starts closing.
        self._accepting: set[trio.CancelScope] = set()
        self._closing = False
        self._closed = trio.Event()
        self.limits = ConnectionLimits() if limits is None else limits
        self._acceptor = Acceptor(self.limits.max_connections, lambda: len(self._connections))
        self._sweeping = False
        self.intake = Intake(max_running_calls) if intake is None else intake
        self.tls = tls
        self._share: StreamShare | None = None
        if self.intake.limit:
            self._share = StreamShare(self.intake.limit, max_concurrent_streams)
            self.intake.on_full = self._saturated
            self.intake.on_resize = self._share.resize

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
                await self._acceptor.run(listener, self._serve_connection, nursery)
        finally:
            # Closing, or cancelled: the listening socket goes now, so new connections
            # are refused (and a client or balancer tries elsewhere) rather than left
            # in the backlog while the open ones finish (they may linger a second).
            with trio.CancelScope(shield=True):
                await listener.aclose()

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
            self._acceptor.release()
            with trio.CancelScope(shield=True), trio.move_on_after(LINGER_SECONDS):
                await stream.aclose()

    async def _serve_client(self, stream: trio.abc.Stream, first: bytes) -> None:
        connection = ServedConnection(self, stream)
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
        self.intake.resize(max_running_calls)  # the share follows (`on_resize`)

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

    def pass_through_lookup(self, path: bytes) -> PassThrough | None:
        return self._pass_through.get(path)

    def stream_lookup(self, path: bytes) -> StreamHandler | None:
        return self._stream_handlers.get(path)
