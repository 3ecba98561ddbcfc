"""One gRPC connection over HTTP/2, with no I/O: bytes in, call events out, bytes to send.

Sans-IO in h11's sense: the shell feeds what it read to `receive_data` and gets
back `rsgw.grpc.protocol._calls` events; it tells the connection what to send and writes
`data_to_send()` to its stream. No trio, no socket, no clock: the server and client
shells are thin loops around it, and a test can drive it byte by byte.

This module holds what both ends share; `ServerConnection`
(`rsgw.grpc.protocol._server_connection`) and `ClientConnection`
(`rsgw.grpc.protocol._client_connection`) add what only one end does. Together they own:
- every call's state (through `Call`'s advance methods, the transition table's one door);
- message framing and size limits, both ways;
- flow control: DATA received is acknowledged once per `receive_data`, and
  outbound DATA the peer's window cannot take waits in its call's outbox
  (`rsgw.grpc.protocol._flow`), drained first come first served whenever the peer opens a
  window, so a large message never starves the ones queued behind it and no sender
  ever has to wait (a streaming sender may wait for `OutboxDrained`);
- how calls end: the peer's status, a reset, GOAWAY, a lost connection, each
  turned into one `CallEnded` carrying the error a client raises (the one place
  where h2's outcomes become rsgw errors, with `rsgw.grpc.protocol._calls`).
"""

from __future__ import annotations

import contextlib
import enum
from typing import TYPE_CHECKING

from rsgw.base._body import Body
from rsgw.base._errors import GrpcError, RsgwError
from rsgw.base._status import StatusCode
from rsgw.grpc.protocol._calls import (
    Call,
    CallEnded,
    ConnectionTerminated,
    EndCause,
    Event,
    HalfState,
    MessageReceived,
    OutboxDrained,
    Step,
    lost,
    reset_by_peer,
)
from rsgw.grpc.protocol._flow import SEND_FAILURES, Outbound
from rsgw.grpc.protocol._framing import DEFAULT_MAX_MESSAGE_BYTES, too_large
from rsgw.grpc.protocol._metadata import response_headers
from rsgw.http2 import _http2 as http2
from rsgw.http2._h2 import DEFAULT_MAX_FRAME_BYTES, DEFAULT_WINDOW_BYTES, new_h2_connection

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    _H2Handler = Callable[[Any, list[Event]], None]


#: How much of a read h2 parses before we look at what it cost (see `receive_data`).
SLICE_BYTES = 64 * 1024
#: Below this, a call's unfinished message is not worth adding up the connection's
#: (`_holding_large`).
LARGE_UNFINISHED_BYTES = 1024 * 1024


class ConnectionState(enum.Enum):
    """Whether a connection takes new calls."""

    ACTIVE = "active"
    #: No new calls: we are going away, or the peer sent GOAWAY. Calls in flight go on.
    DRAINING = "draining"
    #: Nothing more will happen: our GOAWAY is queued, or the connection ended.
    CLOSED = "closed"


