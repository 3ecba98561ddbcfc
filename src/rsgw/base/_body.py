"""What a message body is as it crosses the gateway: contiguous bytes, or its pieces.

Pure. A request or reply passed through without being decoded (ModelInfer) is a
`Body`, one of three things, each saying what it is:
- plain `bytes`;
- a `Compressed` message (`rsgw.grpc.protocol._compression`: a `bytes` subclass, one per
  encoding), passed on still compressed;
- a `Gathered` message: a large one in the pieces it arrived in, never joined on
  its way through (the join was the one copy of its bytes in user space).
Code that needs contiguous bytes asks for them (`joined`); code that passes a body
on takes a `Body` and tells the kinds apart with `isinstance`.
"""

from __future__ import annotations


class Gathered:
    """A message received in several pieces (views of the reads), not joined.

    `len()` is the message's length; `bytes()` joins it (a copy).
    """

    __slots__ = ("_length", "pieces")

    def __init__(self, pieces: list[bytes | memoryview], length: int) -> None:
        self.pieces = pieces
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __bytes__(self) -> bytes:
        return b"".join(self.pieces)

    def __repr__(self) -> str:
        return f"Gathered({self._length} bytes in {len(self.pieces)} pieces)"


#: A message as a pass-through carries it (see the module docstring).
Body = bytes | Gathered


def joined(message: Body) -> bytes:
    """`message` as contiguous bytes (a `Gathered` joined; anything else as it is)."""
    return bytes(message) if isinstance(message, Gathered) else message
