"""HTTP/2's frame handlers for one connection: what each frame received does.

One method per frame type (RFC 9113 §6), each given a whole frame's stream id, flags
and payload by `rsgw.http2._http2.Http2Connection`'s parser through `FRAME_HANDLERS`
(DATA's common case is written out in the parser itself). A handler checks the
frame, updates the streams, windows and settings, queues what the frame asks for (a
PING's ACK, a SETTINGS ACK, a reset of a closed stream) and appends h2's events;
a frame that breaks the protocol raises `ProtocolError`, which the parser turns
into GOAWAY. Header blocks are decoded here (`rsgw.http2._hpack`), CONTINUATION
frames joined first.
"""

from __future__ import annotations

from collections.abc import Callable

from rsgw.http2 import _http2_state as layout
from rsgw.http2._hpack import HpackError
from rsgw.http2._http2_events import (
    ConnectionTerminated,
    DataReceived,
    ErrorCodes,
    Event,
    Header,
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
    StreamEnded,
    StreamReset,
    TooManyStreamsError,
    TrailersReceived,
    WindowUpdated,
    _HeadersEvent,
)
from rsgw.http2._http2_send import Http2Sender
from rsgw.http2._http2_state import (
    ACK,
    DEFAULT_MAX_FRAME,
    END_HEADERS,
    END_STREAM,
    MAX_WINDOW,
    PADDED,
    PING,
    PRIORITY_FLAG,
    RESET_RECEIVED,
    RESET_SENT,
    RST_STREAM,
    SETTINGS,
    Settings,
    Stream,
)

#: The frame layouts this module packs and unpacks, bound by assignment rather than
#: imported, so that their methods are called as methods (`rsgw.http2._http2_send` says why).
GOAWAY_HEAD, SETTING, U32 = layout.GOAWAY_HEAD, layout.SETTING, layout.U32


class FrameHandlers(Http2Sender):
    """What one HTTP/2 connection does with each frame received; see the module docstring."""

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
        if self._closed.get(stream_id) != RESET_SENT:
            self._frame(RST_STREAM, 0, stream_id, U32.pack(ErrorCodes.STREAM_CLOSED))

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
        (increment,) = U32.unpack(payload)
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
        (code,) = U32.unpack(payload)
        self._forget(stream, RESET_RECEIVED)
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
            code, value = SETTING.unpack_from(payload, offset)
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
        last, code = GOAWAY_HEAD.unpack_from(payload)
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


#: Frame type -> its handler, called with the connection first (DATA is 0 ...
#: CONTINUATION is 9).
FRAME_HANDLERS: tuple[Callable[[FrameHandlers, int, int, bytes, list[Event]], None], ...] = (
    FrameHandlers._on_data,
    FrameHandlers._on_headers,
    FrameHandlers._on_priority,
    FrameHandlers._on_reset,
    FrameHandlers._on_settings,
    FrameHandlers._on_push_promise,
    FrameHandlers._on_ping,
    FrameHandlers._on_goaway,
    FrameHandlers._on_window_update,
    FrameHandlers._on_continuation,
)


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
