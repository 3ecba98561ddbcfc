"""The client's end of a gRPC connection, without I/O (see `rsgw.grpc.protocol._connection`).

What only a client does: open calls (a unary call in one go, or a stream whose
messages and half-close follow), read the peer's response headers and status
(trailers, or a trailers-only answer, or an HTTP status where no gRPC status came),
cancel a call its caller gave up on (RST_STREAM CANCEL), and learn from a GOAWAY
which of its calls the peer never processed (those may safely go elsewhere).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from rsgw.base._body import Body
from rsgw.base._errors import GrpcError, RsgwError, WorkerUnavailable
from rsgw.base._status import StatusCode
from rsgw.grpc.protocol._calls import (
    Call,
    CallEnded,
    EndCause,
    Event,
    HalfState,
    PeerSettled,
    ResponseStarted,
    Step,
    http_status_error,
)
from rsgw.grpc.protocol._compression import CODECS, parse_accept
from rsgw.grpc.protocol._connection import ConnectionState, GrpcConnection
from rsgw.grpc.protocol._flow import SEND_FAILURES
from rsgw.grpc.protocol._framing import MessageDecoder, too_large
from rsgw.grpc.protocol._metadata import Header, parse_status
from rsgw.http2 import _http2 as http2

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


class StreamLimitReached(WorkerUnavailable):
    """The peer's SETTINGS_MAX_CONCURRENT_STREAMS is reached: no stream opened; wait for one."""


