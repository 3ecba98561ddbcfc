"""gRPC over HTTP/2 headers and trailers: parsing, building, `grpc-timeout`.

Pure. Header blocks are tuples of (bytes, bytes) because h2 runs with header
encoding off: decoding every header name and value into `str` and back costs more
than the rest of a small call's header handling put together.

Header blocks that never change (the response headers, the OK trailers) are built
once at import and reused by every call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import quote, unquote

from rsgw.base._body import Body
from rsgw.base._errors import GrpcError, clip, shown
from rsgw.base._status import StatusCode
from rsgw.grpc.protocol._compression import ACCEPT_ENCODING, CODECS, Compressed, parse_accept
from rsgw.http2._hpack import encode_headers

Header = tuple[bytes, bytes]
HeaderBlock = tuple[Header, ...]

CONTENT_TYPE = b"application/grpc"

# No grpc-accept-encoding here: optional in responses, and on every call it costs
# the gateway about 1% of its instructions (sent to the client, decoded from the
# worker). It goes with the UNIMPLEMENTED of an encoding we do not read, where
# gRPC asks for it.
RESPONSE_HEADERS: HeaderBlock = ((b":status", b"200"), (b"content-type", CONTENT_TYPE))
#: The response headers of a call whose messages are compressed, by encoding.
COMPRESSED_RESPONSE_HEADERS: dict[type[bytes], HeaderBlock] = {
    codec: (*RESPONSE_HEADERS, (b"grpc-encoding", codec.encoding)) for codec in CODECS.values()
}
OK_TRAILERS: HeaderBlock = ((b"grpc-status", b"0"),)


#: Those response headers, encoded once (`_hpack.encode_headers`), by message type.
_RESPONSE_BLOCKS: dict[type[Body], bytes] = {
    kind: encode_headers(block) for kind, block in COMPRESSED_RESPONSE_HEADERS.items()
}
_RESPONSE_BLOCK = encode_headers(RESPONSE_HEADERS)


def response_headers(first_message: Body) -> bytes:
    """The response header block (encoded) of a call whose first message is
    `first_message`: its encoding named if it is compressed."""
    return _RESPONSE_BLOCKS.get(type(first_message), _RESPONSE_BLOCK)


#: No encoding listed as accepted: identity only.
IDENTITY_ONLY: frozenset[bytes] = frozenset()

#: Headers that belong to the transport, never passed on as call metadata.
_RESERVED = frozenset(
    {
        b"content-type",
        b"te",
        b"grpc-timeout",
        b"grpc-encoding",
        b"grpc-accept-encoding",
        b"user-agent",
        b"content-length",
        b"host",
    }
)

_TIMEOUT_UNITS: dict[int, float] = {
    ord("H"): 3600.0,
    ord("M"): 60.0,
    ord("S"): 1.0,
    ord("m"): 1e-3,
    ord("u"): 1e-6,
    ord("n"): 1e-9,
}

#: The gRPC spec allows at most 8 digits in a grpc-timeout value.
_MAX_TIMEOUT_DIGITS = 99_999_999


def parse_timeout(value: bytes) -> float:
    """Seconds from a `grpc-timeout` value such as b"250m"; GrpcError if malformed."""
    if 2 <= len(value) <= 9 and value[:-1].isdigit():
        unit = _TIMEOUT_UNITS.get(value[-1])
        if unit is not None:
            return int(value[:-1]) * unit
    raise GrpcError(StatusCode.INVALID_ARGUMENT, f"malformed grpc-timeout {value!r}")


def format_timeout(seconds: float) -> bytes:
    """A `grpc-timeout` value for a remaining budget, as precise as 8 digits allow.

    Microseconds below 100 s, milliseconds below about 27 hours, then coarser
    units. The value is rounded up and is at least one unit, so a forwarded
    budget never expires earlier than the caller's own deadline.
    """
    for unit, scale in ((b"u", 1e6), (b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60), (b"H", 1 / 3600)):
        count = max(1, math.ceil(seconds * scale))
        if count <= _MAX_TIMEOUT_DIGITS:
            return str(count).encode() + unit
    return str(_MAX_TIMEOUT_DIGITS).encode() + b"H"


#: What grpc-message carries as is: printable ASCII except `%`, as gRPC specifies.
_MESSAGE_SAFE = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"


def encode_message(text: str) -> bytes:
    """Percent-encode a status message for the `grpc-message` trailer (clipped, see `clip`)."""
    return quote(clip(text), safe=_MESSAGE_SAFE, encoding="utf-8").encode("ascii")


def decode_message(value: bytes) -> str:
    """The text of a `grpc-message` trailer (percent-decoded, lenient)."""
    return unquote(value.decode("ascii", "replace"), encoding="utf-8", errors="replace")


def status_trailers(code: StatusCode, message: str, extra: HeaderBlock = ()) -> HeaderBlock:
    """The trailers that end a call with `code`."""
    if code is StatusCode.OK and not message and not extra:
        return OK_TRAILERS
    block: list[Header] = [(b"grpc-status", str(int(code)).encode())]
    if message:
        block.append((b"grpc-message", encode_message(message)))
    block.extend(extra)
    return tuple(block)


def trailers_only(code: StatusCode, message: str, extra: HeaderBlock = ()) -> HeaderBlock:
    """A complete response in one HEADERS frame: for calls that fail before any reply."""
    return RESPONSE_HEADERS + status_trailers(code, message, extra)


@dataclass(slots=True)
class RequestHead:
    """What a server needs from a request's header block."""

    path: bytes
    timeout: float | None
    metadata: HeaderBlock
    #: The encoding of the request's compressed messages (None: identity).
    encoding: type[Compressed] | None = None
    #: The encodings the client accepts for the response.
    accept: frozenset[bytes] = IDENTITY_ONLY


