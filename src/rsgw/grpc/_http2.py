"""HTTP/2 for gRPC, sans-IO: frames in, events out, frames to send (RFC 9113).

Why not h2: h2 is general. Every frame becomes a hyperframe object that is formatted
for a trace log whether or not anyone logs, every stream runs an enum-driven state
machine, every event is a dataclass, and every setting goes through a validating
mapping. Profiled behind the gateway, h2 and hpack took about two thirds of the CPU of
a proxied call (docs/benchmarks.md, "Hot-path profile"). This module does what gRPC
uses of HTTP/2 and no more: frames are parsed with one `struct` call over the read
buffer, streams are a few slotted fields, windows are integers, and header blocks go
through `rsgw.grpc._hpack`'s remembering decoder. What it leaves out: server push
(refused), priorities (read and ignored), and h2's configuration knobs.

The interface is the part of h2's `H2Connection` that `rsgw.grpc._connection` uses,
with the same names and meanings (`receive_data`, `send_headers`, `send_data`,
`acknowledge_received_data`, ...), and events with h2's names and fields, so the two
can be run side by side on the same bytes (tests/grpc/test_http2.py does).

A peer that breaks the protocol gets GOAWAY with the error's code, and
`receive_data` raises `ProtocolError`: the caller ends the connection.
"""

from __future__ import annotations

import math
import struct
from collections import OrderedDict
from collections.abc import Iterable

from rsgw.grpc._hpack import HeaderDecoder, HeaderEncoder, HpackError
from rsgw.grpc._http2_events import (
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
    _HeadersEvent,
)

Header = tuple[bytes, bytes]

