"""HTTP/1.1 request heads, read strictly (RFC 9112), and responses written.

Pure. The REST listener (`rsgw.rest._listener`) reads every HTTP/1.x request head
through `parse_head`, and a chunked body through `rsgw.rest._chunked`; there is no
other HTTP/1.1 parser in the serving path.

Theory of operation. The request every client sends (tritonclient, httpx, curl,
perf_analyzer, h2load: HTTP/1.1, an origin-form target, well-formed fields, one
Host, at most one Content-Length) is read by two regular expressions, a request line
and a field line, and a loop that picks out five field names; that path was measured
(docs/benchmarks.md, "REST front door") and must stay as short as it is. Anything
else takes a slower path that either reads it (HTTP/1.0, an absolute-form target,
`Transfer-Encoding: chunked`, `Expect: 100-continue`) or refuses it with a `Refusal`:
a status and a one-line reason, which the listener answers with `Connection: close`
before it closes the connection.

Why refuse rather than guess. A proxy in front of the gateway frames requests by its
own reading of the head; when two readings differ (both Content-Length and
Transfer-Encoding, two Content-Lengths, a bare LF ending a line, a folded field) the
bytes one side takes for a body the other takes for a request: request smuggling.
h11, which served the unusual requests before, is lenient in several of these places
(tests/rest/test_framing.py lists each); so every such head is refused here, never
read. The invariants, which tests/rest/test_http1.py checks with h11 as the oracle:
whatever `parse_head` reads, h11 reads alike (method, target, fields, framing); where
h11 refuses, `parse_head` refuses too or waits for more of the head; a head with a
bare LF, or a complete request line that is malformed, is refused as soon as it is
seen, never waited on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
TOKEN: Final = re.compile(_TOKEN)
#: The usual request line: HTTP/1.1 and an origin-form target.
_REQUEST_LINE: Final = re.compile(rb"(" + _TOKEN + rb") (/[\x21-\x7e]*) HTTP/1\.1\r\n")
#: Any request line of the grammar (RFC 9112 §3): the slow path's.
_ANY_REQUEST_LINE: Final = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) HTTP/([0-9]\.[0-9])\r\n")
#: An absolute-form target (RFC 9112 §3.2.2): served by its path and query.
_ABSOLUTE: Final = re.compile(rb"[Hh][Tt][Tt][Pp][Ss]?://[^/?]+(.*)")
#: A field line (RFC 9110 §5.5): a token, a colon, optional whitespace, a value of
#: visible characters (and inner spaces and tabs), optional whitespace, CRLF. No
#: obs-fold, no whitespace before the colon, no control characters in the value.
FIELD: Final = re.compile(
    rb"("
    + _TOKEN
    + rb"):[ \t]*((?:[\x21-\x7e\x80-\xff](?:[\x20-\x7e\x80-\xff\t]*[\x21-\x7e\x80-\xff])?)?)"
    + rb"[ \t]*\r\n"
)
#: Content-Length: digits only, at most 18 (so it fits in 63 bits; no body we take is longer).
_DIGITS: Final = re.compile(rb"[0-9]{1,18}")
_CONTROL: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_HEAD_END = b"\r\n\r\n"
#: Fields the fast path sets aside for the slow one: they change how the body is
#: framed or what the request expects of the connection.
_FRAMING_FIELDS = frozenset({b"transfer-encoding", b"expect"})
_V11 = b"1.1"
_V10 = b"1.0"
BARE_LF = "bare LF in the request: lines end in CRLF"

#: The head is not all here yet.
NEED_DATA: Final = None


class TooLarge:
    """A request head longer than the limit: answered 431 and the connection closed."""


TOO_LARGE: Final = TooLarge()


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request refused: answered `status` with `{"error": message}`, and the
    connection closed after the answer (after a framing error, where the next request
    would start is not known)."""

    status: int
    message: str


