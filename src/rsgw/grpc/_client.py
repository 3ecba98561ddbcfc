"""The gRPC client shell: one HTTP/2 connection to one peer, many unary calls on it.

Theory of operation. A `Channel` holds at most one live `_ClientConnection`. The
first call connects (bounded by `connect_timeout`; concurrent callers wait for the
same attempt); a connection that dies is dropped, and the next call connects
again. Each connection has a reader task and a writer task, started in the
nursery the channel was given. A call holds one of `max_concurrent_streams`
slots, sends its headers and message, and waits for its stream to end.

How calls fail (what the gateway's failover rule needs to know):
- The peer answered with a status: `GrpcError` with the peer's code, message and
  extra trailers, unchanged.
- The connection could not be made, or died (EOF, reset, GOAWAY past our stream)
  before the call got a response: `WorkerUnavailable` with `response_started`
  False. The request certainly produced no answer, so another replica may run it.
- The connection died after response headers arrived: `WorkerUnavailable` with
  `response_started` True.
- The deadline passed: `GrpcError(DEADLINE_EXCEEDED)`; the stream is reset.
A cancelled caller resets its stream (RST_STREAM CANCEL) so the peer stops work.

Invariants: every pending call on a connection is failed exactly once when the
reader sees EOF or an error; `reset()` does the same on purpose (the prober's
watchdog), and never blocks.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field

import h2.errors
import h2.events
import h2.exceptions
import hpack
import trio

from rsgw._errors import WorkerUnavailable
from rsgw._status import GrpcError, StatusCode
from rsgw.grpc._framing import DEFAULT_MAX_MESSAGE_BYTES, MessageDecoder, too_large
from rsgw.grpc._metadata import (
    CONTENT_TYPE,
    Header,
    HeaderBlock,
    format_timeout,
    parse_status,
)
from rsgw.grpc._transport import RECEIVE_BYTES, H2Transport, new_h2_connection

logger = logging.getLogger(__name__)

#: Concurrent calls per channel (the original's `max_concurrent_streams_per_worker`).
DEFAULT_MAX_CONCURRENT_STREAMS = 32
DEFAULT_CONNECT_TIMEOUT = 5.0

#: HTTP statuses a gRPC client maps to codes when no grpc-status came (gRPC spec).
_HTTP_TO_STATUS = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}


class ResponseStarted(WorkerUnavailable):
    """The connection died after the peer had begun to answer: the call may have run."""


@dataclass(slots=True, eq=False)
class _Call:
    stream_id: int
    decoder: MessageDecoder
    messages: list[bytes] = field(default_factory=list)
    response_started: bool = False
    status: GrpcError | None = None
    ok: bool = False
    failure: Exception | None = None
    done: trio.Event = field(default_factory=trio.Event)

    def fail(self, error: Exception) -> None:
        if not self.done.is_set():
            self.failure = error
            self.done.set()


class Channel:
    """Unary calls over raw bytes to one peer (`host:port`), on one HTTP/2 connection.

    Args:
        target: `host:port` of the peer.
        nursery: where connection tasks run; the channel lives as long as it does.
        max_concurrent_streams: calls in flight at once; more wait for a slot.
        max_receive_message_bytes / max_send_message_bytes: message limits.
        connect_timeout: bound on one connection attempt.
    """

    def __init__(
        self,
        target: str,
        nursery: trio.Nursery,
        *,
        max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
        max_receive_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_send_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        host, _, port = target.rpartition(":")
        self.target = target
        self._host = host.strip("[]")
        self._port = int(port)
        self._nursery = nursery
        self._slots = trio.Semaphore(max_concurrent_streams)
        self.max_receive_message_bytes = max_receive_message_bytes
        self.max_send_message_bytes = max_send_message_bytes
        self.connect_timeout = connect_timeout
        self._connection: _ClientConnection | None = None
        self._connect_lock = trio.Lock()
        self._closed = False
        self._request_prefix: HeaderBlock = (
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", target.encode()),
        )
        self._request_suffix: HeaderBlock = (
            (b"content-type", CONTENT_TYPE),
            (b"te", b"trailers"),
        )
        #: Connections made so far (a reset or a dead peer makes the next call reconnect).
        self.connects = 0

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.usable

    def reset(self, reason: str = "channel reset") -> None:
        """Drop the connection now: its pending calls fail, the next call reconnects."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close(reason)

    async def aclose(self) -> None:
        self._closed = True
        self.reset("channel closed")

    async def unary(
        self,
        path: bytes,
        request: bytes,
        *,
        deadline: float = math.inf,
        metadata: HeaderBlock = (),
        uncapped: bool = False,
    ) -> bytes:
        """Call `path` with `request`; return the response message.

        Args:
            deadline: absolute, on the Trio clock; forwarded as `grpc-timeout`.
            uncapped: skip the stream cap. For the gateway's own control-plane calls
                (health probes, metadata polls): a few per round, and they must not
                queue behind a full load of inference, or a busy worker looks hung.

        Raises:
            GrpcError: the peer's status, or DEADLINE_EXCEEDED at `deadline`.
            WorkerUnavailable: no connection, or it died before a response arrived
                (`ResponseStarted` if it died after).
        """
        if len(request) > self.max_send_message_bytes:
            raise too_large(len(request), self.max_send_message_bytes, "sent")
        with trio.CancelScope(deadline=deadline) as scope:
            async with contextlib.nullcontext() if uncapped else self._slots:
                connection = await self._connect()
                return await connection.call(self._headers(path, deadline, metadata), request)
        assert scope.cancelled_caught
        raise GrpcError(StatusCode.DEADLINE_EXCEEDED, f"deadline exceeded calling {self.target}")

    def _headers(self, path: bytes, deadline: float, metadata: HeaderBlock) -> list[Header]:
        headers = [*self._request_prefix, (b":path", path), *self._request_suffix]
        if deadline != math.inf:
            # Never indexed: a new value every call would churn the HPACK table and
            # push out the constant headers that make every other call cheap.
            timeout = format_timeout(deadline - trio.current_time())
            headers.append(hpack.NeverIndexedHeaderTuple(b"grpc-timeout", timeout))
        headers.extend(metadata)
        return headers

    async def _connect(self) -> _ClientConnection:
        connection = self._connection
        if connection is not None and connection.usable:
            return connection
        async with self._connect_lock:
            connection = self._connection
            if connection is not None and connection.usable:
                return connection
            if self._closed:
                raise WorkerUnavailable(f"channel to {self.target} is closed")
            stream: trio.SocketStream | None = None
            with trio.move_on_after(self.connect_timeout):
                try:
                    stream = await trio.open_tcp_stream(self._host, self._port)
                except OSError as exc:
                    raise WorkerUnavailable(
                        f"cannot connect to {self.target}: {exc.strerror or exc}"
                    ) from exc
            if stream is None:
                raise WorkerUnavailable(
                    f"cannot connect to {self.target}: no answer within {self.connect_timeout}s"
                )
            connection = _ClientConnection(self, stream)
            self._connection = connection
            self.connects += 1
            self._nursery.start_soon(connection.run)
            return connection


