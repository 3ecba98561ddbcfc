"""HTTP/2 for gRPC: an h2 connection configured once, and the HPACK shortcuts we use.

Sans-IO, like h2 itself: `rsgw.grpc._connection` drives the connection this
module builds, and the Trio shells move its bytes.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.settings
import hpack
import hpack.table

#: HTTP/2 flow-control windows, stream and connection (the original's 32 MiB).
DEFAULT_WINDOW_BYTES = 32 * 1024 * 1024
#: Largest DATA frame we accept; big messages then cost few frames and events.
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024
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


class _H2Connection(h2.connection.H2Connection):
    """h2's connection, remembering fewer closed streams.

    h2 keeps the last 65,536 closed streams' fates (to tell a late frame for one
    from a protocol error): on a busy long-lived connection about 14 MB that is
    never given back. A gRPC peer has at most a few hundred calls open at once, so
    a thousand is plenty.
    """

    MAX_CLOSED_STREAMS = 1024


def new_h2_connection(
    *,
    client_side: bool,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    max_concurrent_streams: int | None = None,
    max_header_list_bytes: int | None = None,
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
    conn = _H2Connection(config=config)
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
    if max_header_list_bytes is not None:
        settings[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE] = max_header_list_bytes
    if client_side:
        settings[h2.settings.SettingCodes.ENABLE_PUSH] = 0
    conn.local_settings = h2.settings.Settings(client=client_side, initial_values=settings)  # type: ignore[arg-type]  # h2's annotation is narrower than what it accepts
    conn.max_inbound_frame_size = max_frame_bytes
    conn.initiate_connection()
    if window_bytes > _INITIAL_WINDOW:
        conn.increment_flow_control_window(window_bytes - _INITIAL_WINDOW)
    return conn