@dataclass(frozen=True, slots=True)
class Head:
    """A request head parsed from the front of a buffer."""

    method: bytes
    #: The request's path and query as sent, still percent-encoded (of an absolute-form
    #: target, the part after the authority).
    target: bytes
    #: The header fields, names lower-case, values without surrounding whitespace.
    headers: list[tuple[bytes, bytes]]
    #: Where the body starts in the buffer (the head's length).
    body_start: int
    #: The body's length (0 without Content-Length, and when chunked).
    body_length: int
    #: The connection ends after the answer: `Connection: close`, or HTTP/1.0 without
    #: `Connection: keep-alive`.
    close: bool
    #: The body is chunked (`Transfer-Encoding: chunked`; `rsgw.rest._chunked` reads it).
    chunked: bool
    #: HTTP/1.1 `Expect: 100-continue`: answer `100 Continue` before waiting for the body.
    expect_continue: bool
    #: b"1.1" or b"1.0".
    version: bytes


def parse_head(buffer: bytes, max_head_bytes: int) -> Head | Refusal | TooLarge | None:
    """The request head at the front of `buffer`, `NEED_DATA` if it is not complete
    yet, `TOO_LARGE` past `max_head_bytes`, or a `Refusal` (see the module docstring)."""
    end = buffer.find(_HEAD_END, 0, max_head_bytes + 4)
    if end < 0:
        return _incomplete(buffer, max_head_bytes)
    line = _REQUEST_LINE.match(buffer)
    if line is not None:
        method, target, version, position = line.group(1), line.group(2), _V11, line.end()
    else:
        start = _request_line(buffer)
        if isinstance(start, Refusal):
            return start
        method, target, version, position = start
    stop = end + 2
    headers: list[tuple[bytes, bytes]] = []
    length = -1
    close = keep_alive = False
    hosts = 0
    framing = False
    match = FIELD.match
    while position < stop:
        field = match(buffer, position, stop)
        if field is None:
            return _bad_field(buffer[position : buffer.find(b"\r\n", position)])
        position = field.end()
        name, value = field.group(1).lower(), field.group(2)
        if name == b"content-length":
            if length >= 0:
                return Refusal(400, "more than one Content-Length field")
            if _DIGITS.fullmatch(value) is None:
                return Refusal(400, f"Content-Length must be 1 to 18 digits, got {_shown(value)}")
            length = int(value)
        elif name == b"host":
            hosts += 1
        elif name == b"connection":
            tokens = {token.strip().lower() for token in value.split(b",")}
            close = close or b"close" in tokens
            keep_alive = keep_alive or b"keep-alive" in tokens
        elif name in _FRAMING_FIELDS:
            framing = True
        headers.append((name, value))
    if hosts != 1 or framing or version != _V11:
        return _unusual(method, target, version, headers, end + 4, length, close, keep_alive)
    return Head(method, target, headers, end + 4, max(length, 0), close, False, False, _V11)


def _unusual(
    method: bytes,
    target: bytes,
    version: bytes,
    headers: list[tuple[bytes, bytes]],
    body_start: int,
    length: int,
    close: bool,
    keep_alive: bool,
) -> Head | Refusal:
    """The checks the usual request does not need: Host, HTTP/1.0, Transfer-Encoding,
    Expect."""
    hosts = sum(1 for name, _ in headers if name == b"host")
    if hosts > 1:
        return Refusal(400, "more than one Host field")
    if hosts == 0 and version == _V11:
        return Refusal(400, "an HTTP/1.1 request must have a Host field")
    codings = [value for name, value in headers if name == b"transfer-encoding"]
    chunked = bool(codings)
    if codings:
        if version == _V10:  # RFC 9112 §6.1: the sender cannot have meant it
            return Refusal(400, "Transfer-Encoding in an HTTP/1.0 request")
        if length >= 0:  # RFC 9112 §6.1: a proxy may have framed it by either
            return Refusal(400, "both Content-Length and Transfer-Encoding")
        if len(codings) > 1:
            return Refusal(400, "more than one Transfer-Encoding field")
        refusal = _coding(codings[0])
        if refusal is not None:
            return refusal
    expect_continue = False
    for name, value in headers:
        if name == b"expect":
            if value.lower() != b"100-continue":
                return Refusal(417, f"Expect {_shown(value)} is not supported")
            expect_continue = version == _V11  # RFC 9110 §10.1.1: HTTP/1.0 ignores it
    close = close or (version == _V10 and not keep_alive)
    return Head(
        method,
        target,
        headers,
        body_start,
        max(length, 0),
        close,
        chunked,
        expect_continue,
        version,
    )


