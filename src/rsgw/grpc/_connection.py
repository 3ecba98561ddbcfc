"""One gRPC connection over HTTP/2, with no I/O: bytes in, call events out, bytes to send.

Sans-IO in h11's sense: the shell feeds what it read to `receive_data` and gets
back `rsgw.grpc._calls` events; it tells the connection what to send
(`start_call`, `send_response`, `cancel`, ...) and writes `data_to_send()` to its
stream. No trio, no socket, no clock: the server and client shells are thin
loops around this class, and it can be driven by a test byte by byte.

What it owns:
- every call's state (through `Call`'s advance methods, the transition table's one door);
- message framing and size limits, both ways;
- flow control: DATA received is acknowledged once per `receive_data`, and
  outbound DATA the peer's window cannot take waits in its call's outbox, drained
  first come first served whenever the peer opens a window, so a large message
  never starves the ones queued behind it and no sender ever has to wait;
- how calls end: the peer's status, a reset, GOAWAY, a lost connection, each
  turned into one `CallEnded` carrying the error a client raises (the one place
  where h2's outcomes become rsgw errors).

A server goes away gracefully with `go_away()`: new streams are refused
(REFUSED_STREAM, which clients retry safely elsewhere), and the GOAWAY frame
follows the last answer. h2 refuses to send anything after its GOAWAY, so it
cannot be announced first.
"""

from __future__ import annotations

import contextlib
import enum
from typing import TYPE_CHECKING

import h2.errors
import h2.events
import h2.exceptions