class _ClientConnection:
    def __init__(self, channel: Channel, stream: trio.SocketStream) -> None:
        self._channel = channel
        self._target = channel.target
        self._h2 = new_h2_connection(client_side=True)
        self._transport = H2Transport(self._h2, stream)
        self._stream = stream
        self._calls: dict[int, _Call] = {}
        self._closed_reason: str | None = None
        #: GOAWAY received: calls in flight may finish, new calls need a new connection.
        self._draining = False
        self._cancel_scope = trio.CancelScope()
        self._transport.flush()

    @property
    def usable(self) -> bool:
        return self._closed_reason is None and not self._draining

    def close(self, reason: str) -> None:
        """Fail every pending call and stop the connection's tasks (no await)."""
        if self._closed_reason is not None:
            return
        self._closed_reason = reason
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.fail(self._unavailable(call, reason))
        self._transport.wake_all()
        self._cancel_scope.cancel()
        if self._channel._connection is self:
            self._channel._connection = None

    def _unavailable(self, call: _Call, reason: str) -> WorkerUnavailable:
        kind = ResponseStarted if call.response_started else WorkerUnavailable
        return kind(f"connection to {self._target} {reason}")

    async def run(self) -> None:
        reason = "closed by the peer"
        try:
            with self._cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._transport.run_writer)
                    await self._read_loop()
                    nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            reason = f"failed: {group.exceptions[0]}"
        except* h2.exceptions.ProtocolError as group:
            reason = f"broke the HTTP/2 protocol: {group.exceptions[0]}"
        except* Exception as group:  # a bug here must not take the gateway down with it
            logger.error("client connection failed", exc_info=group)
            reason = f"failed: {group.exceptions[0]!r}"
        finally:
            self.close(reason)
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await self._stream.aclose()

    async def call(self, headers: list[Header], request: bytes) -> bytes:
        if not self.usable:
            raise WorkerUnavailable(
                f"connection to {self._target} {self._closed_reason or 'is going away'}"
            )
        h2conn = self._h2
        try:
            stream_id = h2conn.get_next_available_stream_id()
            h2conn.send_headers(stream_id, headers)
        except h2.exceptions.ProtocolError as exc:  # too many streams, or GOAWAY received
            raise WorkerUnavailable(
                f"connection to {self._target} refused a stream: {exc}"
            ) from exc
        call = _Call(stream_id, MessageDecoder(self._channel.max_receive_message_bytes))
        self._calls[stream_id] = call
        try:
            await self._transport.send_message(stream_id, request, end_stream=True)
            self._transport.flush()
            await call.done.wait()
        except h2.exceptions.StreamClosedError:
            call.fail(WorkerUnavailable(f"stream to {self._target} closed while sending"))
        finally:
            if not call.done.is_set():  # cancelled (deadline or caller): stop the peer's work
                self._forget(stream_id, reset=True)
        if call.failure is not None:
            raise call.failure
        if call.status is not None:
            raise call.status
        if len(call.messages) != 1:
            raise GrpcError(
                StatusCode.INTERNAL,
                f"{self._target} answered a unary call with {len(call.messages)} messages",
            )
        return call.messages[0]

    def _forget(self, stream_id: int, *, reset: bool) -> None:
        self._calls.pop(stream_id, None)
        if reset and self._closed_reason is None:
            with contextlib.suppress(h2.exceptions.ProtocolError):  # already closed
                self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            self._transport.flush()

    async def _read_loop(self) -> None:
        h2conn = self._h2
        receive = self._stream.receive_some
        while True:
            data = await receive(RECEIVE_BYTES)
            if not data:
                return
            for event in h2conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self._on_data(event)
                elif isinstance(event, h2.events.ResponseReceived):
                    self._on_headers(event.stream_id, event.headers)
                elif isinstance(event, h2.events.TrailersReceived):
                    self._on_trailers(event.stream_id, event.headers)
                elif isinstance(event, h2.events.StreamEnded):
                    self._on_end(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    self._on_reset(event)
                elif isinstance(event, h2.events.WindowUpdated):
                    self._transport.window_opened(event.stream_id)
                elif isinstance(event, h2.events.RemoteSettingsChanged):
                    self._transport.window_opened(0)
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self._on_goaway(event)
            self._transport.acknowledge()
            self._transport.flush()

    def _on_headers(self, stream_id: int, headers: list[Header] | None) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return
        call.response_started = True
        block = headers or []
        http_status = next((v for k, v in block if k == b":status"), b"")
        if any(k == b"grpc-status" for k, _ in block):  # trailers-only response
            self._on_trailers(stream_id, block)
        elif http_status != b"200":
            code = _HTTP_TO_STATUS.get(int(http_status or 0), StatusCode.UNKNOWN)
            call.status = GrpcError(code, f"{self._target} answered HTTP {http_status.decode()}")

    def _on_data(self, event: h2.events.DataReceived) -> None:
        self._transport.received(event.stream_id, event.flow_controlled_length)
        call = self._calls.get(event.stream_id)
        if call is None or call.status is not None:
            return
        try:
            call.messages.extend(call.decoder.feed(event.data or b""))
        except GrpcError as exc:
            call.status = exc
            self._forget(event.stream_id, reset=True)
            call.done.set()

    def _on_trailers(self, stream_id: int, headers: list[Header] | None) -> None:
        call = self._calls.get(stream_id)
        if call is None or call.status is not None:
            return
        status = parse_status(headers or [])
        if status.code is StatusCode.OK:
            call.ok = True
        else:
            call.status = GrpcError(status.code, status.message, status.trailers)

    def _on_end(self, stream_id: int) -> None:
        call = self._calls.pop(stream_id, None)
        if call is None:
            return
        if not call.ok and call.status is None:
            call.status = GrpcError(
                StatusCode.INTERNAL, f"{self._target} ended a call without a grpc-status"
            )
        call.done.set()

    def _on_reset(self, event: h2.events.StreamReset) -> None:
        call = self._calls.pop(event.stream_id, None)
        self._transport.stream_gone(event.stream_id)
        if call is None or call.done.is_set():
            return
        if call.ok or call.status is not None:
            call.done.set()  # the answer was complete; the reset only stops our upload
        elif event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM:
            call.fail(WorkerUnavailable(f"{self._target} refused the stream"))
        elif event.error_code == h2.errors.ErrorCodes.CANCEL:
            call.status = GrpcError(StatusCode.CANCELLED, f"{self._target} cancelled the call")
            call.done.set()
        else:
            call.fail(self._unavailable(call, f"reset the stream ({event.error_code!r})"))

    def _on_goaway(self, event: h2.events.ConnectionTerminated) -> None:
        """No new streams here; streams past `last_stream_id` were never processed."""
        last = event.last_stream_id or 0
        self._draining = True
        if self._channel._connection is self:
            self._channel._connection = None
        for stream_id in [sid for sid in self._calls if sid > last]:
            call = self._calls.pop(stream_id)
            call.fail(WorkerUnavailable(f"{self._target} is going away; call not processed"))
