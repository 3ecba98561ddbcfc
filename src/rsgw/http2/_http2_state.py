"""HTTP/2's state for one connection: the frame layout, settings, streams, queued bytes.

What every part of `rsgw.http2._http2.Http2Connection` reads and writes: the frame
head and the constants of RFC 9113, one `Settings` per side, a `Stream` of a few
slotted fields per open stream, the closed streams remembered, the windows as
integers, and the frames queued for the peer. `Http2State` holds these and the one
rule of a stream's end (closed both ways, it is forgotten and remembered as closed);
`rsgw.http2._http2_send` adds what we send, `rsgw.http2._http2_handlers` what each
frame received does, and `rsgw.http2._http2` the parsing of the bytes that come in.
The parts are one class, split by inheritance so that each reads as one idea and a
call on the hot path costs what it did in one class (no wrapper, no extra lookup).
"""

from __future__ import annotations

import struct
from collections import OrderedDict

from rsgw.http2._hpack import HeaderDecoder, HeaderEncoder
from rsgw.http2._http2_events import SettingCodes

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: Frame types (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
#: Flags.
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
FRAME_HEAD = struct.Struct(">HBBBL")  # 24-bit length as H + B, type, flags, stream id
U32 = struct.Struct(">L")
SETTING = struct.Struct(">HL")
GOAWAY_HEAD = struct.Struct(">LL")
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
ENDED, RESET_SENT, RESET_RECEIVED = 0, 1, 2


class Http2State:
    """The state of one HTTP/2 connection and its streams' bookkeeping.

    Built with `Http2Connection`'s arguments (see there); the subclasses add the
    sending, the frame handlers and the parsing.
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

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        length = len(payload)
        self._out.append(FRAME_HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id))
        if length:
            self._out.append(payload)

    # -- stream bookkeeping ---------------------------------------------------------------

    def _close_local(self, stream: Stream) -> None:
        stream.local_open = False
        if not stream.remote_open:
            self._forget(stream, ENDED)

    def _close_remote(self, stream: Stream) -> None:
        stream.remote_open = False
        if not stream.local_open:
            self._forget(stream, ENDED)

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
