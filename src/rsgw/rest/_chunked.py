"""A chunked request body (RFC 9112 §7.1), decoded strictly as it arrives.

Pure. The REST listener feeds `ChunkedBody` what it reads after a head that said
`Transfer-Encoding: chunked` (`rsgw.rest._http1`), until it is `done` or refuses.

Theory of operation. The decoder is in one of four states: reading a chunk-size line,
reading a chunk's data, reading the CRLF after the data, reading the trailer section;
the last chunk (size 0) moves it from the size line to the trailers, and the empty line
that ends the trailers makes it `done`, with the bytes after the body (a pipelined
request) in `rest`. Invariants:
- The body never exceeds `max_body_bytes`: a size line whose chunk would take it past
  the limit is refused 413 as soon as the line is read, before any of its data.
- Nothing is waited on that cannot become valid: a bare LF, a CR not followed by LF, a
  size line that does not start with a hex digit or has more than 16 of them, or a byte
  other than CRLF after a chunk's data is refused as soon as it arrives, not when the
  line ends.
- What is held besides the body is bounded: a size line by `MAX_LINE_BYTES` (400 past
  it), the trailer section by `max_trailer_bytes` (431 past it, as for a head).
Chunk extensions (`;name`, `;name=token`, `;name="quoted"`) are checked and ignored;
trailer fields are checked line by line (the head's field grammar) and ignored,
a trailer Content-Length included: the body's length is what the chunks said.
"""

from __future__ import annotations

import enum
import re
from typing import Final

from rsgw.rest._http1 import BARE_LF, FIELD, TOKEN, Refusal

#: A chunk-size line, extensions and all, is at most this long (h11 allows any length
#: up to its head limit; 4 KiB is far more than any client's extensions need).
MAX_LINE_BYTES = 4 * 1024

_TOKEN = TOKEN.pattern
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
#: An extension: `name`, `name=token` or `name="quoted"`.
_EXTENSION = _TOKEN + rb"(?:[ \t]*=[ \t]*(?:" + _TOKEN + rb"|" + _QUOTED + rb"))?"
#: A size line: 1 to 16 hex digits, then extensions, each after a `;`. RFC 9112 §7.1.1
#: allows whitespace before each `;`; we allow it before all but the first, which h11
#: refuses (and what we read, h11 must read alike).
_SIZE_LINE: Final = re.compile(
    rb"([0-9A-Fa-f]{1,16})(?:;[ \t]*" + _EXTENSION + rb"(?:[ \t]*;[ \t]*" + _EXTENSION + rb")*)?"
)
_HEX: Final = re.compile(rb"[0-9A-Fa-f]*")


class _State(enum.Enum):
    SIZE = enum.auto()
    DATA = enum.auto()
    DATA_END = enum.auto()
    TRAILERS = enum.auto()
    DONE = enum.auto()