def _coding(value: bytes) -> Refusal | None:
    """None if a Transfer-Encoding field `value` is exactly `chunked`; else why not."""
    codings = [coding.strip(b" \t").lower() for coding in value.split(b",")]
    if codings == [b"chunked"]:
        return None
    if not all(TOKEN.fullmatch(coding) for coding in codings):
        return Refusal(400, f"malformed Transfer-Encoding {_shown(value)}")
    for coding in codings:
        if coding != b"chunked":
            return Refusal(
                501,
                f"Transfer-Encoding {_shown(coding)} is not implemented; "
                "send Content-Length or chunked",
            )
    return Refusal(400, "Transfer-Encoding names chunked more than once")


def _request_line(buffer: bytes) -> tuple[bytes, bytes, bytes, int] | Refusal:
    """Method, path, version and where the fields start, of a request line the fast
    path did not take: HTTP/1.0, or an absolute-form target."""
    line = _ANY_REQUEST_LINE.match(buffer)
    if line is None:
        first = buffer[: buffer.find(b"\r\n")]
        return Refusal(400, BARE_LF if b"\n" in first else "malformed request line")
    method, target, version = line.groups()
    if version not in (_V11, _V10):
        return Refusal(505, f"HTTP/{version.decode()} is not supported; send HTTP/1.1")
    if not target.startswith(b"/"):
        absolute = _ABSOLUTE.fullmatch(target)
        if absolute is None:
            return Refusal(400, "the request target must be a path or an absolute http URI")
        target = absolute.group(1)
        if not target.startswith(b"/"):
            target = b"/" + target
    return method, target, version, line.end()


def _incomplete(buffer: bytes, max_head_bytes: int) -> Refusal | TooLarge | None:
    """`TOO_LARGE`, a `Refusal` for what is already wrong (a bare LF, a malformed
    request line), or `NEED_DATA`: never wait on a head that cannot become valid."""
    if len(buffer) >= max_head_bytes + 4:
        return TOO_LARGE
    if buffer.count(b"\n") != buffer.count(b"\r\n"):
        return Refusal(400, BARE_LF)
    if b"\r\n" in buffer:
        line = _request_line(buffer)
        if isinstance(line, Refusal):
            return line
    return NEED_DATA


def _bad_field(line: bytes) -> Refusal:
    """Why a field line is malformed, said as precisely as cheaply possible."""
    if b"\n" in line:
        return Refusal(400, BARE_LF)
    if line[:1] in (b" ", b"\t"):
        return Refusal(400, "obsolete line folding: a field line starts with whitespace")
    name, colon, value = line.partition(b":")
    if not colon:
        return Refusal(400, f"header field line without a colon: {_shown(line)}")
    if name.rstrip(b" \t") != name:
        return Refusal(400, f"whitespace between the field name {_shown(name)} and its colon")
    if TOKEN.fullmatch(name) is None:
        return Refusal(400, f"malformed field name {_shown(name)}")
    if _CONTROL.search(value):
        return Refusal(400, f"control character in the value of {_shown(name)}")
    return Refusal(400, f"malformed field {_shown(name)}")


def _shown(value: bytes) -> str:
    """`value` for an error message: at most 40 characters, bytes as latin-1."""
    text = value[:40].decode("latin-1")
    return repr(text) if not text.isprintable() or not text else text


_STATUS_LINES = {
    status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode())
    for status in HTTPStatus
}
_CLOSE = b"connection: close\r\n"
_KEEP_ALIVE = b"connection: keep-alive\r\n"
#: The interim answer to `Expect: 100-continue`.
CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


def response_bytes(
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    close: bool,
    keep_alive: bool = False,
) -> bytes:
    """A whole response, head and `body` (b"" for HEAD: `headers` still say the
    length a GET would have had). `headers` are the door's own, valid by construction.
    `keep_alive` says so to an HTTP/1.0 client, which would close otherwise."""
    line = _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status
    fields = b"".join([b"%s: %s\r\n" % field for field in headers])
    connection = _CLOSE if close else _KEEP_ALIVE if keep_alive else b""
    return b"".join((line, fields, connection, b"\r\n", body))
