"""HPACK for gRPC (RFC 7541): an encoder without a dynamic table, a remembering decoder.

The encoder never indexes: each header is the static table's entry, or a literal
"without indexing" naming the static table's name where it has one, never Huffman
coded. So a header's encoding depends on nothing but the header, and each distinct
header is encoded once and then looked up (`encode_headers`), and a block's
constant part can be encoded once by its user (a channel's request headers). It costs bytes on
the wire (a request's headers are about 150 bytes where a peer with a warm table
sends 10), which on a LAN is noise beside the CPU it saves.

The decoder is complete: indexed fields, literals of each kind, the dynamic table and
its size updates, Huffman strings (through hpack's decoding table). A header block
whose decoding changed nothing in the table decodes the same way until the table
changes, so such blocks are remembered (gRPC peers send the same few blocks over and
over).
"""

from __future__ import annotations

from collections.abc import Iterable

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

Header = tuple[bytes, bytes]

STATIC_TABLE: tuple[Header, ...] = HeaderTable.STATIC_TABLE
_STATIC_FULL = {header: index for index, header in reversed(list(enumerate(STATIC_TABLE, 1)))}
_STATIC_NAME = {name: index for index, (name, _) in reversed(list(enumerate(STATIC_TABLE, 1)))}
#: RFC 7541 §4.1: an entry's size is its name, its value and 32.
ENTRY_OVERHEAD = 32
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB


class HpackError(Exception):
    """A header block that cannot be decoded (or is too large); `error_code` for GOAWAY."""

    def __init__(self, message: str, error_code: int = COMPRESSION_ERROR) -> None:
        super().__init__(message)
        self.error_code = error_code


def encode_integer(value: int, prefix_bits: int, first: int) -> bytes:
    """`value` with an N-bit prefix, the first byte's high bits taken from `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(data: bytes) -> bytes:
    return encode_integer(len(data), 7, 0) + data


#: Headers whose values change from call to call: encoded each time, not remembered.
_VOLATILE = frozenset((b"grpc-timeout", b"grpc-message", b"content-length"))
#: The encoded names of those the static table does not name.
_VOLATILE_NAMES = {name: b"\x00" + _literal(name) for name in _VOLATILE if name not in _STATIC_NAME}


def encode_headers(headers: Iterable[Header]) -> bytes:
    """The header block of `headers` (see the module docstring: it depends on nothing
    but the headers, so a caller may encode a constant part once and keep it)."""
    known = _KNOWN
    parts = []
    for header in headers:
        encoded = known.get(header)
        if encoded is None:
            encoded = _encode(header)
        parts.append(encoded)
    return b"".join(parts)


#: Each header's encoding once computed (bounded: cleared when full).
_KNOWN: dict[Header, bytes] = {}
_MAX_KNOWN = 4096


def _encode(header: Header) -> bytes:
    name, value = header
    index = _STATIC_FULL.get(header)
    if index is not None:
        encoded = encode_integer(index, 7, 0x80)
    else:
        name_index = _STATIC_NAME.get(name)
        if name_index is not None:  # literal without indexing, indexed name
            encoded = encode_integer(name_index, 4, 0x00) + _literal(value)
        else:
            encoded = _VOLATILE_NAMES.get(name) or b"\x00" + _literal(name)
            encoded += _literal(value)
    if name not in _VOLATILE:
        if len(_KNOWN) >= _MAX_KNOWN:
            _KNOWN.clear()
        _KNOWN[header] = encoded
    return encoded


class HeaderEncoder:
    """A connection's encoder: `encode_headers`, and what the peer allows."""

    def __init__(self) -> None:
        #: What the peer allows our dynamic table (unused: we never index).
        self.header_table_size = 4096

    encode = staticmethod(encode_headers)


