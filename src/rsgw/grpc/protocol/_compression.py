"""gRPC message compression: gzip and deflate, and how a compressed message is carried.

Pure. A compressed message stays compressed as it passes through rsgw: the
framing wraps its payload in `Gzipped` or `Deflated` (bytes whose class says the
encoding), so a pass-through can forward it untouched and a handler that needs
the request decompresses it (`decompress`, bounded by the receive limit: a small
message that inflates past it fails RESOURCE_EXHAUSTED, as in grpc-core). What
routing needs, the head of a message, comes from `inflate_prefix`, which inflates
only as far as its caller asks.

The encodings are gRPC's: `gzip` is a gzip stream, `deflate` a zlib stream
(RFC 1950), which is what grpc-core means by it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import ClassVar

from rsgw.base._body import Body, joined
from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode

#: What rsgw's ends accept, as `grpc-accept-encoding` says it.
ACCEPT_ENCODING = b"identity,deflate,gzip"
#: The first step of `inflate_prefix`; each later step inflates four times more.
FIRST_STEP_BYTES = 1024


class Compressed(bytes):
    """A message payload compressed with `encoding` (one subclass per encoding)."""

    encoding: ClassVar[bytes]
    #: zlib's window bits for this container.
    wbits: ClassVar[int]


class Gzipped(Compressed):
    encoding = b"gzip"
    wbits = 31


class Deflated(Compressed):
    encoding = b"deflate"
    wbits = 15


#: Encodings rsgw reads and writes, by their `grpc-encoding` name.
CODECS: dict[bytes, type[Compressed]] = {b"gzip": Gzipped, b"deflate": Deflated}


def codec(name: str) -> type[Compressed] | None:
    """The codec a setting names ("gzip", "deflate"); None for "identity" or ""."""
    if name in ("", "identity", "none"):
        return None
    found = CODECS.get(name.encode())
    if found is None:
        raise ValueError(f"unknown gRPC compression {name!r}; use gzip, deflate or none")
    return found


def parse_accept(value: bytes) -> frozenset[bytes]:
    """The encodings a `grpc-accept-encoding` value lists (lower-case, trimmed)."""
    return frozenset(token.strip().lower() for token in value.split(b",") if token.strip())


def compress(payload: bytes, codec: type[Compressed]) -> Compressed:
    """`payload` compressed with `codec` (zlib's default level, as grpc-core's)."""
    engine = zlib.compressobj(wbits=codec.wbits)
    return codec(engine.compress(payload) + engine.flush())


def decompress(message: Compressed, limit: int) -> bytes:
    """The payload of `message`.

    Raises:
        GrpcError: RESOURCE_EXHAUSTED if it inflates past `limit` bytes (checked as
            it inflates: a bomb costs `limit` bytes, never more); INTERNAL if it is
            not a valid stream of its encoding.
    """
    engine = zlib.decompressobj(wbits=message.wbits)
    try:
        payload = engine.decompress(message, limit + 1)
    except zlib.error as exc:
        raise _corrupt(message, exc) from None
    if len(payload) > limit:
        raise _too_large(limit)
    if not engine.eof or engine.unused_data:
        raise _corrupt(message, "truncated or followed by garbage")
    return payload


def inflate_prefix(
    message: Compressed, length_of: Callable[[bytes, bool], int | None], limit: int
) -> bytes:
    """The head of `message`'s payload, inflating no more than it takes to find it.

    `length_of(prefix, complete)` says how long the head is, given the payload's
    first bytes (`complete`: they are all of it), or None to ask for more. Each
    step inflates four times as much as the one before.

    Raises:
        GrpcError: as `decompress`, for what was inflated.
    """
    engine = zlib.decompressobj(wbits=message.wbits)
    pending: bytes = message
    prefix = b""
    step = FIRST_STEP_BYTES
    while True:
        try:
            prefix += engine.decompress(pending, step)
        except zlib.error as exc:
            raise _corrupt(message, exc) from None
        pending = engine.unconsumed_tail
        if len(prefix) > limit:
            raise _too_large(limit)
        complete = engine.eof
        if not complete and not pending:
            raise _corrupt(message, "truncated")
        length = length_of(prefix, complete)
        if length is not None:
            return prefix[:length]
        if complete:
            raise _corrupt(message, "no message head")  # length_of must answer when complete
        step *= 4


def _too_large(limit: int) -> GrpcError:
    return GrpcError(
        StatusCode.RESOURCE_EXHAUSTED,
        f"received message larger than max when decompressed (over {limit} bytes)",
    )


def _corrupt(message: Compressed, why: object) -> GrpcError:
    return GrpcError(
        StatusCode.INTERNAL, f"failed to decompress a {message.encoding.decode()} message: {why}"
    )


def plain(message: Body, limit: int) -> bytes:
    """`message` as contiguous, uncompressed bytes: decompressed (held to `limit`
    bytes, see `decompress`) or joined, whichever it needs."""
    if isinstance(message, Compressed):
        return decompress(message, limit)
    return joined(message)
