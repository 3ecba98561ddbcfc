"""HTTP/2 for gRPC, sans-IO: frames in, events out, frames to send (RFC 9113).

Why not h2: h2 is general. Every frame becomes a hyperframe object that is formatted
for a trace log whether or not anyone logs, every stream runs an enum-driven state
machine, every event is a dataclass, and every setting goes through a validating
mapping. Profiled behind the gateway, h2 and hpack took about two thirds of the CPU of
a proxied call (docs/benchmarks.md, "Hot-path profile"). This module does what gRPC
uses of HTTP/2 and no more: frames are parsed with one `struct` call over the read
buffer, streams are a few slotted fields, windows are integers, and header blocks go
through `rsgw.http2._hpack`'s remembering decoder. What it leaves out: server push
(refused), priorities (read and ignored), and h2's configuration knobs.

The interface is the part of h2's `H2Connection` that `rsgw.grpc.protocol._connection` uses,
with the same names and meanings (`receive_data`, `send_headers`, `send_data`,
`acknowledge_received_data`, ...), and events with h2's names and fields, so the two
can be run side by side on the same bytes (tests/grpc/test_http2.py does).

`Http2Connection` is one class in four modules, each one idea: its state and the
frame layout (`rsgw.http2._http2_state`), what it sends (`rsgw.http2._http2_send`),
what each frame received does (`rsgw.http2._http2_handlers`), and here, the parsing
of the bytes that come in: whole frames in one pass over a read, a large DATA
frame's payload passed on as it arrives.

A peer that breaks the protocol gets GOAWAY with the error's code, and
`receive_data` raises `ProtocolError`: the caller ends the connection.
"""

from __future__ import annotations

import math

from rsgw.http2._http2_events import (
    ConnectionTerminated,
    DataReceived,
    ErrorCodes,
    Event,
    FlowControlError,
    InformationalResponseReceived,
    PingAckReceived,
    PingReceived,
    PriorityUpdated,
    ProtocolError,
    RemoteSettingsChanged,
    RequestReceived,
    ResponseReceived,
    SettingCodes,
    SettingsAcknowledged,
    StreamClosedError,
    StreamEnded,
    StreamReset,
    TooManyStreamsError,
    TrailersReceived,
    WindowUpdated,
)
from rsgw.http2._http2_handlers import FRAME_HANDLERS, FrameHandlers
from rsgw.http2._http2_state import CONTINUATION, DATA, END_STREAM, FRAME_HEAD, PADDED, PREFACE

__all__ = [
    "ConnectionTerminated",
    "DataReceived",
    "ErrorCodes",
    "Event",
    "FlowControlError",
    "Http2Connection",
    "InformationalResponseReceived",
    "PingAckReceived",
    "PingReceived",
    "PriorityUpdated",
    "ProtocolError",
    "RemoteSettingsChanged",
    "RequestReceived",
    "ResponseReceived",
    "SettingCodes",
    "SettingsAcknowledged",
    "StreamClosedError",
    "StreamEnded",
    "StreamReset",
    "TooManyStreamsError",
    "TrailersReceived",
    "WindowUpdated",
]


