"""The gRPC server shell: HTTP/2 (h2) on Trio, unary handlers over raw bytes.

Theory of operation. One task per connection reads the socket and feeds h2; the
events it gets back drive a small per-stream state machine (`_Stream`). A unary
call's handler starts when the client half-closes its stream with exactly one
message, and runs in the connection's nursery under a cancel scope that carries
the call's deadline; a RST_STREAM from the client cancels that scope. One writer
task per connection owns the socket's send side: everyone else only changes h2's
state and asks for a flush, so many calls finishing together leave in one write.

Invariants:
- Only the writer task awaits `send_all`; everything else is synchronous h2 work.
- Every DATA byte received is acknowledged at once (flow control), also for a
  stream we have already answered, so one bad call never starves the connection.
- A call ends exactly once: trailers, or a reset, never both.

Handlers are `async def handler(request: bytes, call: ServerCall) -> bytes`,
registered by full method path. They raise `GrpcError` (or any `RsgwError`, which
carries its own status) to fail a call; any other exception becomes INTERNAL.
Streaming calls will get their own handler kind beside `UnaryHandler`; the stream
object already separates receiving messages from running the handler.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import h2.errors
import h2.events
import h2.exceptions
import trio

from rsgw._errors import RsgwError
from rsgw._net import bind_tcp, bound_port
from rsgw._status import GrpcError, StatusCode
from rsgw.grpc._framing import DEFAULT_MAX_MESSAGE_BYTES, MessageDecoder, too_large
from rsgw.grpc._metadata import (
    RESPONSE_HEADERS,
    HeaderBlock,
    parse_request_headers,
    status_trailers,
    trailers_only,
)
from rsgw.grpc._transport import (
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_WINDOW_BYTES,
    RECEIVE_BYTES,
    H2Transport,
    new_h2_connection,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENT_STREAMS = 1024
#: How long a graceful stop waits for idle clients to hang up after GOAWAY.
LINGER_SECONDS = 1.0
#: How long a graceful stop lets calls in flight finish.
DEFAULT_GRACE_SECONDS = 5.0


@dataclass(slots=True)
class ServerCall:
    """What a handler may know about its call besides the request bytes."""

    path: str
    #: Absolute deadline on the Trio clock, `math.inf` when the client set none.
    deadline: float
    #: Request metadata (custom headers), names lower-case.
    metadata: HeaderBlock
    peer: str
    #: Extra trailing metadata to send with the status (e.g. relayed from a worker).
    trailers: HeaderBlock = ()

    def status_for(self, exc: BaseException) -> StatusCode:
        """The status this call ends with when its handler raises `exc` (for metrics)."""
        if isinstance(exc, GrpcError):
            return exc.code
        if isinstance(exc, RsgwError):
            return exc.grpc_status
        if isinstance(exc, trio.Cancelled):
            if trio.current_time() >= self.deadline:
                return StatusCode.DEADLINE_EXCEEDED
            return StatusCode.CANCELLED
        return StatusCode.INTERNAL


UnaryHandler = Callable[[bytes, ServerCall], Awaitable[bytes]]


@dataclass(slots=True)
class _Stream:
    id: int
    handler: UnaryHandler | None
    call: ServerCall | None
    decoder: MessageDecoder | None
    messages: list[bytes] = field(default_factory=list)
    scope: trio.CancelScope | None = None
    #: Set when we have answered (trailers sent) or the client reset the stream.
    finished: bool = False
    reset_by_peer: bool = False


class GrpcServer:
    """A gRPC server for unary methods over raw bytes.

    Args:
        handlers: full method path (`/package.Service/Method`) to handler.
        max_receive_message_bytes: larger request messages fail their own call
            with RESOURCE_EXHAUSTED; other calls on the connection go on.
        max_send_message_bytes: larger responses fail with RESOURCE_EXHAUSTED.

    Serve with `await nursery.start(server.serve, host, port)`, which returns the
    bound port once the socket listens. `aclose()` stops gracefully: no new
    connections, GOAWAY to every client, calls in flight get `grace` seconds.
    """

    def __init__(
        self,
        handlers: Mapping[str, UnaryHandler],
        *,
        max_receive_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_send_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self._handlers = {path.encode(): handler for path, handler in handlers.items()}
        self.max_receive_message_bytes = max_receive_message_bytes
        self.max_send_message_bytes = max_send_message_bytes
        self._max_concurrent_streams = max_concurrent_streams
        self._window_bytes = window_bytes
        self._max_frame_bytes = max_frame_bytes
        self._connections: set[_Connection] = set()
        self._cancel_scope: trio.CancelScope | None = None
        self._closing = False
        self._closed = trio.Event()

    async def serve(
        self,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Bind `host:port`, report the bound port, serve until cancelled or closed.

        Raises:
            ListenError: the address is busy or cannot be bound.
        """
        sock = bind_tcp(host, port)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        try:
            with trio.CancelScope() as self._cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._accept_loop, listener, nursery)
                    task_status.started(bound_port(sock))
                    await self._closed.wait()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            stream = await listener.accept()
            nursery.start_soon(self._serve_connection, stream)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        connection = _Connection(self, stream)
        self._connections.add(connection)
        if self._closing:
            connection.go_away()
        try:
            await connection.run()
        finally:
            connection.quiet.set()
            connection.ended.set()
            self._connections.discard(connection)
            with trio.move_on_after(1, shield=True):
                await stream.aclose()

    async def aclose(self, grace: float = DEFAULT_GRACE_SECONDS) -> None:
        """Stop accepting, send GOAWAY, let calls in flight finish within `grace`."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        for connection in list(self._connections):
            connection.go_away()
        with trio.move_on_after(grace):
            for connection in list(self._connections):
                await connection.quiet.wait()
            # Lingering close: let each client hang up first. Closing a socket with
            # unread input makes the kernel send a reset, which can destroy the last
            # answers still on their way to the client.
            with trio.move_on_after(LINGER_SECONDS):
                for connection in list(self._connections):
                    await connection.ended.wait()
        self._closed.set()

    def lookup(self, path: bytes) -> UnaryHandler | None:
        return self._handlers.get(path)


class _Connection:
    """One HTTP/2 connection: the reader loop, the streams, and a transport to answer."""

    def __init__(self, server: GrpcServer, stream: trio.SocketStream) -> None:
        self._server = server
        self._h2 = new_h2_connection(
            client_side=False,
            window_bytes=server._window_bytes,
            max_frame_bytes=server._max_frame_bytes,
            max_concurrent_streams=server._max_concurrent_streams,
        )
        self._transport = H2Transport(self._h2, stream)
        self._transport.after_write = self._after_write
        self._stream = stream
        self._streams: dict[int, _Stream] = {}
        self._nursery: trio.Nursery | None = None
        #: Set once GOAWAY was sent and no call is left in flight.
        self.quiet = trio.Event()
        #: Set when the connection is over (the client hung up, or we closed it).
        self.ended = trio.Event()
        self._going_away = False
        self._goaway_sent = False
        try:
            peer = stream.socket.getpeername()
            self._peer = f"{peer[0]}:{peer[1]}"
        except OSError:
            self._peer = "unknown"

    @property
    def active_streams(self) -> int:
        return sum(1 for s in self._streams.values() if not s.finished)

    def go_away(self) -> None:
        """Stop taking new calls; once the calls in flight are answered, send GOAWAY.

        h2 treats a sent GOAWAY as the end of the connection and refuses to send
        anything after it, so we cannot announce it first and then answer: until
        the last answer has gone out, new streams are refused (REFUSED_STREAM,
        which clients retry safely elsewhere), and the GOAWAY follows it.
        """
        self._going_away = True
        self._flush()

    def _after_write(self) -> None:
        if not self._going_away or self.active_streams:
            return
        if not self._goaway_sent:
            self._goaway_sent = True
            self._h2.close_connection()
            self._flush()
        else:
            self.quiet.set()  # the GOAWAY has left too

    def _note_finished(self) -> None:
        if self._going_away:
            self._flush()

    def _flush(self) -> None:
        self._transport.flush()

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._transport.run_writer)
                self._flush()
                await self._read_loop()
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            logger.debug("connection from %s lost: %s", self._peer, group.exceptions[0])
        except* Exception as group:  # a bug here must not take the listener down with it
            logger.error("connection from %s failed", self._peer, exc_info=group)

    async def _read_loop(self) -> None:
        h2conn = self._h2
        receive = self._stream.receive_some
        while True:
            data = await receive(RECEIVE_BYTES)
            if not data:
                return
            try:
                events = h2conn.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                logger.debug("protocol error from %s: %s", self._peer, exc)
                self._flush()  # h2's GOAWAY, written straight away when the socket takes it
                return
            for event in events:
                if isinstance(event, h2.events.DataReceived):
                    self._on_data(event)
                elif isinstance(event, h2.events.RequestReceived):
                    self._on_request(event)
                elif isinstance(event, h2.events.StreamEnded):
                    self._on_end(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    self._on_reset(event.stream_id)
                elif isinstance(event, h2.events.WindowUpdated):
                    self._transport.window_opened(event.stream_id)
                elif isinstance(event, h2.events.RemoteSettingsChanged):
                    self._transport.window_opened(0)
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self._flush()
                    return
            self._transport.acknowledge()
            self._flush()

    # -- events -------------------------------------------------------------------

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        if self._going_away:
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        headers = event.headers or []
        try:
            head = parse_request_headers(headers)
            handler = self._server.lookup(head.path)
            if handler is None:
                raise GrpcError(StatusCode.UNIMPLEMENTED, f"unknown method {head.path.decode()}")
        except GrpcError as exc:
            self._streams[stream_id] = _Stream(stream_id, None, None, None, finished=True)
            self._answer_early(stream_id, exc)
            return
        deadline = math.inf if head.timeout is None else trio.current_time() + head.timeout
        call = ServerCall(head.path.decode(), deadline, head.metadata, self._peer)
        decoder = MessageDecoder(self._server.max_receive_message_bytes)
        self._streams[stream_id] = _Stream(stream_id, handler, call, decoder)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream_id = event.stream_id
        self._transport.received(stream_id, event.flow_controlled_length)
        stream = self._streams.get(stream_id)
        if stream is None or stream.finished or stream.decoder is None:
            return
        try:
            stream.messages.extend(stream.decoder.feed(event.data or b""))
        except GrpcError as exc:
            stream.finished = True
            self._answer_early(stream_id, exc)

    def _on_end(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if stream.finished:
            self._forget_if_closed(stream)
            return
        assert stream.handler is not None and stream.call is not None
        if len(stream.messages) != 1 or not (stream.decoder and stream.decoder.at_boundary):
            stream.finished = True
            self._answer_early(
                stream_id,
                GrpcError(
                    StatusCode.INTERNAL,
                    f"unary call expects one request message, got {len(stream.messages)}",
                ),
            )
            return
        assert self._nursery is not None
        self._nursery.start_soon(self._run_unary, stream, stream.handler, stream.messages.pop())

    def _on_reset(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        stream.reset_by_peer = True
        stream.finished = True
        if stream.scope is not None:
            stream.scope.cancel()
        self._transport.stream_gone(stream_id)
        self._note_finished()

    # -- answering ----------------------------------------------------------------

    def _answer_early(self, stream_id: int, error: GrpcError) -> None:
        """Fail a call before its handler ran: one HEADERS frame, then stop the upload."""
        try:
            self._h2.send_headers(
                stream_id, trailers_only(error.code, error.message), end_stream=True
            )
            h2_stream = self._h2.streams.get(stream_id)
            if h2_stream is not None and h2_stream.open:
                self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass
        self._flush()
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._forget_if_closed(stream)

    def _forget_if_closed(self, stream: _Stream) -> None:
        h2_stream = self._h2.streams.get(stream.id)
        if h2_stream is None or h2_stream.closed:
            self._streams.pop(stream.id, None)
        self._note_finished()

    async def _run_unary(self, stream: _Stream, handler: UnaryHandler, request: bytes) -> None:
        call = stream.call
        assert call is not None
        code = StatusCode.OK
        message = ""
        response: bytes | None = None
        with trio.CancelScope(deadline=call.deadline) as scope:
            stream.scope = scope
            try:
                response = await handler(request, call)
                if len(response) > self._server.max_send_message_bytes:
                    error = too_large(len(response), self._server.max_send_message_bytes, "sent")
                    code, message, response = error.code, error.message, None
            except GrpcError as exc:
                code, message = exc.code, exc.message
                if exc.trailers:
                    call.trailers = call.trailers + exc.trailers
            except RsgwError as exc:
                code, message = exc.grpc_status, str(exc)
            except Exception as exc:
                logger.exception("handler for %s failed", call.path)
                code, message = StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
        stream.scope = None
        if stream.reset_by_peer:
            return
        if scope.cancelled_caught:
            code, message, response = StatusCode.DEADLINE_EXCEEDED, "deadline exceeded", None
        try:
            if response is not None:
                self._h2.send_headers(stream.id, RESPONSE_HEADERS)
                await self._transport.send_message(stream.id, response, end_stream=False)
                self._h2.send_headers(
                    stream.id, status_trailers(code, message, call.trailers), end_stream=True
                )
            else:
                self._h2.send_headers(
                    stream.id, trailers_only(code, message, call.trailers), end_stream=True
                )
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass  # the client went away while we answered
        finally:
            stream.finished = True
            self._flush()
            self._forget_if_closed(stream)