class ClientConnection(GrpcConnection):
    """A client's connection: calls go out, `CallEnded` says how each ended."""

    client_side = True

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._handlers[http2.ResponseReceived] = self._on_response_headers
        self._handlers[http2.TrailersReceived] = self._on_trailers
        #: The encodings the peer's responses say it reads (None until one says).
        self.peer_accepts: frozenset[bytes] | None = None
        self._handlers[http2.RemoteSettingsChanged] = self._on_settings
        #: The peer's first SETTINGS has arrived: its stream limit is known.
        self.settled = False

    def _on_settings(self, event: http2.RemoteSettingsChanged, events: list[Event]) -> None:
        if not self.settled:
            self.settled = True
            events.append(PeerSettled())
        self._on_window(event, events)

    # -- calling --------------------------------------------------------------------------

    def start_call(
        self, headers: Sequence[Header] | bytes, message: Body, gather: bool = False
    ) -> int:
        """Open a call, send `headers` and one message, and end the request.

        Returns the call's stream id; its outcome arrives as a `CallEnded`. With
        `gather`, a large response may arrive `Gathered` (`rsgw.base._body`).

        Raises:
            GrpcError: RESOURCE_EXHAUSTED, the message is over the send limit.
            WorkerUnavailable: the connection takes no new calls (going away,
                closed, or out of streams); no stream was opened.
        """
        if len(message) > self.max_send_message_bytes:
            raise too_large(len(message), self.max_send_message_bytes, "sent")
        call = self._open(headers)
        call.decoder.gather = gather
        self._outbound.queue(call, message, end=True)
        return call.stream_id

    def open_call(self, headers: Sequence[Header] | bytes) -> int:
        """Open a streaming call: send `headers` only; messages and the end follow.

        Raises:
            WorkerUnavailable: the connection takes no new calls.
        """
        return self._open(headers).stream_id

    def end_request(self, stream_id: int) -> None:
        """Half-close a streaming call: END_STREAM once what it queued has gone."""
        call = self._calls.get(stream_id)
        if call is not None and call.outbound is HalfState.OPEN and not call.end_pending:
            self._outbound.finish(call, ())

    def cancel(self, stream_id: int) -> None:
        """Abandon a call (the caller was cancelled): RST_STREAM CANCEL, no event."""
        call = self._calls.pop(stream_id, None)
        self._outbound.forget(stream_id)
        if call is None:
            return
        call.reset()
        if self.closed_reason is None:
            with contextlib.suppress(*SEND_FAILURES):
                self._h2.reset_stream(stream_id, http2.ErrorCodes.CANCEL)

    def _open(self, headers: Sequence[Header] | bytes) -> Call:
        if self.state is not ConnectionState.ACTIVE:
            raise WorkerUnavailable(
                f"connection to {self.peer} {self.closed_reason or 'is going away'}"
            )
        try:
            stream_id = self._h2.get_next_available_stream_id()
            self._h2.send_headers(stream_id, headers)
        except http2.TooManyStreamsError as exc:
            raise StreamLimitReached(f"{self.peer} allows no more streams now") from exc
        except http2.ProtocolError as exc:  # GOAWAY received, or out of stream ids
            raise WorkerUnavailable(f"connection to {self.peer} refused a stream: {exc}") from exc
        call = Call(stream_id, MessageDecoder(self.max_receive_message_bytes))
        call.advance_outbound(Step.HEADERS)
        self._calls[stream_id] = call
        return call

    # -- receiving ------------------------------------------------------------------------

    def _on_response_headers(self, event: http2.ResponseReceived, events: list[Event]) -> None:
        stream_id = event.stream_id
        headers = event.headers or []
        call = self._calls.get(stream_id)
        if call is None or call.inbound is not HalfState.IDLE:
            return
        call.response_started = True
        if any(name == b"grpc-status" for name, _ in headers):  # trailers-only
            self._record_status(call, headers)
            return  # the half goes IDLE -> CLOSED when the stream ends
        call.advance_inbound(Step.HEADERS)
        http_status = b""
        for name, value in headers:
            if name == b":status":
                http_status = value
            elif name == b"grpc-encoding" and value != b"identity":
                call.decoder.compressed = CODECS.get(value.strip().lower())
                if call.decoder.compressed is None:
                    call.status = GrpcError(
                        StatusCode.INTERNAL,
                        f"{self.peer} answered in an unsupported encoding {value!r}",
                    )
            elif name == b"grpc-accept-encoding" and self.peer_accepts is None:
                self.peer_accepts = parse_accept(value)
        if http_status != b"200":
            call.status = http_status_error(http_status, self.peer)
        events.append(ResponseStarted(stream_id))

    def _on_trailers(self, event: http2.TrailersReceived, events: list[Event]) -> None:
        call = self._calls.get(event.stream_id)
        if call is not None:
            self._record_status(call, event.headers or [])

    def _record_status(self, call: Call, headers: list[Header]) -> None:
        if call.status is not None or call.answered_ok:
            return
        status = parse_status(headers)
        if status.code is StatusCode.OK:
            call.answered_ok = True
        else:
            call.status = GrpcError(status.code, status.message, status.trailers)

    def _inbound_ended(self, call: Call, events: list[Event]) -> None:
        if call.status is not None:
            self._finish(call, EndCause.ANSWERED, call.status, events)
        elif call.answered_ok:
            self._finish(call, EndCause.ANSWERED, None, events)
        else:
            error = GrpcError(
                StatusCode.INTERNAL, f"{self.peer} ended a call without a grpc-status"
            )
            self._finish(call, EndCause.FAILED, error, events)

    def _fail(self, call: Call, error: RsgwError, events: list[Event]) -> None:
        self._finish(call, EndCause.FAILED, error, events)

    def _finish(
        self, call: Call, cause: EndCause, error: RsgwError | None, events: list[Event]
    ) -> None:
        if call.outbound < HalfState.CLOSED or call.inbound < HalfState.CLOSED:
            # The answer came before our request was all sent (or it was bad): stop.
            self._reset_stream(call, http2.ErrorCodes.CANCEL)
        else:
            self._calls.pop(call.stream_id, None)
        events.append(CallEnded(call.stream_id, cause, error, call.response_started))

    def _past_goaway(self, last_stream_id: int, events: list[Event]) -> None:
        """Calls past `last_stream_id` were never processed: refused, so they may go elsewhere."""
        for stream_id in [sid for sid in self._calls if sid > last_stream_id]:
            call = self._calls.pop(stream_id)
            self._outbound.forget(stream_id)
            call.reset()
            error = WorkerUnavailable(f"{self.peer} is going away; call not processed")
            events.append(self._ended(call, EndCause.REFUSED, error))