class Http2Connection(FrameHandlers):
    """One HTTP/2 connection as gRPC uses it; see the module docstring.

    Args:
        client_side: which end we are (a client sends the preface and odd stream ids).
        window_bytes: the receive window of each stream and of the connection.
        max_frame_bytes: the largest frame we accept (our SETTINGS_MAX_FRAME_SIZE).
        max_concurrent_streams: our limit on the peer's open streams (None: none).
        max_header_list_bytes: our SETTINGS_MAX_HEADER_LIST_SIZE (None: 64 KiB).
    """

    # -- bytes in -------------------------------------------------------------------------

    def receive_data(self, data: bytes | memoryview) -> list[Event]:
        """Parse what the peer sent; the events its complete frames make, in order.

        The bytes of a frame not yet complete wait as pieces; once it is whole, only
        that frame's bytes are joined, and the rest of the read is parsed where it
        lies (reads rarely end on a frame boundary, and joining the whole read to
        the rest of a frame would copy every byte received). A DATA frame's payload
        is a view of the read, not a copy.

        Raises:
            ProtocolError: the peer broke HTTP/2; GOAWAY is queued, the connection is over.
        """
        return self.receive_some(data, math.inf)[0]

    def receive_some(self, data: bytes | memoryview, at_least: float) -> tuple[list[Event], int]:
        """`receive_data` of `data`'s first frames: at least `at_least` bytes of them if
        there are, stopping at the first frame boundary after; the events and how many
        bytes of `data` were taken (the caller feeds the rest later).

        A caller that must look up between slices of a large read (a flood guard)
        slices it here, on frame boundaries: a slice cut inside a frame would have
        that frame joined, a copy of up to a frame's bytes per slice.
        """
        events: list[Event] = []
        taken = 0
        size = len(data)
        pending = self._pending
        while taken < size:
            if self._data_left:  # the rest of a DATA frame: passed on as it comes
                taken += self._data_piece(data, taken, events)
                continue
            if pending:  # the rest of another frame: joined, it is small
                missing = self._needed - self._pending_size
                if size - taken < missing:
                    pending.append(data[taken:] if taken else data)
                    self._pending_size += size - taken
                    return events, size
                pending.append(data[taken : taken + missing])
                taken += missing
                joined = b"".join(pending)
                pending.clear()
                self._parse(joined, events, math.inf)  # a frame, or a head asking for more
                continue
            if taken >= at_least:
                break
            taken += self._parse(data[taken:] if taken else data, events, at_least - taken)
            break
        return events, taken

    def _data_piece(self, data: bytes | memoryview, taken: int, events: list[Event]) -> int:
        """The next bytes of a DATA frame still arriving: an event, or (its stream gone)
        given back at once. Returns how many were taken."""
        count = min(self._data_left, len(data) - taken)
        self._data_left -= count
        stream = self._data_stream
        if stream is None or not count:
            return count  # (given back when the frame began)
        if not stream.remote_open:  # reset or ended since the frame began: give it back
            self.acknowledge_received_data(count, 0)
            return count
        event = DataReceived(stream.stream_id, memoryview(data)[taken : taken + count], count)
        events.append(event)
        if not self._data_left and self._data_flags & END_STREAM:
            self._remote_ended(stream, event, events)
        return count

    def _parse(self, buffer: bytes | memoryview, events: list[Event], at_least: float) -> int:
        """Parse the whole frames at the start of `buffer`, stopping at the first frame
        boundary past `at_least` bytes; keep a partial frame at its end pending.
        Returns the bytes taken (all of them unless it stopped at `at_least`)."""
        skipped = 0
        if self._awaiting_preface:
            if len(buffer) < len(PREFACE):
                if not PREFACE.startswith(bytes(buffer)):
                    self._fail("the client did not send the HTTP/2 preface")
                self._wait_for(buffer, len(PREFACE))
                return len(buffer)
            if bytes(buffer[: len(PREFACE)]) != PREFACE:
                self._fail("the client did not send the HTTP/2 preface")
            self._awaiting_preface = False
            buffer = buffer[len(PREFACE) :]
            skipped = len(PREFACE)
        position, end = 0, len(buffer)
        view = memoryview(buffer)
        unpack = FRAME_HEAD.unpack_from
        limit = self.max_inbound_frame_size
        dispatch = FRAME_HANDLERS
        streams = self.streams
        needed = 9
        try:
            while end - position >= 9 and position < at_least:
                high, low, kind, flags, stream_id = unpack(buffer, position)
                length = (high << 8) | low
                if length > limit:
                    raise ProtocolError(
                        f"a frame of {length} bytes is over our limit of {limit}",
                        ErrorCodes.FRAME_SIZE_ERROR,
                    )
                start = position + 9
                if end - start < length:
                    if kind == DATA and not flags & PADDED and self._header_block is None:
                        # Pass on what is here and the rest as it comes, rather than
                        # join a frame of up to a megabyte once it is whole.
                        stream_id &= 0x7FFFFFFF
                        self._data_stream = self._data_starts(stream_id, length)
                        self._data_flags = flags
                        self._data_left = length
                        self._data_piece(view, start, events)
                        return skipped + end
                    needed = 9 + length
                    break
                position = start + length
                stream_id &= 0x7FFFFFFF
                if self._header_block is not None and kind != CONTINUATION:
                    raise ProtocolError("a header block was interrupted by another frame")
                if kind == DATA:
                    stream = streams.get(stream_id)
                    if (
                        stream is not None
                        and stream.remote_open
                        and not flags & PADDED
                        and length <= stream.inbound
                        and length <= self._inbound_window
                    ):  # the common case, `_on_data` written out: no call per frame
                        self._inbound_window -= length
                        stream.inbound -= length
                        event = DataReceived(stream_id, view[start:position], length)
                        events.append(event)
                        if flags & END_STREAM:
                            self._remote_ended(stream, event, events)
                    else:
                        self._on_data(stream_id, flags, view[start:position], events)
                elif kind < 10:  # unknown frame types are ignored (RFC 9113 §4.1)
                    dispatch[kind](self, stream_id, flags, bytes(buffer[start:position]), events)
        except ProtocolError as exc:
            self._fail(str(exc), exc.error_code)
        if position >= at_least:
            return skipped + position
        if position < end:
            self._wait_for(buffer[position:], needed)
        return skipped + end

    def _wait_for(self, rest: bytes | memoryview, needed: int) -> None:
        """Keep `rest` until `needed` bytes are here."""
        self._pending.append(rest)
        self._pending_size = len(rest)
        self._needed = needed

    def _fail(self, message: str, code: int = ErrorCodes.PROTOCOL_ERROR) -> None:
        if not self._closed_by_error:
            self._closed_by_error = True
            self.close_connection(code)
        raise ProtocolError(message, code)
