"""What the REST listener does with a connection besides reading its requests.

`close_with` ends a connection after a last answer without the kernel destroying
it; `Replayed` hands hypercorn a connection whose first bytes were already read.
"""

from __future__ import annotations

import contextlib
from typing import Any

import trio

#: What one receive asks the kernel for.
RECEIVE_BYTES = 64 * 1024
#: How long a connection closed after an error lingers to read what its client still
#: sends (so the kernel does not reset the connection before the answer is read).
LINGER_SECONDS = 1.0


async def close_with(stream: trio.abc.Stream, out: bytes) -> None:
    """Send `out` (an answer, or nothing) and end the connection, reading for a while
    what the client still sends so that the answer arrives (closing with unread input
    makes the kernel reset the connection, which can destroy what was sent)."""
    with trio.move_on_after(LINGER_SECONDS) as linger:
        linger.shield = True  # the connection's timer may have just run out
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            if out:
                await stream.send_all(out)
            if isinstance(stream, trio.SocketStream):
                await stream.send_eof()
            while await stream.receive_some(RECEIVE_BYTES):
                pass


class Replayed(trio.abc.Stream):
    """A socket stream whose first bytes, already read, are received again (what
    hypercorn is handed for an h2c connection: it reads the preface itself)."""

    def __init__(self, stream: trio.abc.Stream, first: bytes) -> None:
        self._stream = stream
        self._first = first

    @property
    def socket(self) -> Any:
        """The socket under it (hypercorn asks it for the peer's address)."""
        return getattr(self._stream, "socket", None)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._first:
            first, self._first = self._first, b""
            return first
        return bytes(await self._stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if isinstance(self._stream, trio.SocketStream):
            await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()