class HeaderDecoder:
    """Header blocks to header lists, with the peer's dynamic table.

    Args:
        max_header_list_size: the decoded list's size (names, values and 32 per
            field) above which a block is refused (`HpackError`, ENHANCE_YOUR_CALM).
    """

    _MAX_REMEMBERED = 256
    _MAX_BLOCK = 2048

    def __init__(self, max_header_list_size: int = 2**16) -> None:
        self.max_header_list_size = max_header_list_size
        #: Our SETTINGS_HEADER_TABLE_SIZE: the most the peer may make the table.
        self.max_allowed_table_size = 4096
        self._table: list[Header] = []  # newest first
        self._table_size = 0
        self._max_table_size = 4096
        self._changes = 0
        self._remembered: dict[bytes, tuple[int, list[Header]]] = {}

    def decode(self, block: bytes) -> list[Header]:
        """The headers of `block`, in order.

        Raises:
            HpackError: the block is malformed, or its list is over the size limit.
        """
        remembered = self._remembered.get(block)
        if remembered is not None and remembered[0] == self._changes:
            return list(remembered[1])
        before = self._changes
        try:
            headers = self._decode(block)
        except IndexError:
            raise HpackError("a header block ends inside a field") from None
        if self._changes == before and len(block) <= self._MAX_BLOCK:
            if len(self._remembered) >= self._MAX_REMEMBERED:
                self._remembered.clear()
            self._remembered[bytes(block)] = (before, headers)
            return list(headers)
        return headers

    def _decode(self, block: bytes) -> list[Header]:
        headers: list[Header] = []
        size = 0
        limit = self.max_header_list_size
        position, end = 0, len(block)
        while position < end:
            first = block[position]
            if first & 0x80:  # indexed field
                index, position = _integer(block, position, 7)
                header = self._entry(index)
            elif first & 0x40:  # literal with incremental indexing
                header, position = self._literal(block, position, 6)
                self._add(header)
            elif first & 0x20:  # dynamic table size update
                if headers:
                    raise HpackError("a table size update after the first field")
                new_size, position = _integer(block, position, 5)
                if new_size > self.max_allowed_table_size:
                    raise HpackError(f"a table size of {new_size}, over what we allow")
                self._max_table_size = new_size
                self._shrink()
                self._changes += 1
                continue
            else:  # literal without indexing, or never indexed
                header, position = self._literal(block, position, 4)
            size += len(header[0]) + len(header[1]) + ENTRY_OVERHEAD
            if size > limit:
                raise HpackError(f"a header list over {limit} bytes", ENHANCE_YOUR_CALM)
            headers.append(header)
        return headers

    def _entry(self, index: int) -> Header:
        if index == 0:
            raise HpackError("header index 0")
        if index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        dynamic = index - len(STATIC_TABLE) - 1
        if dynamic >= len(self._table):
            raise HpackError(f"header index {index} is not in the table")
        return self._table[dynamic]

    def _literal(self, block: bytes, position: int, prefix_bits: int) -> tuple[Header, int]:
        index, position = _integer(block, position, prefix_bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, position = _string(block, position)
        value, position = _string(block, position)
        return (name, value), position

    def _add(self, header: Header) -> None:
        self._changes += 1
        size = len(header[0]) + len(header[1]) + ENTRY_OVERHEAD
        if size > self._max_table_size:
            self._table.clear()
            self._table_size = 0
            return
        self._table.insert(0, header)
        self._table_size += size
        self._shrink()

    def _shrink(self) -> None:
        while self._table_size > self._max_table_size:
            name, value = self._table.pop()
            self._table_size -= len(name) + len(value) + ENTRY_OVERHEAD


def _integer(block: bytes, position: int, prefix_bits: int) -> tuple[int, int]:
    limit = (1 << prefix_bits) - 1
    value = block[position] & limit
    position += 1
    if value < limit:
        return value, position
    shift = 0
    while True:
        byte = block[position]
        position += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 28:
            raise HpackError("an integer too large")


def _string(block: bytes, position: int) -> tuple[bytes, int]:
    huffman = block[position] & 0x80
    length, position = _integer(block, position, 7)
    end = position + length
    if end > len(block):
        raise HpackError("a string runs past the header block")
    data = bytes(block[position:end])
    if huffman:
        try:
            data = decode_huffman(data)
        except HPACKDecodingError as exc:
            raise HpackError(f"bad Huffman coding: {exc}") from None
    return data, end
