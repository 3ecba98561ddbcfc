"""gRPC message framing: the 5-byte length prefix, reassembly, and size limits.

Pure: bytes in, messages out. A gRPC message on an HTTP/2 stream is one byte of
compression flag, four bytes of big-endian length, then the payload; DATA frames
cut that stream anywhere, so a message may arrive in many chunks and one chunk may
hold several messages.

The size limit is checked on the length prefix, before a single payload byte is
buffered: an oversized message costs us five bytes of memory and fails only its
own call (purerpc's oversized message killed every call on the connection).

A compressed message (flag 1) is accepted only on a call whose headers named an
encoding, and comes out wrapped in that encoding's `Compressed` class, still
compressed; the flag of a message sent follows its class the same way.

A decoder told to `gather` (the gateway's pass-through calls) hands a message that
arrived in several pieces over as a `Gathered` (`rsgw.base._body`), the pieces as they
came, instead of joining them: a 1 MiB tensor then crosses the gateway without ever
being made contiguous (the join was the one copy of its bytes in user space). So
what the decoder yields is a `Body`; only calls that asked for it get a `Gathered`.
"""

from __future__ import annotations

from rsgw.base._body import Body, Gathered
from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.grpc.protocol._compression import Compressed

PREFIX_BYTES = 5

#: gRPC's own default receive limit (grpc-core's GRPC_DEFAULT_MAX_RECV_MESSAGE_LENGTH).
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def message_prefix(length: int, compressed: bool = False) -> bytes:
    """The 5-byte prefix of a message of `length` bytes."""
    return (b"\x01" if compressed else b"\x00") + length.to_bytes(4, "big")


def frame_message(payload: bytes) -> bytes:
    """Prefix and payload in one buffer (flagged if `payload` is `Compressed`; a copy)."""
    return message_prefix(len(payload), isinstance(payload, Compressed)) + payload


#: Pieces smaller than this are copied into one growing buffer rather than kept as
#: views: a peer that sends a message in 1-byte DATA frames must not make us hold a
#: view object (about 200 bytes) per byte.
SMALL_PIECE_BYTES = 1024


def too_large(length: int, limit: int, what: str = "received") -> GrpcError:
    """The error for a message over the limit, worded as grpc-core words it."""
    return GrpcError(
        StatusCode.RESOURCE_EXHAUSTED,
        f"{what} message larger than max ({length} vs. {limit})",
    )


class MessageDecoder:
    """Reassembles length-prefixed messages from arbitrary chunks.

    `feed` takes the chunks in order and returns the messages it completed. The
    common case, a small message whose prefix and payload arrive in one chunk, is
    a single slice; a large message is gathered as a list of chunks and joined
    once when its last byte arrives.

    Raises `GrpcError` (RESOURCE_EXHAUSTED for a declared length over the limit,
    INTERNAL for a compressed message where no encoding was named). After an error
    the decoder is unusable; the caller fails the call.

    Args:
        compressed: the call's encoding, which compressed messages come wrapped in;
            None while the call named none.
        gather: hand an uncompressed message that arrived in several pieces over as
            a `Gathered` (see the module docstring).
    """

    __slots__ = (
        "_chunks",
        "_head",
        "_need",
        "_wrap",
        "buffered",
        "compressed",
        "gather",
        "max_message_bytes",
    )

    def __init__(
        self,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        compressed: type[Compressed] | None = None,
        gather: bool = False,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.compressed = compressed
        self.gather = gather
        self._wrap: type[Compressed] | None = None  # the current message's, if compressed
        self._head = b""  # a partial prefix (fewer than 5 bytes)
        self._need = -1  # payload bytes of the current message, -1 while reading a prefix
        self._chunks: list[bytes | bytearray | memoryview] = []
        #: Bytes of the message being gathered (0 between messages).
        self.buffered = 0

    @property
    def expected(self) -> int:
        """The declared size of the message being gathered; 0 between messages."""
        return self._need if self._need > 0 else 0

    @property
    def at_boundary(self) -> bool:
        """True when no partial message is buffered (a clean end of stream)."""
        return self._need < 0 and not self._head

    def feed(self, data: bytes | memoryview) -> list[Body]:
        """Consume one chunk (bytes, or a view of a read); return the messages it
        completed, in order, as bytes."""
        end = len(data)
        if end >= SMALL_PIECE_BYTES and 0 <= self._need > self.buffered + end:
            # A piece from the middle of a large message (most frames of one): kept.
            self._chunks.append(data)
            self.buffered += end
            return []
        out: list[Body] = []
        pos = 0
        head: bytes | memoryview
        while pos < end:
            if self._need < 0:
                if self._head or end - pos < PREFIX_BYTES:
                    take = PREFIX_BYTES - len(self._head)
                    self._head += data[pos : pos + take]
                    pos += min(take, end - pos)
                    if len(self._head) < PREFIX_BYTES:
                        break
                    head = self._head
                    self._head = b""
                else:
                    head = data[pos : pos + PREFIX_BYTES]
                    pos += PREFIX_BYTES
                wrap = None
                if head[0] != 0:
                    wrap = self._compressed_flag(head[0])
                length = int.from_bytes(head[1:5], "big")
                if length > self.max_message_bytes:
                    raise too_large(length, self.max_message_bytes)
                if length <= end - pos:  # fast path: the whole payload is here
                    payload = bytes(data[pos : pos + length])  # (a view's bytes, once)
                    out.append(payload if wrap is None else wrap(payload))
                    pos += length
                    continue
                self._wrap = wrap
                self._need = length
            take = min(self._need - self.buffered, end - pos)
            chunks = self._chunks
            if take >= SMALL_PIECE_BYTES:
                chunks.append(data[pos : pos + take])
            elif chunks and type(chunks[-1]) is bytearray:
                chunks[-1] += data[pos : pos + take]
            else:
                chunks.append(bytearray(data[pos : pos + take]))
            self.buffered += take
            pos += take
            if self.buffered == self._need:
                if self._wrap is None and self.gather and len(chunks) > 1:
                    pieces = [memoryview(c) if isinstance(c, bytearray) else c for c in chunks]
                    out.append(Gathered(pieces, self._need))
                else:
                    payload = bytes(chunks[0]) if len(chunks) == 1 else b"".join(chunks)
                    out.append(payload if self._wrap is None else self._wrap(payload))
                self._chunks = []
                self.buffered = 0
                self._need = -1
        return out

    def _compressed_flag(self, flag: int) -> type[Compressed]:
        if flag != 1:
            raise GrpcError(StatusCode.INTERNAL, f"invalid message flag {flag}")
        if self.compressed is None:
            raise GrpcError(
                StatusCode.INTERNAL,
                "compressed message received, but the call named no grpc-encoding",
            )
        return self.compressed