def unsupported_encoding(value: bytes) -> GrpcError:
    """The answer to a message encoding we do not read (with what we do, as gRPC asks)."""
    return GrpcError(
        StatusCode.UNIMPLEMENTED,
        f"message encoding {shown(value)!r} not supported",
        ((b"grpc-accept-encoding", ACCEPT_ENCODING),),
    )


def parse_request_headers(headers: list[Header]) -> RequestHead:
    """Validate a gRPC request header block and pick out what the server uses.

    Raises GrpcError for a request that is HTTP/2 but not a gRPC call we can
    serve (wrong method or content type, unsupported message encoding, malformed
    timeout). Unknown headers become call metadata.
    """
    method = path = content_type = b""
    timeout: float | None = None
    encoding: type[Compressed] | None = None
    accept = IDENTITY_ONLY
    metadata: list[Header] = []
    for name, value in headers:
        if name[:1] == b":":
            if name == b":path":
                path = value
            elif name == b":method":
                method = value
            continue
        if name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = parse_timeout(value)
        elif name == b"grpc-encoding":
            if value != b"identity":
                encoding = CODECS.get(value.strip().lower())
                if encoding is None:
                    raise unsupported_encoding(value)
        elif name == b"grpc-accept-encoding":
            accept = parse_accept(value)
        elif name not in _RESERVED:
            metadata.append((name, value))
    if method != b"POST":
        raise GrpcError(StatusCode.INTERNAL, f"gRPC requires POST, got {shown(method)!r}")
    if not content_type.startswith(CONTENT_TYPE):
        raise GrpcError(
            StatusCode.INTERNAL, f"not a gRPC request (content-type {shown(content_type)!r})"
        )
    return RequestHead(path, timeout, tuple(metadata), encoding, accept)


@dataclass(slots=True)
class ResponseStatus:
    """What a client needs from a response's trailers."""

    code: StatusCode
    message: str
    trailers: HeaderBlock


def parse_status(block: list[Header]) -> ResponseStatus:
    """The status carried by a trailer block (or a trailers-only header block)."""
    code = StatusCode.UNKNOWN
    message = ""
    seen_status = False
    extra: list[Header] = []
    for name, value in block:
        if name == b"grpc-status":
            seen_status = True
            try:
                code = StatusCode(int(value))
            except ValueError:
                code = StatusCode.UNKNOWN
        elif name == b"grpc-message":
            message = decode_message(value)
        elif name[:1] != b":" and name not in _RESERVED:
            extra.append((name, value))
    if not seen_status:
        message = message or "response ended without a grpc-status"
    return ResponseStatus(code, message, tuple(extra))
