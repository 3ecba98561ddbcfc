"""The server's end of a gRPC connection, without I/O (see `rsgw.grpc._connection`).

What only a server does: accept calls (a request's headers checked as gRPC's, or
answered and forgotten), answer them (a unary answer in one go, or a stream of
messages and then a status), stop a client's upload once the answer has gone, and
go away gracefully: `go_away()` refuses new streams (REFUSED_STREAM, which clients
retry safely elsewhere) and sends GOAWAY after the last answer. h2 refuses to send
anything after its GOAWAY, so it cannot be announced first.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import h2.errors
import h2.events

from rsgw._errors import RsgwError
from rsgw._status import StatusCode
from rsgw.grpc._calls import Call, CallStarted, EndCause, Event, HalfClosed, HalfState, Step
from rsgw.grpc._connection import ConnectionState, GrpcConnection
from rsgw.grpc._flow import SEND_FAILURES
from rsgw.grpc._framing import MessageDecoder, too_large
from rsgw.grpc._metadata import (
    HeaderBlock,
    parse_request_headers,
    response_headers,
    status_trailers,
    trailers_only,
)

if TYPE_CHECKING:
    from typing import Any


class ServerConnection(GrpcConnection):
    """A server's connection: calls come in as `CallStarted`; see the module docstring."""

    client_side = False

    def __init__(self, **options: Any) -> None:
        options.setdefault("peer", "the client")
        super().__init__(**options)
        self._handlers[h2.events.RequestReceived] = self._on_request

    # -- answering ------------------------------------------------------------------------

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

    def go_away(self) -> None:
        """Take no new calls; send GOAWAY as soon as the calls in flight are answered."""
        self._going_away = True
        if self.state is ConnectionState.ACTIVE:
            self.state = ConnectionState.DRAINING
        self._goaway_if_idle()

    # -- receiving ------------------------------------------------------------------------

    def _on_request(self, event: h2.events.RequestReceived, events: list[Event]) -> None:
        stream_id = event.stream_id
        if self.state is not ConnectionState.ACTIVE:
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        try:
            head = parse_request_headers(event.headers or [])
        except RsgwError as exc:  # not a gRPC call we can serve: answer and forget it
            self._answer_unregistered(stream_id, exc)
            return
        call = Call(stream_id, MessageDecoder(self.max_receive_message_bytes, head.encoding))
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
        self._reset_stream(call, h2.errors.ErrorCodes.NO_ERROR)
        events.append(self._ended(call, EndCause.FAILED, error))

    def _after_outbound_end(self, call: Call) -> None:
        if call.inbound is HalfState.OPEN:
            # Answered while the client still uploads: stop the upload.
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.reset_stream(call.stream_id, h2.errors.ErrorCodes.NO_ERROR)
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
                self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
