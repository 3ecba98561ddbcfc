"""What the server and client shells share: one h2 connection on one Trio stream.

`H2Transport` owns the socket's send side through a single writer task (everyone
else only changes h2 state and calls `flush`), sends length-prefixed messages in
window- and frame-sized pieces, and parks senders until the peer opens its
flow-control window again. The shells own the read loop and the stream state.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import h2.config
import h2.connection
import h2.exceptions
import h2.settings
import hpack
import hpack.table
import trio

from rsgw.grpc._framing import message_prefix

if TYPE_CHECKING:
    from collections.abc import Callable

#: HTTP/2 flow-control windows, stream and connection (the original's 32 MiB).
DEFAULT_WINDOW_BYTES = 32 * 1024 * 1024
#: Largest DATA frame we accept; big messages then cost few frames and events.
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024
#: Bytes asked of the socket per read.
RECEIVE_BYTES = 256 * 1024
#: The window every HTTP/2 connection starts with (RFC 9113 §6.9.2).
_INITIAL_WINDOW = 65535


class _PlainEncoder(hpack.Encoder):
    """HPACK without Huffman coding.

    Huffman coding saves a few bytes per literal header on the wire and costs a
    pure-Python bit-twiddling loop per header value. Between a gateway and its
    workers, and to clients on a LAN, the CPU matters more than the bytes.
    """

    def encode(self, headers: object, huffman: bool = True) -> bytes:
        return super().encode(headers, huffman=False)  # type: ignore[arg-type]  # hpack accepts any header iterable


class _CountingTable(hpack.table.HeaderTable):
    """An HPACK table that counts its insertions, so a decoder can tell it changed."""

    def __init__(self) -> None:
        super().__init__()
        self.additions = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.additions += 1
        super().add(name, value)


class _MemoDecoder(hpack.Decoder):
    """HPACK decoding that remembers header blocks that left the table unchanged.

    gRPC peers send the same few header blocks over and over (a request to one
    method, the response headers, the OK trailers), and once their entries are in
    the dynamic table each is the same bytes every time. Decoding one is pure
    Python work per header (and per bit, for Huffman-coded values); a block whose
    decoding inserted nothing and resized nothing decodes the same way for as long
    as the table stays as it is, which the insertion count and the size tell.
    """

    _MAX_ENTRIES = 256
    _MAX_BLOCK = 2048

    def __init__(self) -> None:
        super().__init__()
        self.header_table = _CountingTable()
        self._memo: dict[bytes, tuple[tuple[int, int], list[hpack.HeaderTuple]]] = {}

    def decode(self, data: bytes, raw: bool = False) -> list[hpack.HeaderTuple]:
        table = self.header_table
        assert isinstance(table, _CountingTable)
        state = (table.additions, table.maxsize)
        cacheable = raw and len(data) <= self._MAX_BLOCK
        if cacheable:
            hit = self._memo.get(data)
            if hit is not None and hit[0] == state:
                return list(hit[1])
        headers = list(super().decode(data, raw))
        if cacheable and (table.additions, table.maxsize) == state:
            if len(self._memo) >= self._MAX_ENTRIES:
                self._memo.clear()
            self._memo[bytes(data)] = (state, headers)
            return list(headers)
        return headers


def new_h2_connection(
    *,
    client_side: bool,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    max_concurrent_streams: int | None = None,
) -> h2.connection.H2Connection:
    """An h2 connection configured for gRPC and already initiated.

    Header encoding, validation and normalisation are off: header blocks stay bytes
    and gRPC's fixed blocks need no checking on every call, which is most of h2's
    per-request cost. Our settings (windows, frame size, stream limit) apply from
    the first frame, and the connection window is opened to match the stream window.
    """
    config = h2.config.H2Configuration(
        client_side=client_side,
        header_encoding=None,
        validate_inbound_headers=False,
        validate_outbound_headers=False,
        normalize_inbound_headers=False,
        normalize_outbound_headers=False,
    )
    conn = h2.connection.H2Connection(config=config)
    conn.encoder = _PlainEncoder()
    decoder = _MemoDecoder()
    decoder.max_header_list_size = conn.decoder.max_header_list_size
    conn.decoder = decoder
    settings: dict[h2.settings.SettingCodes | int, int] = {
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window_bytes,
        h2.settings.SettingCodes.MAX_FRAME_SIZE: max_frame_bytes,
    }
    if max_concurrent_streams is not None:
        settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = max_concurrent_streams
    if client_side:
        settings[h2.settings.SettingCodes.ENABLE_PUSH] = 0
    conn.local_settings = h2.settings.Settings(client=client_side, initial_values=settings)  # type: ignore[arg-type]  # h2's annotation is narrower than what it accepts
    conn.max_inbound_frame_size = max_frame_bytes
    conn.initiate_connection()
    if window_bytes > _INITIAL_WINDOW:
        conn.increment_flow_control_window(window_bytes - _INITIAL_WINDOW)
    return conn


class H2Transport:
    """The send side of one HTTP/2 connection, shared by the server and the client.

    `flush` writes what h2 has queued straight to the socket when the kernel takes
    it all at once, which is nearly always: no task switch, no scheduler round. Only
    what the socket cannot take now goes to the writer task, which then owns the
    send side until its backlog is gone, so bytes never leave out of order.
    """

    def __init__(self, conn: h2.connection.H2Connection, stream: trio.abc.Stream) -> None:
        self.h2 = conn
        self.stream = stream
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self._backlog = b""
        self._sending = False
        self._flush_wanted = trio.Event()
        self._window_waiters: dict[int, trio.Event] = {}
        self._unacknowledged: dict[int, int] = {}
        self._large_sends = trio.Lock()
        #: Called after each write, e.g. to notice that a draining connection went quiet.
        self.after_write: Callable[[], None] | None = None

    def flush(self) -> None:
        """Send whatever h2 has queued, now if the socket takes it, else soon."""
        if self._sending or self._backlog or self._fd < 0:
            self._flush_wanted.set()
            return
        data = self.h2.data_to_send()
        if not data:
            return
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:  # broken or closed: the writer task meets the error through trio
            sent = 0
        if sent < len(data):
            self._backlog = data[sent:]
            self._flush_wanted.set()
        elif self.after_write is not None:
            self.after_write()

    async def run_writer(self) -> None:
        """Sends what `flush` could not; runs until cancelled or the socket breaks."""
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            data = self._backlog + self.h2.data_to_send()
            self._backlog = b""
            if data:
                self._sending = True
                try:
                    await self.stream.send_all(data)
                finally:
                    self._sending = False
            if self.after_write is not None:
                self.after_write()

    def received(self, stream_id: int, flow_controlled: int) -> None:
        """Note DATA bytes we consumed; `acknowledge` hands them back in one go."""
        self._unacknowledged[stream_id] = self._unacknowledged.get(stream_id, 0) + flow_controlled

    def acknowledge(self) -> None:
        """Return the window for everything consumed since the last call.

        Once per socket read rather than once per DATA frame: a 1 MiB message is
        64 frames of 16 KiB, and h2's flow-control bookkeeping is per call.
        """
        pending, self._unacknowledged = self._unacknowledged, {}
        for stream_id, size in pending.items():
            self.h2.acknowledge_received_data(size, stream_id)

    def window_opened(self, stream_id: int) -> None:
        """The peer sent WINDOW_UPDATE (stream 0: the connection, so wake everyone)."""
        if stream_id == 0:
            waiters = list(self._window_waiters.values())
            self._window_waiters.clear()
        else:
            one = self._window_waiters.pop(stream_id, None)
            waiters = [] if one is None else [one]
        for event in waiters:
            event.set()

    def stream_gone(self, stream_id: int) -> None:
        """Wake a sender parked on a stream that was reset; it will find it closed."""
        event = self._window_waiters.pop(stream_id, None)
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        """Wake every parked sender (the connection is going away)."""
        self.window_opened(0)

    async def send_message(self, stream_id: int, payload: bytes, *, end_stream: bool) -> None:
        """Queue one length-prefixed message on `stream_id`, waiting for window as needed.

        Raises:
            h2.exceptions.StreamClosedError: the stream was reset while we waited.
        """
        h2conn = self.h2
        total = len(payload)
        if total + 5 <= min(
            h2conn.local_flow_control_window(stream_id), h2conn.max_outbound_frame_size
        ):
            h2conn.send_data(stream_id, message_prefix(total) + payload, end_stream=end_stream)
            return
        # Messages larger than the window take turns, first come first served (trio's
        # Lock is fair). Waking every sender whenever the peer opens the window would
        # let whichever runs first take it all, at random, and starve the unlucky ones.
        async with self._large_sends:
            pending: list[bytes | memoryview] = [message_prefix(total), memoryview(payload)]
            while pending:
                window = h2conn.local_flow_control_window(stream_id)
                if window <= 0:
                    event = self._window_waiters[stream_id] = trio.Event()
                    self.flush()
                    await event.wait()
                    continue
                piece = pending[0]
                size = min(window, h2conn.max_outbound_frame_size, len(piece))
                last = size == len(piece) and len(pending) == 1
                h2conn.send_data(stream_id, piece[:size], end_stream=end_stream and last)
                if size == len(piece):
                    pending.pop(0)
                else:
                    pending[0] = piece[size:]
                if pending and h2conn.local_flow_control_window(stream_id) <= 0:
                    self.flush()
