"""gRPC message framing: the 5-byte length prefix, reassembly, and size limits.

Pure: bytes in, messages out. A gRPC message on an HTTP/2 stream is one byte of
compression flag, four bytes of big-endian length, then the payload; DATA frames
cut that stream anywhere, so a message may arrive in many chunks and one chunk may
hold several messages.

The size limit is checked on the length prefix, before a single payload byte is
buffered: an oversized message costs us five bytes of memory and fails only its
own call (purerpc's oversized message killed every call on the connection).
"""

from __future__ import annotations

from rsgw._errors import GrpcError
from rsgw._status import StatusCode

PREFIX_BYTES = 5

#: gRPC's own default receive limit (grpc-core's GRPC_DEFAULT_MAX_RECV_MESSAGE_LENGTH).
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def message_prefix(length: int) -> bytes:
    """The 5-byte prefix of an uncompressed message of `length` bytes."""
    return b"\x00" + length.to_bytes(4, "big")


def frame_message(payload: bytes) -> bytes:
    """Prefix and payload in one buffer (a copy; fine for small messages)."""
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


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
    INTERNAL for a compressed message, which we never negotiate). After an error
    the decoder is unusable; the caller fails the call.
    """

    __slots__ = ("_chunks", "_have", "_head", "_need", "max_message_bytes")

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self._head = b""  # a partial prefix (fewer than 5 bytes)
        self._need = -1  # payload bytes of the current message, -1 while reading a prefix
        self._chunks: list[bytes] = []
        self._have = 0

    @property
    def at_boundary(self) -> bool:
        """True when no partial message is buffered (a clean end of stream)."""
        return self._need < 0 and not self._head

    def feed(self, data: bytes) -> list[bytes]:
        """Consume one chunk; return the messages completed by it, in order."""
        out: list[bytes] = []
        pos = 0
        end = len(data)
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
                if head[0] != 0:
                    raise GrpcError(
                        StatusCode.INTERNAL,
                        "compressed message received, but no compression was negotiated",
                    )
                length = int.from_bytes(head[1:5], "big")
                if length > self.max_message_bytes:
                    raise too_large(length, self.max_message_bytes)
                if length <= end - pos:  # fast path: the whole payload is here
                    out.append(data[pos : pos + length])
                    pos += length
                    continue
                self._need = length
            take = min(self._need - self._have, end - pos)
            self._chunks.append(data[pos : pos + take])
            self._have += take
            pos += take
            if self._have == self._need:
                out.append(self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks))
                self._chunks = []
                self._have = 0
                self._need = -1
        return out