class GrpcConnection:
    """The calls on one HTTP/2 connection; see the module docstring.

    Args:
        peer: how messages name the other end (`host:port`, or "the client").
        max_receive_message_bytes / max_send_message_bytes: per-message limits; a
            message over them fails its own call (RESOURCE_EXHAUSTED), never others.
        window_bytes / max_frame_bytes: our HTTP/2 settings (the window is each
            stream's; `connection_window_bytes` the connection's, default the same).
        max_concurrent_streams: a server's stream limit (None: h2's default).
    """

    #: Which end of the connection this class is.
    client_side = False

    def __init__(
        self,
        *,
        peer: str = "peer",
        max_receive_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_send_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_concurrent_streams: int | None = None,
        max_header_list_bytes: int | None = None,
        connection_window_bytes: int | None = None,
    ) -> None:
        self.peer = peer
        self.max_receive_message_bytes = max_receive_message_bytes
        self.max_send_message_bytes = max_send_message_bytes
        self._h2 = new_h2_connection(
            client_side=self.client_side,
            window_bytes=window_bytes,
            max_frame_bytes=max_frame_bytes,
            max_concurrent_streams=max_concurrent_streams,
            max_header_list_bytes=max_header_list_bytes,
            connection_window_bytes=connection_window_bytes,
        )
        self._calls: dict[int, Call] = {}
        self._outbound = Outbound(self._h2, ended=self._after_outbound_end, broken=self._drop)
        self._unacknowledged: dict[int, int] = {}
        self._handlers: dict[type[http2.Event], _H2Handler] = {
            http2.DataReceived: self._on_data,
            http2.StreamEnded: self._on_end,
            http2.StreamReset: self._on_reset,
            http2.WindowUpdated: self._on_window,
            http2.RemoteSettingsChanged: self._on_window,
            http2.ConnectionTerminated: self._on_goaway,
        }
        self.data_to_send = self._h2.data_to_send  # type: ignore[method-assign]  # the same, one call less on the hot path
        self.pieces_to_send = self._h2.pieces_to_send  # type: ignore[method-assign]  # likewise
        self.state = ConnectionState.ACTIVE
        #: Why the connection ended (None while it has not).
        self.closed_reason: str | None = None
        self._going_away = False
        self._pings = 0
        #: HTTP/2 frames (h2 events) received so far: whether the peer's bytes
        #: complete frames (a server closes a connection whose bytes stop doing so).
        self.frames = 0
        #: Chunks of bytes received so far (`receive_data` calls).
        self.receives = 0

    # -- state ---------------------------------------------------------------------------

    @property
    def peer_stream_limit(self) -> int:
        """How many calls the peer lets us have open at once (its latest SETTINGS)."""
        return int(self._h2.remote_settings.max_concurrent_streams)

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

    def is_sending(self, stream_id: int) -> bool:
        """Part of what the call queued still waits for the peer's window."""
        call = self._calls.get(stream_id)
        return call is not None and bool(call.outbox)

    # -- bytes in, bytes out ---------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Everything queued for the peer since the last call."""
        return self._h2.data_to_send()  # replaced per instance by the codec's (one call less)

    def pieces_to_send(self) -> list[bytes | memoryview]:
        """`data_to_send`, not joined (for a gather write)."""
        return self._h2.pieces_to_send()  # replaced per instance, likewise

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes read from the peer; `b""` means it closed its side (EOF).

        Returns the events these bytes completed, in order. A peer that breaks
        HTTP/2 ends the connection: h2 queues its GOAWAY, every call ends, and the
        state becomes CLOSED. A large read goes to the codec in slices of about
        `SLICE_BYTES` (cut on frame boundaries), and `_overdrawn()` is asked after
        each: a flood of tiny frames stops being parsed within one slice of going
        over budget.
        """
        if not data:
            return self.connection_lost("closed by the peer")
        if self.closed_reason is not None:
            return []
        events: list[Event] = []
        self.receives += 1
        handlers = self._handlers  # one dict lookup per h2 event on the hot path
        view = memoryview(data) if len(data) > SLICE_BYTES else data  # slices, not copies
        start = 0
        while start < len(data):
            try:
                h2_events, taken = self._h2.receive_some(
                    view[start:] if start else view, SLICE_BYTES
                )
            except http2.ProtocolError as exc:
                return events + self.connection_lost(f"broke the HTTP/2 protocol: {exc}")
            start += taken
            self.frames += len(h2_events)
            for h2_event in h2_events:
                handler = handlers.get(type(h2_event))
                if handler is not None:
                    handler(h2_event, events)
            if self._overdrawn():
                break
        self._acknowledge(events)
        return events

    def _overdrawn(self) -> bool:
        """Stop parsing what the peer sent (a server's flood guard says so)."""
        return False

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
            _release_ticket(call)
            error = lost(call, self.peer, reason, client_side=self.client_side)
            events.append(self._ended(call, EndCause.LOST, error))
        return events

    # -- sending ---------------------------------------------------------------------------

    def ping(self) -> None:
        """Queue an HTTP/2 PING: a live peer acknowledges it at once, whatever it is doing."""
        if self.closed_reason is None:
            self._pings += 1
            self._h2.ping(self._pings.to_bytes(8, "big"))

    def send_message(self, stream_id: int, message: Body) -> bool:
        """Queue one message on a streaming call (a server's first sends the headers).

        Returns True when the message is all in h2's hands, False when part of it
        waits for the peer's window (an `OutboxDrained` event follows); a sender
        that respects flow control waits for it before sending more. A call that
        is gone (reset, ended) takes nothing and returns True.

        Raises:
            GrpcError: RESOURCE_EXHAUSTED, the message is over the send limit.
        """
        if len(message) > self.max_send_message_bytes:
            raise too_large(len(message), self.max_send_message_bytes, "sent")
        call = self._calls.get(stream_id)
        if call is None or call.outbound >= HalfState.CLOSED or call.end_pending:
            return True
        try:
            if call.outbound is HalfState.IDLE:  # a server's first message
                self._h2.send_headers(stream_id, response_headers(message))
                call.advance_outbound(Step.HEADERS)
            self._outbound.queue(call, message, end=False)
        except SEND_FAILURES:
            self._drop(call)
            return True
        return not call.outbox

    # -- receiving (what both ends do alike) ------------------------------------------------

    def _on_data(self, event: http2.DataReceived, events: list[Event]) -> None:
        stream_id = event.stream_id
        data = event.data
        if not data and not event.stream_ended:
            self._empty_data()
        unacknowledged = self._unacknowledged
        unacknowledged[stream_id] = unacknowledged.get(stream_id, 0) + event.flow_controlled_length
        call = self._calls.get(stream_id)
        if call is None or call.inbound is not HalfState.OPEN or call.status is not None:
            return
        decoder = call.decoder
        try:
            messages = decoder.feed(data or b"")
        except RsgwError as exc:
            self._fail(call, exc, events)
            return
        # The half is OPEN (checked above), where a message leaves it as it is.
        for message in messages:
            events.append(MessageReceived(stream_id, message))
        if messages and call.ticket is not None:  # the message it was for is whole
            unacknowledged[stream_id] += call.owed  # the window held back, given back now
            _release_ticket(call)
        if decoder.buffered > LARGE_UNFINISHED_BYTES:
            self._holding_large(call, events)

    def _empty_data(self) -> None:
        """An empty DATA frame that ends nothing came (a server counts it against the
        client's flood budget)."""

    def _holding_large(self, call: Call, events: list[Event]) -> None:
        """`call` holds over `LARGE_UNFINISHED_BYTES` of a message not yet whole (a
        server checks the connection's total)."""

    def _on_end(self, event: http2.StreamEnded, events: list[Event]) -> None:
        call = self._calls.get(event.stream_id)
        if call is None or call.inbound >= HalfState.CLOSED:
            return
        call.advance_inbound(Step.END)
        if call.decoder.at_boundary:
            self._inbound_ended(call, events)
        else:
            self._fail(call, _incomplete(), events)

    def _on_reset(self, event: http2.StreamReset, events: list[Event]) -> None:
        stream_id = event.stream_id
        call = self._calls.pop(stream_id, None)
        self._outbound.forget(stream_id)
        if call is None:
            return
        call.reset()
        _release_ticket(call)
        self._goaway_if_idle()
        code = int(event.error_code or 0)
        cause, error = reset_by_peer(call, code, self.peer, client_side=self.client_side)
        events.append(self._ended(call, cause, error))

    def _on_window(self, event: http2.Event, events: list[Event]) -> None:
        for stream_id in self._outbound.resume():
            events.append(OutboxDrained(stream_id))

    def _on_goaway(self, event: http2.ConnectionTerminated, events: list[Event]) -> None:
        """The peer takes no new calls on this connection."""
        last_stream_id = event.last_stream_id or 0
        if self.state is ConnectionState.ACTIVE:
            self.state = ConnectionState.DRAINING
        self._past_goaway(last_stream_id, events)
        events.append(ConnectionTerminated(last_stream_id, int(event.error_code or 0)))

    # -- what each end does its own way -------------------------------------------------------

    def _inbound_ended(self, call: Call, events: list[Event]) -> None:
        """The peer's half ended cleanly (END_STREAM on a message boundary)."""
        raise NotImplementedError

    def _fail(self, call: Call, error: RsgwError, events: list[Event]) -> None:
        """We end a call ourselves (a bad or oversized message): tell both sides."""
        raise NotImplementedError

    def _past_goaway(self, last_stream_id: int, events: list[Event]) -> None:
        """The peer's GOAWAY named `last_stream_id` (only a client has calls past it)."""

    def _after_outbound_end(self, call: Call) -> None:
        """Our half has just ended; a call whose other half has too is over."""
        if call.inbound >= HalfState.CLOSED:
            self._forget(call)

    # -- bookkeeping ------------------------------------------------------------------------

    def _acknowledge(self, events: list[Event]) -> None:
        """Hand back the window for every DATA byte consumed, once per read.

        Per read rather than per frame: a 1 MiB message is 64 frames of 16 KiB, and
        h2's flow-control bookkeeping is per call. Bytes of calls we already ended
        are acknowledged too, so one bad call never starves the connection.
        """
        pending, self._unacknowledged = self._unacknowledged, {}
        for stream_id, size in pending.items():
            self._h2.acknowledge_received_data(size, stream_id)

    def _reset_stream(self, call: Call, code: http2.ErrorCodes) -> None:
        with contextlib.suppress(*SEND_FAILURES):
            self._h2.reset_stream(call.stream_id, code)
        self._drop(call)

    def _drop(self, call: Call) -> None:
        """Forget a call whose stream is gone (reset, or closed under a send)."""
        if call.inbound < HalfState.CLOSED or call.outbound < HalfState.CLOSED:
            call.reset()
        self._calls.pop(call.stream_id, None)
        _release_ticket(call)
        self._outbound.forget(call.stream_id)
        self._goaway_if_idle()

    def _forget(self, call: Call) -> None:
        """A call that is over leaves the books (its outbox drained, or dropped already)."""
        self._calls.pop(call.stream_id, None)
        _release_ticket(call)
        if self._going_away:
            self._goaway_if_idle()

    def _goaway_if_idle(self) -> None:
        if self._going_away and not self._calls and self.state is not ConnectionState.CLOSED:
            self.state = ConnectionState.CLOSED
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.close_connection()

    def _ended(self, call: Call, cause: EndCause, error: RsgwError | None) -> CallEnded:
        return CallEnded(call.stream_id, cause, error, call.response_started)


def _release_ticket(call: Call) -> None:
    """The call's unfinished message no longer needs its share of the upload budget."""
    ticket = call.ticket
    if ticket is not None:
        call.ticket = None
        call.owed = 0
        ticket.release()


def _incomplete() -> GrpcError:
    return GrpcError(StatusCode.INTERNAL, "stream ended in the middle of a message")
