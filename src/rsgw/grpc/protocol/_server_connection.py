"""The server's end of a gRPC connection, without I/O (see `rsgw.grpc.protocol._connection`).

What only a server does: accept calls (a request's headers checked as gRPC's, or
answered and forgotten), answer them (a unary answer in one go, or a stream of
messages and then a status), stop a client's upload once the answer has gone, and
go away gracefully: `go_away()` refuses new streams (REFUSED_STREAM, which clients
retry safely elsewhere) and sends GOAWAY after the last answer. h2 refuses to send
anything after its GOAWAY, so it cannot be announced first.

With an upload budget (`rsgw.base._uploads`), a request message that does not arrive in
one read asks for a ticket for its declared size, and its stream gets no more window
until the ticket is granted: the client then waits in its own flow control, and the
connection's other calls go on (the connection's window is always given back).
Without one, each connection's unfinished bytes are bounded by failing the call that
takes them over `max_buffered_bytes`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from rsgw.base._body import Body
from rsgw.base._errors import GrpcError, RsgwError
from rsgw.base._limits import (
    ENHANCE_YOUR_CALM,
    RESET_COST,
    ConnectionLimits,
    FloodGuard,
    header_list_size,
)
from rsgw.base._status import StatusCode
from rsgw.base._uploads import Share, Ticket, UploadBudget, unfinished_refusal
from rsgw.grpc.protocol._calls import (
    Call,
    CallStarted,
    EndCause,
    Event,
    HalfClosed,
    HalfState,
    Step,
)
from rsgw.grpc.protocol._connection import ConnectionState, GrpcConnection
from rsgw.grpc.protocol._flow import SEND_FAILURES
from rsgw.grpc.protocol._framing import MessageDecoder, too_large
from rsgw.grpc.protocol._metadata import (
    HeaderBlock,
    parse_request_headers,
    response_headers,
    status_trailers,
    trailers_only,
)
from rsgw.http2 import _http2 as http2

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class ServerConnection(GrpcConnection):
    """A server's connection: calls come in as `CallStarted`; see the module docstring."""

    client_side = False

    def __init__(
        self,
        *,
        limits: ConnectionLimits | None = None,
        gather_paths: frozenset[bytes] = frozenset(),
        upload_budget: UploadBudget | None = None,
        **options: Any,
    ) -> None:
        options.setdefault("peer", "the client")
        self.limits = ConnectionLimits() if limits is None else limits
        #: Methods whose large requests arrive `Gathered` (the pass-through ones).
        self.gather_paths = gather_paths
        options.setdefault("max_header_list_bytes", self.limits.max_header_list_bytes)
        super().__init__(**options)
        self._handlers[http2.RequestReceived] = self._on_request
        self.guard = FloodGuard(self.limits.flood_budget)
        for control in (http2.PingReceived, http2.PriorityUpdated):
            self._handlers[control] = self._on_control
        #: The gateway's budget of unfinished request bytes, shared by every connection.
        self.upload_budget = upload_budget
        self._share = Share(self.limits.max_buffered_bytes)
        #: Called when window held back from a call was given back outside a read (its
        #: ticket was granted as another call's bytes were freed): the shell flushes.
        self.on_window: Callable[[], None] | None = None

    def receive_data(self, data: bytes) -> list[Event]:
        events = super().receive_data(data)
        if self.guard.budget < 0 and self.closed_reason is None:
            return events + self._calm_down()
        return events

    def _overdrawn(self) -> bool:
        return self.guard.budget < 0

    # -- answering ------------------------------------------------------------------------

    def send_response(
        self,
        stream_id: int,
        message: Body | None,
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
            self.guard.sent(len(message))
            self._h2.send_headers(stream_id, response_headers(message))
            call.advance_outbound(Step.HEADERS)
            call.trailers = status_trailers(code, text, trailers)
            self._outbound.queue(call, message, end=True)
        except SEND_FAILURES:
            self._drop(call)

    def reject(self, stream_id: int, error: RsgwError) -> None:
        """Fail a call before any answer: trailers-only with the error's status."""
        self.send_response(stream_id, None, error.code, error.message, error.trailers)

    def end_call(
        self, stream_id: int, code: StatusCode, text: str = "", trailers: HeaderBlock = ()
    ) -> None:
        """End a streaming call with a status, after the messages it queued."""
        call = self._calls.get(stream_id)
        if call is None or call.outbound >= HalfState.CLOSED or call.end_pending:
            return
        if call.outbound is HalfState.IDLE:
            self.send_response(stream_id, None, code, text, trailers)
            return
        self._outbound.finish(call, status_trailers(code, text, trailers))

    def limit_streams(self, limit: int) -> None:
        """Tell the client how many calls it may have open at once from now on.

        Calls it has open already go on; it opens new ones as they end (SETTINGS, which
        h2 applies to its count once the client has acknowledged it).
        """
        if self.closed_reason is None:
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.update_settings({http2.SettingCodes.MAX_CONCURRENT_STREAMS: limit})

    def go_away(self) -> None:
        """Take no new calls; send GOAWAY as soon as the calls in flight are answered."""
        self._going_away = True
        if self.state is ConnectionState.ACTIVE:
            self.state = ConnectionState.DRAINING
        self._goaway_if_idle()

    # -- receiving ------------------------------------------------------------------------

    def send_message(self, stream_id: int, message: Body) -> bool:
        """`GrpcConnection.send_message`; the WINDOW_UPDATEs that acknowledge it are
        free (see `FloodGuard.sent`)."""
        self.guard.sent(len(message))
        return super().send_message(stream_id, message)

    def _on_control(self, event: http2.Event, events: list[Event]) -> None:
        self.guard.spend()

    def _on_window(self, event: http2.Event, events: list[Event]) -> None:
        if type(event) is http2.WindowUpdated:
            self.guard.window_update(event.delta)
        else:  # SETTINGS
            self.guard.spend()
        super()._on_window(event, events)

    def _on_reset(self, event: http2.StreamReset, events: list[Event]) -> None:
        call = self._calls.get(event.stream_id)
        # Opened and reset in the same read or the next: the rapid-reset pattern. A
        # client giving up on a call later (its deadline) costs one frame.
        rapid = call is not None and self.receives - call.opened <= 1
        self.guard.spend(RESET_COST if rapid else 1)
        super()._on_reset(event, events)

    def _empty_data(self) -> None:
        self.guard.spend()  # an empty DATA frame carries nothing but work

    def _holding_large(self, call: Call, events: list[Event]) -> None:
        """Over the connection's budget of unfinished request bytes: fail this call.

        One call may buffer its one message alone (up to the message limit); only
        what several hold at once counts against `max_buffered_bytes`. (With an upload
        budget, flow control bounds them instead: see `_acknowledge`.)
        """
        if self.upload_budget is not None:
            return
        others = sum(c.decoder.buffered for c in self._calls.values() if c is not call)
        total = others + call.decoder.buffered
        if others and total > self.limits.max_buffered_bytes:
            error = GrpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"the connection holds {total} bytes of unfinished requests, over its limit "
                f"of {self.limits.max_buffered_bytes}; send fewer large requests at once",
            )
            self._fail(call, error, events)

    def _acknowledge(self, events: list[Event]) -> None:
        """`GrpcConnection._acknowledge`, but a call whose message is unfinished and has
        no granted ticket gets no stream window back (see the module docstring)."""
        budget = self.upload_budget
        if budget is None:
            super()._acknowledge(events)
            return
        pending, self._unacknowledged = self._unacknowledged, {}
        h2 = self._h2
        calls = self._calls
        for stream_id, size in pending.items():
            call = calls.get(stream_id)
            if call is None or not call.decoder.buffered:  # no message half here: the usual
                h2.acknowledge_received_data(size, stream_id)
                continue
            h2.acknowledge_connection(size)
            ticket = call.ticket
            if ticket is None:
                ticket = self._ask(budget, call, events)
                if ticket is None:
                    continue
            if ticket.granted:
                h2.acknowledge_stream(size + call.owed, stream_id)
                call.owed = 0
            else:
                call.owed += size

    def _ask(self, budget: UploadBudget, call: Call, events: list[Event]) -> Ticket | None:
        """A ticket for `call`'s unfinished message; None: refused, the call has failed."""
        expected = call.decoder.expected
        ticket = budget.request(expected, self._share, lambda _: self._granted(call))
        if ticket is None:
            error = GrpcError(StatusCode.RESOURCE_EXHAUSTED, unfinished_refusal(expected, budget))
            self._fail(call, error, events)
            return None
        call.ticket = ticket
        return ticket

    def stalled_uploads(self, now: float, seconds: float) -> list[Event]:
        """End the calls whose granted message has not moved for `seconds` (the
        shell's sweep asks, with its clock): a client that stops sending half way
        would otherwise hold its grant, and the uploads waiting behind it, forever.
        The REST port ends a stalled body the same way."""
        events: list[Event] = []
        for call in list(self._calls.values()):
            ticket = call.ticket
            if ticket is None or not ticket.granted:
                continue
            held = call.decoder.buffered
            if held != call.held_at_look:
                call.held_at_look, call.moved_at = held, now
            elif now - call.moved_at >= seconds:
                error = GrpcError(
                    StatusCode.RESOURCE_EXHAUSTED,
                    f"the request stopped for {now - call.moved_at:.0f} s with {held} bytes of "
                    f"its {ticket.size}-byte message sent, holding the upload budget; send "
                    "messages whole",
                )
                self._fail(call, error, events)
        return events

    def _granted(self, call: Call) -> None:
        """A waiting ticket was granted: give the call the window it was owed."""
        if self._calls.get(call.stream_id) is not call or self.closed_reason is not None:
            return
        if call.owed:
            self._h2.acknowledge_stream(call.owed, call.stream_id)
            call.owed = 0
            if self.on_window is not None:
                self.on_window()

    def close(self, reason: str, error_code: int = 0) -> list[Event]:
        """End the connection ourselves: GOAWAY with `error_code`; every call ends."""
        if self.closed_reason is None:
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.close_connection(error_code=error_code)
        return self.connection_lost(reason)

    def _calm_down(self) -> list[Event]:
        """The client overdrew its flood budget: GOAWAY ENHANCE_YOUR_CALM, and we are done."""
        return self.close("sent control frames faster than its budget allows", ENHANCE_YOUR_CALM)

    def _on_request(self, event: http2.RequestReceived, events: list[Event]) -> None:
        stream_id = event.stream_id
        if self.state is not ConnectionState.ACTIVE:
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.reset_stream(stream_id, http2.ErrorCodes.REFUSED_STREAM)
            return
        self.guard.earn()
        headers = event.headers or []
        size = header_list_size(headers)
        if size > self.limits.max_header_list_bytes:
            self._answer_unregistered(stream_id, _headers_too_large(size, self.limits))
            return
        try:
            head = parse_request_headers(headers)
        except RsgwError as exc:  # not a gRPC call we can serve: answer and forget it
            self._answer_unregistered(stream_id, exc)
            return
        decoder = MessageDecoder(
            self.max_receive_message_bytes, head.encoding, head.path in self.gather_paths
        )
        call = Call(stream_id, decoder)
        call.opened = self.receives
        call.advance_inbound(Step.HEADERS)
        self._calls[stream_id] = call
        events.append(CallStarted(stream_id, head))

    def _inbound_ended(self, call: Call, events: list[Event]) -> None:
        events.append(HalfClosed(call.stream_id))
        if call.outbound >= HalfState.CLOSED:  # answered before the request ended
            self._forget(call)

    def _fail(self, call: Call, error: RsgwError, events: list[Event]) -> None:
        if call.outbound is HalfState.IDLE:
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.send_headers(
                    call.stream_id, trailers_only(error.code, error.message), end_stream=True
                )
        self._reset_stream(call, http2.ErrorCodes.NO_ERROR)
        events.append(self._ended(call, EndCause.FAILED, error))

    def _after_outbound_end(self, call: Call) -> None:
        if call.inbound is HalfState.OPEN:
            # Answered while the client still uploads: stop the upload.
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.reset_stream(call.stream_id, http2.ErrorCodes.NO_ERROR)
            call.advance_inbound(Step.RESET)
        super()._after_outbound_end(call)

    def _answer_unregistered(self, stream_id: int, error: RsgwError) -> None:
        """Answer a request we will not serve (bad headers) without ever tracking it."""
        with contextlib.suppress(*SEND_FAILURES):
            self._h2.send_headers(
                stream_id, trailers_only(error.code, error.message, error.trailers), end_stream=True
            )
            stream = self._h2.streams.get(stream_id)
            if stream is not None and stream.open:
                self._h2.reset_stream(stream_id, http2.ErrorCodes.NO_ERROR)


def _headers_too_large(size: int, limits: ConnectionLimits) -> GrpcError:
    return GrpcError(
        StatusCode.RESOURCE_EXHAUSTED,
        f"request headers of {size} bytes are over the limit of {limits.max_header_list_bytes}",
    )