from rsgw._errors import GrpcError, RsgwError, WorkerUnavailable
from rsgw._status import StatusCode
from rsgw.grpc._calls import (
    Call,
    CallEnded,
    CallStarted,
    ConnectionTerminated,
    EndCause,
    Event,
    HalfClosed,
    HalfState,
    MessageReceived,
    ResponseStarted,
    Step,
    http_status_error,
    lost,
    reset_by_peer,
)
from rsgw.grpc._flow import SEND_FAILURES, Outbound
from rsgw.grpc._framing import DEFAULT_MAX_MESSAGE_BYTES, MessageDecoder, too_large
from rsgw.grpc._h2 import DEFAULT_MAX_FRAME_BYTES, DEFAULT_WINDOW_BYTES, new_h2_connection
from rsgw.grpc._metadata import (
    RESPONSE_HEADERS,
    Header,
    HeaderBlock,
    parse_request_headers,
    parse_status,
    status_trailers,
    trailers_only,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    _H2Handler = Callable[[Any, list[Event]], None]


class ConnectionState(enum.Enum):
    """Whether a connection takes new calls."""

    ACTIVE = "active"
    #: No new calls: we are going away, or the peer sent GOAWAY. Calls in flight go on.
    DRAINING = "draining"
    #: Nothing more will happen: our GOAWAY is queued, or the connection ended.
    CLOSED = "closed"


class GrpcConnection:
    """The calls on one HTTP/2 connection, for a server or a client; see the module docstring.

    Args:
        client_side: which end of the connection we are.
        peer: how messages name the other end (`host:port`, or "the client").
        max_receive_message_bytes / max_send_message_bytes: per-message limits; a
            message over them fails its own call (RESOURCE_EXHAUSTED), never others.
        window_bytes / max_frame_bytes: our HTTP/2 settings.
        max_concurrent_streams: a server's stream limit (None: h2's default).
    """

    def __init__(
        self,
        *,
        client_side: bool,
        peer: str = "peer",
        max_receive_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_send_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_concurrent_streams: int | None = None,
    ) -> None:
        self.client_side = client_side
        self.peer = peer
        self.max_receive_message_bytes = max_receive_message_bytes
        self.max_send_message_bytes = max_send_message_bytes
        self._h2 = new_h2_connection(
            client_side=client_side,
            window_bytes=window_bytes,
            max_frame_bytes=max_frame_bytes,
            max_concurrent_streams=max_concurrent_streams,
        )
        self._calls: dict[int, Call] = {}
        self._outbound = Outbound(self._h2, ended=self._after_outbound_end, broken=self._drop)
        self._unacknowledged: dict[int, int] = {}
        self._handlers = self._h2_handlers()
        self.data_to_send = self._h2.data_to_send  # type: ignore[method-assign]  # the same, one call less on the hot path
        self.state = ConnectionState.ACTIVE
        #: Why the connection ended (None while it has not).
        self.closed_reason: str | None = None
        self._going_away = False

    # -- state ---------------------------------------------------------------------------

    @property
    def active_calls(self) -> int:
        """Calls not yet over (a server's include those whose handler still runs)."""
        return len(self._calls)

    @property
    def usable(self) -> bool:
        """A client may start calls here."""
        return self.state is ConnectionState.ACTIVE

    def call(self, stream_id: int) -> Call | None:
        """The record of a call in flight (for tests and assertions)."""
        return self._calls.get(stream_id)

    # -- bytes in, bytes out ---------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Everything queued for the peer since the last call."""
        return self._h2.data_to_send()  # replaced per instance by h2's own (one call less)

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes read from the peer; `b""` means it closed its side (EOF).

        Returns the events these bytes completed, in order. A peer that breaks
        HTTP/2 ends the connection: h2 queues its GOAWAY, every call ends, and the
        state becomes CLOSED.
        """
        if not data:
            return self.connection_lost("closed by the peer")
        if self.closed_reason is not None:
            return []
        try:
            h2_events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            return self.connection_lost(f"broke the HTTP/2 protocol: {exc}")
        events: list[Event] = []
        handlers = self._handlers
        for h2_event in h2_events:
            handler = handlers.get(type(h2_event))
            if handler is not None:
                handler(h2_event, events)
        self._acknowledge()
        return events

    def _h2_handlers(self) -> dict[type[h2.events.Event], _H2Handler]:
        """What each h2 event means here (one dict lookup per event on the hot path)."""
        headers = self._on_response_headers if self.client_side else self._on_request
        handlers: dict[type[h2.events.Event], _H2Handler] = {
            h2.events.DataReceived: self._on_data,
            h2.events.RequestReceived: headers,
            h2.events.ResponseReceived: headers,
            h2.events.StreamEnded: self._on_end,
            h2.events.StreamReset: self._on_reset,
            h2.events.WindowUpdated: self._on_window,
            h2.events.RemoteSettingsChanged: self._on_window,
            h2.events.ConnectionTerminated: self._on_goaway,
        }
        if self.client_side:
            handlers[h2.events.TrailersReceived] = self._on_trailers_received
        return handlers

    def connection_lost(self, reason: str) -> list[Event]:
        """The connection is gone (EOF, an error, or we abandon it): end every call.

        Returns one `CallEnded` per call still in flight, each with the error its
        caller should see. Later bytes are ignored.
        """
        if self.closed_reason is not None:
            return []
        self.closed_reason = reason
        self.state = ConnectionState.CLOSED
        calls, self._calls = self._calls, {}
        self._outbound.forget()
        events: list[Event] = []
        for call in calls.values():
            call.reset()
            error = lost(call, self.peer, reason, client_side=self.client_side)
            events.append(self._ended(call, EndCause.LOST, error))
        return events

    # -- receiving -----------------------------------------------------------------------

    def _on_request(self, event: h2.events.RequestReceived, events: list[Event]) -> None:
        stream_id = event.stream_id
        headers = event.headers or []
        if self.state is not ConnectionState.ACTIVE:
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        try:
            head = parse_request_headers(headers)
        except RsgwError as exc:  # not a gRPC call we can serve: answer and forget it
            self._answer_unregistered(stream_id, exc)
            return
        call = Call(stream_id, MessageDecoder(self.max_receive_message_bytes))
        call.advance_inbound(Step.HEADERS)
        self._calls[stream_id] = call
        events.append(CallStarted(stream_id, head))

    def _on_response_headers(self, event: h2.events.ResponseReceived, events: list[Event]) -> None:
        stream_id = event.stream_id
        headers = event.headers or []
        call = self._calls.get(stream_id)
        if call is None or call.inbound is not HalfState.IDLE:
            return
        call.response_started = True
        if any(name == b"grpc-status" for name, _ in headers):  # trailers-only
            self._on_trailers(stream_id, headers)
            return  # the half goes IDLE -> CLOSED when the stream ends
        call.advance_inbound(Step.HEADERS)
        http_status = next((value for name, value in headers if name == b":status"), b"")
        if http_status != b"200":
            call.status = http_status_error(http_status, self.peer)
        events.append(ResponseStarted(stream_id))

    def _on_trailers_received(self, event: h2.events.TrailersReceived, events: list[Event]) -> None:
        self._on_trailers(event.stream_id, event.headers or [])

    def _on_trailers(self, stream_id: int, headers: list[Header]) -> None:
        call = self._calls.get(stream_id)
        if call is None or call.status is not None or call.answered_ok:
            return
        status = parse_status(headers)
        if status.code is StatusCode.OK:
            call.answered_ok = True
        else:
            call.status = GrpcError(status.code, status.message, status.trailers)

    def _on_data(self, event: h2.events.DataReceived, events: list[Event]) -> None:
        stream_id = event.stream_id
        self._unacknowledged[stream_id] = (
            self._unacknowledged.get(stream_id, 0) + event.flow_controlled_length
        )
        call = self._calls.get(stream_id)
        if call is None or call.inbound is not HalfState.OPEN or call.status is not None:
            return
        try:
            messages = call.decoder.feed(event.data or b"")
        except RsgwError as exc:
            self._fail(call, exc, events)
            return
        # The half is OPEN (checked above), where a message leaves it as it is.
        for message in messages:
            events.append(MessageReceived(stream_id, message))

    def _on_end(self, event: h2.events.StreamEnded, events: list[Event]) -> None:
        stream_id = event.stream_id
        call = self._calls.get(stream_id)
        if call is None or call.inbound >= HalfState.CLOSED:
            return
        call.advance_inbound(Step.END)
        if not call.decoder.at_boundary:
            error = GrpcError(StatusCode.INTERNAL, "stream ended in the middle of a message")
            self._fail(call, error, events)
        elif not self.client_side:
            events.append(HalfClosed(stream_id))
            if call.outbound >= HalfState.CLOSED:  # answered before the request ended
                self._forget(call)
        elif call.status is not None:
            self._finish_client_call(call, EndCause.ANSWERED, call.status, events)
        elif call.answered_ok:
            self._finish_client_call(call, EndCause.ANSWERED, None, events)
        else:
            error = GrpcError(
                StatusCode.INTERNAL, f"{self.peer} ended a call without a grpc-status"
            )
            self._finish_client_call(call, EndCause.FAILED, error, events)

    def _on_reset(self, event: h2.events.StreamReset, events: list[Event]) -> None:
        stream_id = event.stream_id
        call = self._calls.pop(stream_id, None)
        self._outbound.forget(stream_id)
        if call is None:
            return
        call.reset()
        self._goaway_if_idle()
        code = int(event.error_code or 0)
        cause, error = reset_by_peer(call, code, self.peer, client_side=self.client_side)
        events.append(self._ended(call, cause, error))

    def _on_window(self, event: h2.events.Event, events: list[Event]) -> None:
        self._outbound.resume()

    def _on_goaway(self, event: h2.events.ConnectionTerminated, events: list[Event]) -> None:
        """No new calls here; a client's calls past `last_stream_id` were never processed."""
        last_stream_id = event.last_stream_id or 0
        if self.state is ConnectionState.ACTIVE:
            self.state = ConnectionState.DRAINING
        if self.client_side:
            for stream_id in [sid for sid in self._calls if sid > last_stream_id]:
                call = self._calls.pop(stream_id)
                self._outbound.forget(stream_id)
                call.reset()
                error = WorkerUnavailable(f"{self.peer} is going away; call not processed")
                events.append(self._ended(call, EndCause.REFUSED, error))
        events.append(ConnectionTerminated(last_stream_id, int(event.error_code or 0)))

    # -- sending: client -------------------------------------------------------------------

    def start_call(self, headers: Sequence[Header], message: bytes) -> int:
        """Open a call, send `headers` and one message, and end the request.

        Returns the call's stream id; its outcome arrives as a `CallEnded`.

        Raises:
            GrpcError: RESOURCE_EXHAUSTED, the message is over the send limit.
            WorkerUnavailable: the connection takes no new calls (going away,
                closed, or out of streams); no stream was opened.
        """
        if len(message) > self.max_send_message_bytes:
            raise too_large(len(message), self.max_send_message_bytes, "sent")
        if self.state is not ConnectionState.ACTIVE:
            raise WorkerUnavailable(
                f"connection to {self.peer} {self.closed_reason or 'is going away'}"
            )
        try:
            stream_id = self._h2.get_next_available_stream_id()
            self._h2.send_headers(stream_id, headers)
        except h2.exceptions.ProtocolError as exc:  # too many streams, or GOAWAY received
            raise WorkerUnavailable(f"connection to {self.peer} refused a stream: {exc}") from exc
        call = Call(stream_id, MessageDecoder(self.max_receive_message_bytes))
        call.advance_outbound(Step.HEADERS)
        self._calls[stream_id] = call
        self._outbound.queue(call, message, end=True)
        return stream_id

    def cancel(self, stream_id: int) -> None:
        """Abandon a call (the caller was cancelled): RST_STREAM CANCEL, no event."""
        call = self._calls.pop(stream_id, None)
        self._outbound.forget(stream_id)
        if call is None:
            return
        call.reset()
        if self.closed_reason is None:
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)

    # -- sending: server -------------------------------------------------------------------

    def send_response(
        self,
        stream_id: int,
        message: bytes | None,
        code: StatusCode = StatusCode.OK,
        text: str = "",
        trailers: HeaderBlock = (),
    ) -> None:
        """Answer a unary call: response headers, `message`, then the status trailers.

        With `message` None the answer is trailers-only (one HEADERS frame), as for
        a call that failed before it produced anything. A message over the send
        limit becomes RESOURCE_EXHAUSTED. A call the client already reset is
        ignored. If the client is still uploading once the answer has gone, its
        upload is stopped (RST_STREAM NO_ERROR).
        """
        call = self._calls.get(stream_id)
        if call is None or call.outbound is not HalfState.IDLE:
            return
        if message is not None and len(message) > self.max_send_message_bytes:
            error = too_large(len(message), self.max_send_message_bytes, "sent")
            message, code, text = None, error.code, error.message
        try:
            if message is None:
                self._h2.send_headers(
                    stream_id, trailers_only(code, text, trailers), end_stream=True
                )
                call.advance_outbound(Step.END)
                self._after_outbound_end(call)
                return
            self._h2.send_headers(stream_id, RESPONSE_HEADERS)
            call.advance_outbound(Step.HEADERS)
            call.trailers = status_trailers(code, text, trailers)
            self._outbound.queue(call, message, end=True)
        except SEND_FAILURES:
            self._drop(call)

    def reject(self, stream_id: int, error: RsgwError) -> None:
        """Fail a call before any answer: trailers-only with the error's status."""
        self.send_response(stream_id, None, error.code, error.message, error.trailers)

    def go_away(self) -> None:
        """Take no new calls; send GOAWAY as soon as the calls in flight are answered."""
        self._going_away = True
        if self.state is ConnectionState.ACTIVE:
            self.state = ConnectionState.DRAINING
        self._goaway_if_idle()

    # -- internals -----------------------------------------------------------------------

    def _after_outbound_end(self, call: Call) -> None:
        if not self.client_side and call.inbound is HalfState.OPEN:
            # Answered while the client still uploads: stop the upload.
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.reset_stream(call.stream_id, h2.errors.ErrorCodes.NO_ERROR)
            call.advance_inbound(Step.RESET)
        if call.inbound >= HalfState.CLOSED:  # the outbound half has just ended
            self._forget(call)

    def _acknowledge(self) -> None:
        """Hand back the window for every DATA byte consumed, once per read.

        Per read rather than per frame: a 1 MiB message is 64 frames of 16 KiB, and
        h2's flow-control bookkeeping is per call. Bytes of calls we already ended
        are acknowledged too, so one bad call never starves the connection.
        """
        pending, self._unacknowledged = self._unacknowledged, {}
        for stream_id, size in pending.items():
            self._h2.acknowledge_received_data(size, stream_id)

    def _fail(self, call: Call, error: RsgwError, events: list[Event]) -> None:
        """We end a call ourselves (a bad or oversized message): tell both sides."""
        if self.client_side:
            self._finish_client_call(call, EndCause.FAILED, error, events)
            return
        if call.outbound is HalfState.IDLE:
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.send_headers(
                    call.stream_id, trailers_only(error.code, error.message), end_stream=True
                )
        self._reset_stream(call, h2.errors.ErrorCodes.NO_ERROR)
        events.append(self._ended(call, EndCause.FAILED, error))

    def _finish_client_call(
        self, call: Call, cause: EndCause, error: RsgwError | None, events: list[Event]
    ) -> None:
        if call.outbound < HalfState.CLOSED or call.inbound < HalfState.CLOSED:
            # The answer came before our request was all sent (or it was bad): stop.
            self._reset_stream(call, h2.errors.ErrorCodes.CANCEL)
        else:
            self._calls.pop(call.stream_id, None)
        events.append(CallEnded(call.stream_id, cause, error, call.response_started))

    def _reset_stream(self, call: Call, code: h2.errors.ErrorCodes) -> None:
        with contextlib.suppress(*SEND_FAILURES):
            self._h2.reset_stream(call.stream_id, code)
        self._drop(call)

    def _drop(self, call: Call) -> None:
        """Forget a call whose stream is gone (reset, or closed under a send)."""
        if call.inbound < HalfState.CLOSED or call.outbound < HalfState.CLOSED:
            call.reset()
        self._calls.pop(call.stream_id, None)
        self._outbound.forget(call.stream_id)
        self._goaway_if_idle()

    def _forget(self, call: Call) -> None:
        """A call that is over leaves the books (its outbox drained, or dropped already)."""
        self._calls.pop(call.stream_id, None)
        if self._going_away:
            self._goaway_if_idle()

    def _goaway_if_idle(self) -> None:
        if self._going_away and not self._calls and self.state is not ConnectionState.CLOSED:
            self.state = ConnectionState.CLOSED
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.close_connection()

    def _ended(self, call: Call, cause: EndCause, error: RsgwError | None) -> CallEnded:
        return CallEnded(call.stream_id, cause, error, call.response_started)

    def _answer_unregistered(self, stream_id: int, error: RsgwError) -> None:
        """Answer a request we will not serve (bad headers) without ever tracking it."""
        with contextlib.suppress(*SEND_FAILURES):
            self._h2.send_headers(
                stream_id, trailers_only(error.code, error.message), end_stream=True
            )
            stream = self._h2.streams.get(stream_id)
            if stream is not None and stream.open:
                self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
