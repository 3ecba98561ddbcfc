"""Outbound DATA under HTTP/2 flow control, for `GrpcConnection`.

Sans-IO. A message goes out at once when the peer's windows (the stream's and the
connection's) and its frame size allow, which for small calls is always; what
does not fit waits in its call's outbox and leaves, in the order the calls began
waiting, whenever the peer opens a window. Nobody ever waits on a window: a
sender queues and returns, and the connection resumes the outboxes from
`receive_data`. First come first served matters for large messages: waking
every sender whenever the window opened would let whichever ran first take it
all, and starve the unlucky ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rsgw.base._body import Body, Gathered
from rsgw.grpc.protocol._calls import Call, Step
from rsgw.grpc.protocol._compression import Compressed
from rsgw.grpc.protocol._framing import message_prefix
from rsgw.http2 import _http2 as http2

if TYPE_CHECKING:
    from collections.abc import Callable

    from rsgw.grpc.protocol._metadata import HeaderBlock

#: What h2 raises when a stream went away under a send.
SEND_FAILURES = (http2.StreamClosedError, http2.ProtocolError)


class Outbound:
    """The calls' outboxes on one connection.

    Args:
        conn: the h2 connection to send on.
        ended: called once a call's outbound half has ended (its end has been sent).
        broken: called when h2 refused a send (the stream is gone).
    """

    def __init__(
        self,
        conn: http2.Http2Connection,
        *,
        ended: Callable[[Call], None],
        broken: Callable[[Call], None],
    ) -> None:
        self._h2 = conn
        self._ended = ended
        self._broken = broken
        #: Calls whose outbox waits for window, in the order they started waiting.
        self._waiting: dict[int, Call] = {}

    def queue(self, call: Call, message: Body, *, end: bool) -> None:
        """Queue one length-prefixed message, then the end of the half if `end`."""
        call.advance_outbound(Step.MESSAGE)
        total = len(message)
        prefix = message_prefix(total, isinstance(message, Compressed))
        call.end_pending = end
        if isinstance(message, Gathered):  # its pieces as they are: no join
            call.outbox += (prefix, *message.pieces)
            self._send(call)
            return
        if not call.outbox:
            # The common case, a message that fits: one frame, no outbox, no copy.
            h2conn = self._h2
            last = end and not call.trailers
            try:
                if h2conn.send_data_if_it_fits(call.stream_id, message, last, prefix):
                    if end and not last:
                        h2conn.send_headers(call.stream_id, call.trailers, end_stream=True)
                    if end:
                        self._end(call)
                    return
            except SEND_FAILURES:
                self._broken(call)
                return
        call.outbox += (prefix, memoryview(message))
        self._send(call)

    def finish(self, call: Call, trailers: HeaderBlock) -> None:
        """End the outbound half once its outbox has gone.

        With `trailers` (a server's status) or, with `()`, by END_STREAM (a client's
        half-close).
        """
        call.trailers = trailers
        call.end_pending = True
        self._send(call)

    def resume(self) -> list[int]:
        """The peer opened a window: the calls that waited first go first.

        Returns the calls whose outbox this emptied (their senders may go on).
        """
        drained: list[int] = []
        for call in list(self._waiting.values()):
            self._send(call)
            if not call.sending:
                drained.append(call.stream_id)
            elif self._h2.outbound_flow_control_window <= 0:
                break
        return drained

    def forget(self, stream_id: int | None = None) -> None:
        """Stop sending for one call, or for every call (the connection ended)."""
        if stream_id is None:
            self._waiting.clear()
        else:
            self._waiting.pop(stream_id, None)

    def _send(self, call: Call) -> None:
        try:
            self._drain(call)
        except SEND_FAILURES:
            self._waiting.pop(call.stream_id, None)
            self._broken(call)
            return
        if call.sending:
            self._waiting.setdefault(call.stream_id, call)
        else:
            self._waiting.pop(call.stream_id, None)

    def _drain(self, call: Call) -> None:
        """Send what the window allows of `call`'s outbox, then its end once it is empty."""
        h2conn = self._h2
        outbox = call.outbox
        if outbox:
            last = call.end_pending and not call.trailers
            h2conn.send_data_from(call.stream_id, outbox, end_stream=last)
            if outbox:
                return
            if last:
                self._end(call)
                return
        if call.end_pending:
            if call.trailers:
                h2conn.send_headers(call.stream_id, call.trailers, end_stream=True)
            else:
                h2conn.end_stream(call.stream_id)
            self._end(call)

    def _end(self, call: Call) -> None:
        call.end_pending = False
        call.trailers = ()
        call.advance_outbound(Step.END)
        self._ended(call)