class ChunkedBody:
    """Decodes one chunked body from the bytes `feed` is given; see the module docstring.

    Args:
        max_body_bytes: the largest body (413 past it).
        max_trailer_bytes: the largest trailer section (431 past it): the head limit.
    """

    __slots__ = (
        "_buffer",
        "_chunks",
        "_left",
        "_max_body",
        "_max_trailer",
        "_state",
        "_trailer",
        "rest",
        "size",
    )

    def __init__(self, max_body_bytes: int, max_trailer_bytes: int) -> None:
        self._max_body = max_body_bytes
        self._max_trailer = max_trailer_bytes
        self._state = _State.SIZE
        self._buffer = b""  # bytes fed and not yet consumed (part of a line)
        self._chunks: list[bytes] = []
        #: Bytes the chunks have announced so far (checked against the limit).
        self.size = 0
        self._left = 0  # of the current chunk's data
        self._trailer = 0  # bytes of trailer lines so far
        #: What followed the body, once `done`.
        self.rest = b""

    @property
    def done(self) -> bool:
        """The body is whole (`body()`), and `rest` holds what came after it."""
        return self._state is _State.DONE

    def body(self) -> bytes:
        return self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)

    def feed(self, data: bytes) -> Refusal | None:
        """Take `data`, the next bytes of the connection; a `Refusal` if the body is
        malformed or too large (the decoder is then of no further use), else None
        (check `done`)."""
        buffer = self._buffer + data if self._buffer else data
        position, refusal = self._run(buffer)
        if self._state is _State.DONE:
            self.rest, self._buffer = buffer[position:], b""
        else:
            self._buffer = buffer[position:]
        return refusal

    def _run(self, buffer: bytes) -> tuple[int, Refusal | None]:
        """Decode what `buffer` holds; where decoding stopped, and why if refused."""
        position = 0
        end = len(buffer)
        while True:
            state = self._state
            if state is _State.DATA:
                take = min(self._left, end - position)
                if take:
                    self._chunks.append(buffer[position : position + take])
                    position += take
                    self._left -= take
                if self._left:
                    return position, None
                self._state = _State.DATA_END
            elif state is _State.DATA_END:
                after = buffer[position : position + 2]
                if after != b"\r\n"[: len(after)]:
                    return position, Refusal(400, "chunk data not followed by CRLF")
                if len(after) < 2:
                    return position, None
                position += 2
                self._state = _State.SIZE
            elif state is _State.SIZE:
                line_end = buffer.find(b"\r\n", position, position + MAX_LINE_BYTES + 2)
                if line_end < 0:
                    return position, _partial_size_line(buffer[position:])
                refusal = self._size_line(buffer[position:line_end])
                if refusal is not None:
                    return position, refusal
                position = line_end + 2
            elif state is _State.TRAILERS:
                line_end = buffer.find(b"\r\n", position)
                if line_end < 0:
                    partial = buffer[position:]
                    if b"\n" in partial:
                        return position, Refusal(400, BARE_LF)
                    if b"\r" in partial[:-1]:
                        return position, Refusal(400, "CR without LF in a trailer")
                    return position, self._count_trailer(len(partial))
                if line_end == position:  # the empty line: the body is whole
                    self._state = _State.DONE
                    return position + 2, None
                refusal = self._count_trailer(line_end + 2 - position)
                if refusal is None and FIELD.fullmatch(buffer, position, line_end + 2) is None:
                    reason = BARE_LF if b"\n" in buffer[position:line_end] else "malformed trailer"
                    refusal = Refusal(400, reason)
                if refusal is not None:
                    return position, refusal
                self._trailer += line_end + 2 - position
                position = line_end + 2
            else:
                return position, None

    def _size_line(self, line: bytes) -> Refusal | None:
        """Read a whole chunk-size line (without its CRLF)."""
        match = _SIZE_LINE.fullmatch(line)
        if match is None:
            return _bad_size_line(line)
        size = int(match.group(1), 16)
        if self.size + size > self._max_body:
            # The door's wording (rsgw.rest._door.too_large).
            return Refusal(413, f"request body larger than {self._max_body} bytes")
        self.size += size
        if size:
            self._left = size
            self._state = _State.DATA
        else:
            self._state = _State.TRAILERS
        return None

    def _count_trailer(self, more: int) -> Refusal | None:
        if self._trailer + more > self._max_trailer:
            return Refusal(431, f"trailer section larger than {self._max_trailer} bytes")
        return None


def _partial_size_line(partial: bytes) -> Refusal | None:
    """A refusal for a size line without its CRLF yet if it cannot become valid."""
    if len(partial) > MAX_LINE_BYTES:
        return Refusal(400, f"chunk-size line longer than {MAX_LINE_BYTES} bytes")
    if b"\n" in partial or b"\r" in partial[:-1]:
        return Refusal(400, BARE_LF if b"\n" in partial else "CR without LF in a chunk-size line")
    return _bad_size(partial, (b"", b";", b"\r")) if partial else None


def _bad_size_line(line: bytes) -> Refusal:
    """Why a whole chunk-size line (without its CRLF) is malformed."""
    if b"\n" in line:
        return Refusal(400, BARE_LF)
    return _bad_size(line, (b"", b";")) or Refusal(400, "malformed chunk extension")


def _bad_size(line: bytes, may_follow: tuple[bytes, ...]) -> Refusal | None:
    """A refusal if `line` (a size line, or its start) does not start with 1 to 16 hex
    digits followed by one of `may_follow`."""
    digits = _HEX.match(line)
    count = digits.end() if digits else 0
    if count > 16:
        return Refusal(400, "chunk size longer than 16 hex digits")
    if count == 0 or line[count : count + 1] not in may_follow:
        return Refusal(400, "chunk size is not hexadecimal")
    return None
