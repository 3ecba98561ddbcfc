"""HTTP/2's sending side for one connection: set-up, headers, data, resets, GOAWAY.

What `rsgw.http2._http2.Http2Connection` sends, with h2's names and meanings
(`send_headers`, `send_data`, `reset_stream`, `acknowledge_received_data`, ...):
each call checks the stream and the windows, charges them, and queues the frames in
`Http2State`'s output, which the shell takes whole (`data_to_send`) or in pieces
for a gather write (`pieces_to_send`). Outbound DATA never waits here: a frame the
windows cannot take is refused (`send_data_if_it_fits`) or cut to what they take
(`send_data_from`), and the caller keeps the rest (`rsgw.grpc.protocol._flow`).
"""

from __future__ import annotations

from collections.abc import Iterable

from rsgw.http2 import _http2_state as layout
from rsgw.http2._http2_events import (
    FlowControlError,
    Header,
    ProtocolError,
    StreamClosedError,
    TooManyStreamsError,
)
from rsgw.http2._http2_state import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PING,
    PREFACE,
    RESET_SENT,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Http2State,
    Stream,
)

#: The frame layouts this module packs and unpacks, bound by assignment rather than
#: imported: CPython (3.11 to 3.13) compiles `NAME.method(...)` on a name bound by an
#: import as an attribute load then a call (it takes the name for a module's), which
#: makes and drops a bound method per frame; on an assigned name it is a method call.
FRAME_HEAD, GOAWAY_HEAD, SETTING, U32 = (
    layout.FRAME_HEAD,
    layout.GOAWAY_HEAD,
    layout.SETTING,
    layout.U32,
)


class Http2Sender(Http2State):
    """What one HTTP/2 connection sends; see the module docstring."""

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
        payload = b"".join(SETTING.pack(int(code), value) for code, value in values.items())
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
        self._frame(WINDOW_UPDATE, 0, stream_id or 0, U32.pack(increment))

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

        `headers` may come encoded already (`rsgw.http2._hpack.encode_headers`)."""
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
        out.append(FRAME_HEAD.pack(length >> 8, length & 0xFF, DATA, flags, stream_id) + prefix)
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
        pack = FRAME_HEAD.pack
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
        self._frame(RST_STREAM, 0, stream_id, U32.pack(error_code))
        self._forget(stream, RESET_SENT)

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
        self._frame(GOAWAY, 0, 0, GOAWAY_HEAD.pack(last, error_code) + (additional_data or b""))
        self._goaway_sent = True

    def acknowledge_received_data(self, acknowledged_size: int, stream_id: int) -> None:
        """The application consumed `acknowledged_size` bytes of `stream_id`'s DATA:
        give them back to the peer (WINDOW_UPDATE) once half a window has built up.

        `acknowledge_connection` and `acknowledge_stream` in one."""
        self.acknowledge_connection(acknowledged_size)
        self.acknowledge_stream(acknowledged_size, stream_id)

    def acknowledge_connection(self, acknowledged_size: int) -> None:
        """`acknowledge_received_data` for the connection's window only: a server that
        holds back one stream's window still gives the connection's back, so the
        calls it does not hold back never wait for the one it does."""
        self._processed += acknowledged_size
        if self._processed >= self._inbound_target // 2:
            self._frame(WINDOW_UPDATE, 0, 0, U32.pack(self._processed))
            self._inbound_window += self._processed
            self._processed = 0

    def acknowledge_stream(self, acknowledged_size: int, stream_id: int) -> None:
        """`acknowledge_received_data` for `stream_id`'s window only (bytes already given
        back to the connection)."""
        stream = self.streams.get(stream_id)
        if stream is not None and stream.remote_open:
            stream.processed += acknowledged_size
            if stream.processed >= self._stream_receive_window // 2:
                self._frame(WINDOW_UPDATE, 0, stream_id, U32.pack(stream.processed))
                stream.inbound += stream.processed
                stream.processed = 0