__all__ = [
    "INITIAL_WINDOW",
    "PREFACE",
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
    "Settings",
    "SettingsAcknowledged",
    "Stream",
    "StreamClosedError",
    "StreamEnded",
    "StreamReset",
    "TooManyStreamsError",
    "TrailersReceived",
    "WindowUpdated",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: Frame types (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
#: Flags.
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
_FRAME_HEAD = struct.Struct(">HBBBL")  # 24-bit length as H + B, type, flags, stream id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")
#: The window every connection and stream starts with (RFC 9113 §6.9.2).
INITIAL_WINDOW = 65535
MAX_WINDOW = 2**31 - 1
DEFAULT_MAX_FRAME = 16384
#: Closed streams remembered, to tell a late frame from a protocol error (h2: 65,536).
MAX_CLOSED_STREAMS = 1024
DEFAULT_MAX_HEADER_LIST_SIZE = 2**16


# -- settings and streams ------------------------------------------------------------------


class Settings:
    """One side's settings: the values in force (RFC 9113 §6.5.2 defaults)."""

    __slots__ = (
        "enable_push",
        "header_table_size",
        "initial_window_size",
        "max_concurrent_streams",
        "max_frame_size",
        "max_header_list_size",
    )

    def __init__(self) -> None:
        self.header_table_size = 4096
        self.enable_push = 1
        self.max_concurrent_streams = 2**31 - 1  # unlimited until the peer says otherwise
        self.initial_window_size = INITIAL_WINDOW
        self.max_frame_size = DEFAULT_MAX_FRAME
        self.max_header_list_size = DEFAULT_MAX_HEADER_LIST_SIZE

    _FIELDS: dict[int, str] = {
        SettingCodes.HEADER_TABLE_SIZE: "header_table_size",
        SettingCodes.ENABLE_PUSH: "enable_push",
        SettingCodes.MAX_CONCURRENT_STREAMS: "max_concurrent_streams",
        SettingCodes.INITIAL_WINDOW_SIZE: "initial_window_size",
        SettingCodes.MAX_FRAME_SIZE: "max_frame_size",
        SettingCodes.MAX_HEADER_LIST_SIZE: "max_header_list_size",
    }


class Stream:
    """One stream: which halves are open, and its two windows."""

    __slots__ = (
        "inbound",
        "local_open",
        "outbound",
        "processed",
        "remote_open",
        "remote_started",
        "stream_id",
    )

    def __init__(self, stream_id: int, send_window: int, receive_window: int) -> None:
        self.stream_id = stream_id
        self.local_open = True
        self.remote_open = True
        #: The peer has sent its headers (the next HEADERS are trailers).
        self.remote_started = False
        #: What we may still send, and what the peer may still send.
        self.outbound = send_window
        self.inbound = receive_window
        self.processed = 0

    @property
    def open(self) -> bool:
        return self.local_open or self.remote_open


#: How a remembered closed stream closed: END_STREAM both ways, or a reset we sent
#: (frames after it are the peer's in flight, ignored) or received.
_ENDED, _RESET_SENT, _RESET_RECEIVED = 0, 1, 2


class Http2Connection:
    """One HTTP/2 connection as gRPC uses it; see the module docstring.

    Args:
        client_side: which end we are (a client sends the preface and odd stream ids).
        window_bytes: the receive window of each stream and of the connection.
        max_frame_bytes: the largest frame we accept (our SETTINGS_MAX_FRAME_SIZE).
        max_concurrent_streams: our limit on the peer's open streams (None: none).
        max_header_list_bytes: our SETTINGS_MAX_HEADER_LIST_SIZE (None: 64 KiB).
    """

    def __init__(
        self,
        *,
        client_side: bool,
        window_bytes: int = INITIAL_WINDOW,
        max_frame_bytes: int = DEFAULT_MAX_FRAME,
        max_concurrent_streams: int | None = None,
        max_header_list_bytes: int | None = None,
    ) -> None:
        self.client_side = client_side
        self.local_settings = Settings()
        self.remote_settings = Settings()
        self.remote_settings.max_concurrent_streams = 100  # until the peer's SETTINGS
        self._announce: dict[int, int] = {
            SettingCodes.INITIAL_WINDOW_SIZE: window_bytes,
            SettingCodes.MAX_FRAME_SIZE: max_frame_bytes,
        }
        if max_concurrent_streams is not None:
            self._announce[SettingCodes.MAX_CONCURRENT_STREAMS] = max_concurrent_streams
        if max_header_list_bytes is not None:
            self._announce[SettingCodes.MAX_HEADER_LIST_SIZE] = max_header_list_bytes
        if client_side:
            self._announce[SettingCodes.ENABLE_PUSH] = 0
        #: Settings we sent that the peer has not acknowledged yet, oldest first.
        self._unacked: list[dict[int, int]] = []
        self.max_inbound_frame_size = max_frame_bytes
        self.encoder = HeaderEncoder()
        # The decoder's limit is a ceiling against header bombs (ENHANCE_YOUR_CALM, the
        # connection ends); the announced limit is enforced per call above it, so a
        # call over it fails alone (`ServerConnection`, RESOURCE_EXHAUSTED).
        self.decoder = HeaderDecoder(
            max(DEFAULT_MAX_HEADER_LIST_SIZE, 2 * (max_header_list_bytes or 0))
        )
        self.streams: dict[int, Stream] = {}
        self._closed: OrderedDict[int, int] = OrderedDict()  # (its oldest go first, in O(1))
        #: What we may send on the connection, and what the peer may.
        self.outbound_flow_control_window = INITIAL_WINDOW
        self._inbound_window = INITIAL_WINDOW
        self._inbound_target = INITIAL_WINDOW
        #: DATA bytes consumed and not yet given back (WINDOW_UPDATE).
        self._processed = 0
        self._stream_receive_window = window_bytes
        self.highest_inbound_stream_id = 0
        self._next_stream_id = 1 if client_side else 2
        self._open_outbound = 0
        self._open_inbound = 0
        self._out: list[bytes | memoryview] = []
        #: The start of a frame still incomplete: its pieces, their size, and the
        #: size at which the frame (or the preface) is whole.
        self._pending: list[bytes | memoryview] = []
        self._pending_size = 0
        self._needed = 0
        #: A DATA frame whose payload is still arriving: the bytes to come, the stream
        #: they go to (None: dropped, the stream is gone), and the frame's flags.
        self._data_left = 0
        self._data_stream: Stream | None = None
        self._data_flags = 0
        self._awaiting_preface = not client_side
        self._header_block: tuple[int, int, list[bytes]] | None = None  # (stream, flags, parts)
        self._goaway_sent = False
        self._goaway_received = False
        self._closed_by_error = False
        #: Frame type -> its handler (DATA is 0 ... CONTINUATION is 9).
        self._dispatch = (
            self._on_data,
            self._on_headers,
            self._on_priority,
            self._on_reset,
            self._on_settings,
            self._on_push_promise,
            self._on_ping,
            self._on_goaway,
            self._on_window_update,
            self._on_continuation,
        )

    # -- set-up ---------------------------------------------------------------------------

    def initiate_connection(self) -> None:
        """The preface (a client's) and our SETTINGS."""
        if self.client_side:
            self._out.append(PREFACE)
        self._send_settings(self._announce)

    def update_settings(self, new_settings: dict[int, int]) -> None:
        """Send SETTINGS; they apply to what we enforce once the peer acknowledges them."""
        self._send_settings(dict(new_settings))

    def _send_settings(self, values: dict[int, int]) -> None:
        payload = b"".join(_SETTING.pack(int(code), value) for code, value in values.items())
        self._frame(SETTINGS, 0, 0, payload)
        self._unacked.append(values)

    def increment_flow_control_window(self, increment: int, stream_id: int | None = None) -> None:
        """Open the receive window by `increment` (WINDOW_UPDATE)."""
        if stream_id:
            stream = self.streams.get(stream_id)
            if stream is None:
                raise StreamClosedError(f"stream {stream_id} is closed")
            stream.inbound += increment
        else:
            self._inbound_window += increment
            self._inbound_target += increment
        self._frame(WINDOW_UPDATE, 0, stream_id or 0, _U32.pack(increment))

    # -- bytes out ------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Everything queued for the peer since the last call."""
        out = self._out
        if not out:
            return b""
        first = out[0]
        data = first if len(out) == 1 and type(first) is bytes else b"".join(out)
        out.clear()
        return data

    def pieces_to_send(self) -> list[bytes | memoryview]:
        """What `data_to_send` would join, unjoined: for a gather write (`os.writev`),
        which spares a copy of every DATA payload."""
        out, self._out = self._out, []
        return out

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        length = len(payload)
        self._out.append(_FRAME_HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id))
        if length:
            self._out.append(payload)

    @property
    def max_outbound_frame_size(self) -> int:
        return self.remote_settings.max_frame_size

    def local_flow_control_window(self, stream_id: int) -> int:
        """How much we may send on `stream_id` now (its window and the connection's)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            raise StreamClosedError(f"stream {stream_id} is closed")
        return min(stream.outbound, self.outbound_flow_control_window)

    def get_next_available_stream_id(self) -> int:
        if self._goaway_received or self._goaway_sent:
            raise ProtocolError("the connection is going away")
        if self._next_stream_id > MAX_WINDOW:
            raise ProtocolError("stream ids are exhausted")
        return self._next_stream_id

    def send_headers(
        self, stream_id: int, headers: Iterable[Header] | bytes, end_stream: bool = False
    ) -> None:
        """HEADERS (and CONTINUATION) on `stream_id`; a client's first opens it.

        `headers` may come encoded already (`rsgw.grpc._hpack.encode_headers`)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            stream = self._open_outbound_stream(stream_id)
        elif not stream.local_open:
            raise StreamClosedError(f"stream {stream_id} is closed for sending")
        block = headers if isinstance(headers, bytes) else self.encoder.encode(headers)
        flags = END_STREAM if end_stream else 0
        size = self.remote_settings.max_frame_size
        if len(block) <= size:
            self._frame(HEADERS, flags | END_HEADERS, stream_id, block)
        else:
            self._frame(HEADERS, flags, stream_id, block[:size])
            for start in range(size, len(block), size):
                last = start + size >= len(block)
                self._frame(
                    CONTINUATION, END_HEADERS if last else 0, stream_id, block[start : start + size]
                )
        if end_stream:
            self._close_local(stream)

    def _open_outbound_stream(self, stream_id: int) -> Stream:
        if not self.client_side:
            raise ProtocolError(f"stream {stream_id} was not opened by the client")
        if stream_id != self.get_next_available_stream_id():
            raise ProtocolError(f"stream {stream_id} is not the next stream id")
        if self._open_outbound >= self.remote_settings.max_concurrent_streams:
            raise TooManyStreamsError(
                f"the peer allows {self.remote_settings.max_concurrent_streams} open streams"
            )
        self._next_stream_id += 2
        self._open_outbound += 1
        stream = Stream(
            stream_id, self.remote_settings.initial_window_size, self._stream_receive_window
        )
        self.streams[stream_id] = stream
        return stream

    def send_data(
        self,
        stream_id: int,
        data: bytes | memoryview,
        end_stream: bool = False,
        prefix: bytes = b"",
    ) -> None:
        """One DATA frame of `prefix` then `data` (sent as they are, not joined); it
        must fit the windows and the peer's frame size (else `FlowControlError`)."""
        if not self.send_data_if_it_fits(stream_id, data, end_stream, prefix):
            length = len(prefix) + len(data)
            raise FlowControlError(f"{length} bytes do not fit the windows and frame size")

    def send_data_if_it_fits(
        self,
        stream_id: int,
        data: bytes | memoryview,
        end_stream: bool = False,
        prefix: bytes = b"",
    ) -> bool:
        """`send_data` if the frame fits the windows and the peer's frame size now;
        False, with nothing sent, if it does not (a message then waits in its
        outbox). One look at the stream for both, on every unary answer's path."""
        stream = self.streams.get(stream_id)
        if stream is None or not stream.local_open:
            raise StreamClosedError(f"stream {stream_id} is closed for sending")
        length = len(prefix) + len(data)
        if (
            length > stream.outbound
            or length > self.outbound_flow_control_window
            or length > self.remote_settings.max_frame_size
        ):
            return False
        stream.outbound -= length
        self.outbound_flow_control_window -= length
        flags = END_STREAM if end_stream else 0
        out = self._out
        out.append(_FRAME_HEAD.pack(length >> 8, length & 0xFF, DATA, flags, stream_id) + prefix)
        if data:
            out.append(data)
        if end_stream:
            self._close_local(stream)
        return True

    def send_data_from(
        self, stream_id: int, pieces: list[bytes | memoryview], end_stream: bool = False
    ) -> None:
        """DATA frames of as much of `pieces` as the windows take, in frames as large
        as the peer accepts; what went is removed from `pieces` (a piece cut in two
        stays as its rest). With `end_stream`, the frame that takes the last piece
        ends the stream (nothing is sent for an empty `pieces`).

        One call frames a whole outbox: the windows are read and charged once, not
        per frame (a 1 MiB message to a peer with 16 KiB frames is 64 of them).
        """
        stream = self.streams.get(stream_id)
        if stream is None or not stream.local_open:
            raise StreamClosedError(f"stream {stream_id} is closed for sending")
        window = min(stream.outbound, self.outbound_flow_control_window)
        frame_max = self.remote_settings.max_frame_size
        out = self._out
        pack = _FRAME_HEAD.pack
        count = len(pieces)
        taken = sent = 0
        full_head = pack(frame_max >> 8, frame_max & 0xFF, DATA, 0, stream_id)
        while taken < count and window > 0:
            piece = pieces[taken]
            whole = min((len(piece) - 1) // frame_max, window // frame_max)
            if whole > 0:  # full frames from inside one large piece: a view and a shared head
                view = piece if type(piece) is memoryview else memoryview(piece)
                for start in range(0, whole * frame_max, frame_max):
                    out.append(full_head)
                    out.append(view[start : start + frame_max])
                pieces[taken] = view[whole * frame_max :]
                window -= whole * frame_max
                sent += whole * frame_max
                continue
            room = window if window < frame_max else frame_max
            size = 0
            first = taken
            while taken < count:
                length = len(pieces[taken])
                if size + length > room:
                    break
                size += length
                taken += 1
            parts = pieces[first:taken]
            if size < room and taken < count:  # the frame's last part: the head of the next
                cut = room - size
                piece = pieces[taken]
                parts.append(piece[:cut])
                pieces[taken] = piece[cut:]
                size = room
            window -= size
            sent += size
            flags = END_STREAM if end_stream and taken == count else 0
            out.append(pack(size >> 8, size & 0xFF, DATA, flags, stream_id))
            out.extend(parts)
        del pieces[:taken]
        stream.outbound -= sent
        self.outbound_flow_control_window -= sent
        if end_stream and not pieces and count:
            self._close_local(stream)

    def end_stream(self, stream_id: int) -> None:
        """END_STREAM on an empty DATA frame."""
        self.send_data(stream_id, b"", end_stream=True)

    def reset_stream(self, stream_id: int, error_code: int = 0) -> None:
        """RST_STREAM: the stream is over both ways."""
        stream = self.streams.get(stream_id)
        if stream is None:
            raise StreamClosedError(f"stream {stream_id} is closed")
        self._frame(RST_STREAM, 0, stream_id, _U32.pack(error_code))
        self._forget(stream, _RESET_SENT)

    def ping(self, opaque_data: bytes) -> None:
        self._frame(PING, 0, 0, opaque_data)

    def close_connection(
        self,
        error_code: int = 0,
        additional_data: bytes | None = None,
        last_stream_id: int | None = None,
    ) -> None:
        """GOAWAY: no new streams; `last_stream_id` (default: the highest we saw)."""
        last = self.highest_inbound_stream_id if last_stream_id is None else last_stream_id
        self._frame(GOAWAY, 0, 0, _GOAWAY.pack(last, error_code) + (additional_data or b""))
        self._goaway_sent = True

    def acknowledge_received_data(self, acknowledged_size: int, stream_id: int) -> None:
        """The application consumed `acknowledged_size` bytes of `stream_id`'s DATA:
        give them back to the peer (WINDOW_UPDATE) once half a window has built up."""
        self._processed += acknowledged_size
        if self._processed >= self._inbound_target // 2:
            self._frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._processed))
            self._inbound_window += self._processed
            self._processed = 0
        stream = self.streams.get(stream_id)
        if stream is not None and stream.remote_open:
            stream.processed += acknowledged_size
            if stream.processed >= self._stream_receive_window // 2:
                self._frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.processed))
                stream.inbound += stream.processed
                stream.processed = 0

    # -- stream bookkeeping ---------------------------------------------------------------

    def _close_local(self, stream: Stream) -> None:
        stream.local_open = False
        if not stream.remote_open:
            self._forget(stream, _ENDED)

    def _close_remote(self, stream: Stream) -> None:
        stream.remote_open = False
        if not stream.local_open:
            self._forget(stream, _ENDED)

    def _forget(self, stream: Stream, how: int) -> None:
        stream.local_open = stream.remote_open = False
        if self.streams.pop(stream.stream_id, None) is None:
            return
        if (stream.stream_id % 2 == 1) == self.client_side:
            self._open_outbound -= 1
        else:
            self._open_inbound -= 1
        closed = self._closed
        closed[stream.stream_id] = how
        if len(closed) > MAX_CLOSED_STREAMS:
            closed.popitem(last=False)

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
        unpack = _FRAME_HEAD.unpack_from
        limit = self.max_inbound_frame_size
        dispatch = self._dispatch
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
                    dispatch[kind](stream_id, flags, bytes(buffer[start:position]), events)
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

    def _inbound_stream(self, stream_id: int) -> Stream | None:
        """The open stream `stream_id` names; None for one closed a while ago.

        Raises:
            ProtocolError: it names a stream that was never opened.
        """
        stream = self.streams.get(stream_id)
        if stream is not None:
            return stream
        if stream_id == 0:
            raise ProtocolError("a stream frame on stream 0")
        opened_by_us = (stream_id % 2 == 1) == self.client_side
        if opened_by_us and stream_id < self._next_stream_id:
            return None
        if not opened_by_us and stream_id <= self.highest_inbound_stream_id:
            return None
        raise ProtocolError(f"a frame on stream {stream_id}, which was never opened")

    def _stream_closed(self, stream_id: int) -> None:
        """A frame for a closed stream: ignored after our reset, else RST STREAM_CLOSED."""
        if self._closed.get(stream_id) != _RESET_SENT:
            self._frame(RST_STREAM, 0, stream_id, _U32.pack(ErrorCodes.STREAM_CLOSED))

    def _data_starts(self, stream_id: int, length: int) -> Stream | None:
        """A DATA frame of `length` bytes begins: charge the windows; the stream it is
        for, or None when nobody will read it (then it is given back at once)."""
        if length > self._inbound_window:
            raise ProtocolError("DATA over the connection window", ErrorCodes.FLOW_CONTROL_ERROR)
        self._inbound_window -= length
        stream = self._inbound_stream(stream_id)
        if stream is None or not stream.remote_open:
            self.acknowledge_received_data(length, 0)
            if stream is None:
                self._stream_closed(stream_id)
            else:
                self.reset_stream(stream_id, ErrorCodes.STREAM_CLOSED)
            return None
        if length > stream.inbound:
            raise ProtocolError("DATA over the stream window", ErrorCodes.FLOW_CONTROL_ERROR)
        stream.inbound -= length
        return stream

    def _on_data(
        self, stream_id: int, flags: int, payload: bytes | memoryview, events: list[Event]
    ) -> None:
        length = len(payload)
        stream = self._data_starts(stream_id, length)
        if stream is None:
            return
        if flags & PADDED:  # a copy: a view would keep the padding's bytes alive too
            payload = bytes(_unpad(payload))
        event = DataReceived(stream_id, payload, length)
        events.append(event)
        if flags & END_STREAM:
            self._remote_ended(stream, event, events)

    def _on_headers(self, stream_id: int, flags: int, payload: bytes, events: list[Event]) -> None:
        if flags & PADDED:
            payload = bytes(_unpad(payload))  # no copy of bytes
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise ProtocolError(
                    "HEADERS too short for its priority", ErrorCodes.FRAME_SIZE_ERROR
                )
            payload = payload[5:]
        if flags & END_HEADERS:
            self._headers_complete(stream_id, flags, payload, events)
        else:
            self._header_block = (stream_id, flags, [payload])

    def _on_continuation(
        self, stream_id: int, flags: int, payload: bytes, events: list[Event]
    ) -> None:
        block = self._header_block
        if block is None or block[0] != stream_id:
            raise ProtocolError("CONTINUATION without the HEADERS it continues")
        block[2].append(payload)
        if sum(len(part) for part in block[2]) > 4 * self.decoder.max_header_list_size:
            raise ProtocolError("a header block without end", ErrorCodes.ENHANCE_YOUR_CALM)
        if flags & END_HEADERS:
            self._header_block = None
            self._headers_complete(stream_id, block[1], b"".join(block[2]), events)

    def _headers_complete(
        self, stream_id: int, flags: int, block: bytes, events: list[Event]
    ) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            peer_opens = (stream_id % 2 == 1) != self.client_side
            if not peer_opens or stream_id <= self.highest_inbound_stream_id:
                self._decode(block)  # a late block still changes the table
                if self._inbound_stream(stream_id) is None:
                    self._stream_closed(stream_id)
                return
            if self.client_side:
                raise ProtocolError(f"the server opened stream {stream_id}")
            if self._open_inbound >= self.local_settings.max_concurrent_streams:
                raise TooManyStreamsError(
                    f"max inbound streams is {self.local_settings.max_concurrent_streams}"
                )
            headers = self._decode(block)
            self.highest_inbound_stream_id = stream_id
            self._open_inbound += 1
            stream = Stream(
                stream_id, self.remote_settings.initial_window_size, self._stream_receive_window
            )
            self.streams[stream_id] = stream
        else:
            headers = self._decode(block)
            if not stream.remote_open:
                self.reset_stream(stream_id, ErrorCodes.STREAM_CLOSED)
                return
        event: _HeadersEvent
        if not stream.remote_started:
            if self.client_side and headers and headers[0][1][:1] == b"1":
                events.append(InformationalResponseReceived(stream_id, headers))
                return
            stream.remote_started = True
            event = (
                ResponseReceived(stream_id, headers)
                if self.client_side
                else RequestReceived(stream_id, headers)
            )
        else:
            if not flags & END_STREAM:
                raise ProtocolError(f"trailers without END_STREAM on stream {stream_id}")
            event = TrailersReceived(stream_id, headers)
        events.append(event)
        if flags & END_STREAM:
            self._remote_ended(stream, event, events)

    def _remote_ended(
        self, stream: Stream, event: DataReceived | _HeadersEvent, events: list[Event]
    ) -> None:
        """END_STREAM on `event`'s frame: a `StreamEnded` after it, and the half closed."""
        ended = StreamEnded(stream.stream_id)
        event.stream_ended = ended
        events.append(ended)
        self._close_remote(stream)

    def _decode(self, block: bytes) -> list[Header]:
        try:
            return self.decoder.decode(block)
        except HpackError as exc:
            raise ProtocolError(str(exc), exc.error_code) from None

    def _on_window_update(
        self, stream_id: int, flags: int, payload: bytes, events: list[Event]
    ) -> None:
        if len(payload) != 4:
            raise ProtocolError("WINDOW_UPDATE of the wrong size", ErrorCodes.FRAME_SIZE_ERROR)
        (increment,) = _U32.unpack(payload)
        increment &= 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ProtocolError("a WINDOW_UPDATE of 0")
            window = self.outbound_flow_control_window + increment
            if window > MAX_WINDOW:
                raise ProtocolError(
                    "the connection window overflowed", ErrorCodes.FLOW_CONTROL_ERROR
                )
            self.outbound_flow_control_window = window
            events.append(WindowUpdated(0, increment))
            return
        stream = self._inbound_stream(stream_id)
        if stream is None:
            return  # closed: a late update, harmless
        if increment == 0:
            self.reset_stream(stream_id, ErrorCodes.PROTOCOL_ERROR)
            events.append(StreamReset(stream_id, ErrorCodes.PROTOCOL_ERROR, remote_reset=False))
            return
        if stream.outbound + increment > MAX_WINDOW:
            self.reset_stream(stream_id, ErrorCodes.FLOW_CONTROL_ERROR)
            events.append(StreamReset(stream_id, ErrorCodes.FLOW_CONTROL_ERROR, remote_reset=False))
            return
        stream.outbound += increment
        events.append(WindowUpdated(stream_id, increment))

    def _on_reset(self, stream_id: int, flags: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) != 4:
            raise ProtocolError("RST_STREAM of the wrong size", ErrorCodes.FRAME_SIZE_ERROR)
        stream = self._inbound_stream(stream_id)
        if stream is None:
            return
        (code,) = _U32.unpack(payload)
        self._forget(stream, _RESET_RECEIVED)
        events.append(StreamReset(stream_id, _error_code(code), remote_reset=True))

    def _on_settings(self, stream_id: int, flags: int, payload: bytes, events: list[Event]) -> None:
        if stream_id:
            raise ProtocolError("SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolError("a SETTINGS ACK with a payload", ErrorCodes.FRAME_SIZE_ERROR)
            if self._unacked:
                self._apply_local(self._unacked.pop(0))
            events.append(SettingsAcknowledged())
            return
        if len(payload) % 6:
            raise ProtocolError("SETTINGS of the wrong size", ErrorCodes.FRAME_SIZE_ERROR)
        remote = self.remote_settings
        changed: dict[int, tuple[int | None, int]] = {}
        for offset in range(0, len(payload), 6):
            code, value = _SETTING.unpack_from(payload, offset)
            name = Settings._FIELDS.get(code)
            if name is None:
                continue  # unknown settings are ignored (RFC 9113 §6.5.2)
            _check_setting(code, value)
            before = getattr(remote, name)
            if code == SettingCodes.INITIAL_WINDOW_SIZE:
                delta = value - before
                for stream in self.streams.values():
                    if stream.outbound + delta > MAX_WINDOW:
                        raise ProtocolError("a window overflowed", ErrorCodes.FLOW_CONTROL_ERROR)
                    stream.outbound += delta
            elif code == SettingCodes.HEADER_TABLE_SIZE:
                self.encoder.header_table_size = value
            setattr(remote, name, value)
            changed[code] = (before, value)
        self._frame(SETTINGS, ACK, 0)
        events.append(RemoteSettingsChanged(changed))

    def _apply_local(self, values: dict[int, int]) -> None:
        local = self.local_settings
        for code, value in values.items():
            name = Settings._FIELDS.get(code)
            if name is None:
                continue
            # (INITIAL_WINDOW_SIZE: every stream got ours from the start, a lenient
            # reading of a peer that starts sending before it applies it.)
            setattr(local, name, value)

    def _on_ping(self, stream_id: int, flags: int, payload: bytes, events: list[Event]) -> None:
        if stream_id:
            raise ProtocolError("PING on a stream")
        if len(payload) != 8:
            raise ProtocolError("PING of the wrong size", ErrorCodes.FRAME_SIZE_ERROR)
        if flags & ACK:
            events.append(PingAckReceived(payload))
            return
        self._frame(PING, ACK, 0, payload)
        events.append(PingReceived(payload))

    def _on_goaway(self, stream_id: int, flags: int, payload: bytes, events: list[Event]) -> None:
        if stream_id:
            raise ProtocolError("GOAWAY on a stream")
        if len(payload) < 8:
            raise ProtocolError("GOAWAY too short", ErrorCodes.FRAME_SIZE_ERROR)
        last, code = _GOAWAY.unpack_from(payload)
        self._goaway_received = True
        events.append(ConnectionTerminated(_error_code(code), last & 0x7FFFFFFF, payload[8:]))

    def _on_push_promise(
        self, stream_id: int, flags: int, payload: bytes, events: list[Event]
    ) -> None:
        raise ProtocolError("server push is not accepted")

    def _on_priority(self, stream_id: int, flags: int, payload: bytes, events: list[Event]) -> None:
        if stream_id == 0:
            raise ProtocolError("PRIORITY on stream 0")
        if len(payload) != 5:
            raise ProtocolError("PRIORITY of the wrong size", ErrorCodes.FRAME_SIZE_ERROR)
        events.append(PriorityUpdated(stream_id))


def _unpad(payload: bytes | memoryview) -> bytes | memoryview:
    if not payload:
        raise ProtocolError("a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolError("padding longer than the frame")
    return payload[1 : len(payload) - pad]


def _check_setting(code: int, value: int) -> None:
    if code == SettingCodes.ENABLE_PUSH and value not in (0, 1):
        raise ProtocolError(f"ENABLE_PUSH of {value}")
    if code == SettingCodes.INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
        raise ProtocolError(f"INITIAL_WINDOW_SIZE of {value}", ErrorCodes.FLOW_CONTROL_ERROR)
    if code == SettingCodes.MAX_FRAME_SIZE and not DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
        raise ProtocolError(f"MAX_FRAME_SIZE of {value}")


def _error_code(code: int) -> int:
    try:
        return ErrorCodes(code)
    except ValueError:
        return code
