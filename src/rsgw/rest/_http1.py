"""HTTP/1.1 requests as clients commonly send them, parsed by hand; the rest is h11's.

Pure. The REST listener (`rsgw.rest._listener`) reads most requests through here:
an HTTP/1.1 request line with an origin-form target, well-formed header fields
(no obsolete line folding), one Host, at most one Content-Length and a body of
that length. That is what tritonclient, httpx, curl, perf_analyzer and h2load send,
and h11 costs about a hundred microseconds more per call than this does (measured:
docs/benchmarks.md, "REST front door"). Anything else, whether unusual or malformed
(chunked bodies, `Expect: 100-continue`, `Upgrade`, HTTP/1.0, a field that h11 would
refuse), is `UNUSUAL`: the listener then hands the connection, from that request on,
to h11, which serves it or answers the error. So this parser never has to refuse
anything itself, and it never accepts a request h11 would read differently
(tests/rest/test_http1.py checks it against h11).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE: Final = re.compile(rb"(" + _TOKEN + rb") (/[\x21-\x7e]*) HTTP/1\.1\r\n")
#: A field line: a token, a colon, optional whitespace, a value of visible characters
#: (and inner spaces and tabs), optional whitespace. h11 reads the same lines alike.
_FIELD: Final = re.compile(
    rb"("
    + _TOKEN
    + rb"):[ \t]*((?:[\x21-\x7e\x80-\xff](?:[\x20-\x7e\x80-\xff\t]*[\x21-\x7e\x80-\xff])?)?)"
    + rb"[ \t]*\r\n"
)
_DIGITS: Final = re.compile(rb"[0-9]{1,18}")
_HEAD_END = b"\r\n\r\n"
#: Fields that make a request unusual: how its body is framed or what it asks of the
#: connection is h11's to handle.
_UNUSUAL_FIELDS = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"te", b"trailer"})

#: The head is not all here yet.
NEED_DATA: Final = None


class Unusual:
    """A request this parser leaves to h11 (see the module docstring)."""


UNUSUAL: Final = Unusual()


class TooLarge:
    """A request head longer than the limit: answered 431 and the connection closed."""


TOO_LARGE: Final = TooLarge()


@dataclass(frozen=True, slots=True)
class Head:
    """A request head parsed from the front of a buffer."""

    method: bytes
    #: The request target as sent (path and query, still percent-encoded).
    target: bytes
    #: The header fields, names lower-case, values without surrounding whitespace.
    headers: list[tuple[bytes, bytes]]
    #: Where the body starts in the buffer (the head's length).
    body_start: int
    #: The body's length (0 without Content-Length).
    body_length: int
    #: The client said `Connection: close`.
    close: bool


def parse_head(buffer: bytes, max_head_bytes: int) -> Head | Unusual | TooLarge | None:
    """The request head at the front of `buffer`, `NEED_DATA` if it is not complete
    yet, `TOO_LARGE` past `max_head_bytes`, or `UNUSUAL` (h11's to read)."""
    end = buffer.find(_HEAD_END, 0, max_head_bytes + 4)
    if end < 0:
        if len(buffer) >= max_head_bytes + 4:
            return TOO_LARGE
        if b"\n\n" in buffer or b"\n\r\n" in buffer:
            return UNUSUAL  # lines that end in a bare LF: h11 reads those
        return NEED_DATA
    line = _REQUEST_LINE.match(buffer)
    if line is None:
        return UNUSUAL
    position = line.end()
    stop = end + 2
    headers: list[tuple[bytes, bytes]] = []
    length = -1
    close = False
    hosts = 0
    match = _FIELD.match
    while position < stop:
        field = match(buffer, position, stop)
        if field is None:
            return UNUSUAL
        position = field.end()
        name, value = field.group(1).lower(), field.group(2)
        if name == b"content-length":
            if length >= 0 or _DIGITS.fullmatch(value) is None:
                return UNUSUAL
            length = int(value)
        elif name == b"host":
            hosts += 1
        elif name == b"connection":
            tokens = {token.strip().lower() for token in value.split(b",")}
            if not tokens <= {b"close", b"keep-alive"}:
                return UNUSUAL
            close = b"close" in tokens
        elif name in _UNUSUAL_FIELDS:
            return UNUSUAL
        headers.append((name, value))
    if hosts != 1:
        return UNUSUAL
    return Head(line.group(1), line.group(2), headers, end + 4, max(length, 0), close)


_STATUS_LINES = {
    status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode())
    for status in HTTPStatus
}
_CLOSE = b"connection: close\r\n"


def response_bytes(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes, close: bool
) -> bytes:
    """A whole response, head and `body` (b"" for HEAD: `headers` still say the
    length a GET would have had). `headers` are the door's own, valid by construction."""
    line = _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status
    fields = b"".join([b"%s: %s\r\n" % field for field in headers])
    return b"".join((line, fields, _CLOSE if close else b"", b"\r\n", body))
