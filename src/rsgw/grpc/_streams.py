"""Streaming calls as their users see them: `ServerStream` (handlers), `ClientStream` (callers).

Both are fed by their shell's dispatch (messages as they arrive, the end of the
peer's half, the end of flow-control backlog) and read and written by one task:
- `receive()` returns the next message, or None once the peer's half has ended
  cleanly; a client's stream raises the call's error instead if it failed;
- `send(message)` hands a message to the connection and, when the peer's window
  could not take all of it, waits until it has gone: a sender faster than its
  peer is held back instead of filling memory.

Received messages are queued without a bound: the connection acknowledges DATA as
it reads it, so a peer can send as fast as we read the socket. XX TODO: bounding
that queue needs per-call windows; issue 18 (bounded memory) takes it up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from rsgw.base._body import Body
from rsgw.grpc.protocol._compression import plain
from rsgw.grpc.protocol._framing import DEFAULT_MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from rsgw.base._call import CallContext
    from rsgw.base._errors import RsgwError


class _Inbox:
    """Messages received and not yet read, and how the peer's half ended.

    A compressed message is decompressed as it is read (bounded by `limit`), in
    the reader's task: a bad one fails the reader, not the connection.
    """

    __slots__ = ("_arrived", "closed", "error", "limit", "messages")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.messages: deque[Body] = deque()
        self.closed = False
        self.error: RsgwError | None = None
        self._arrived = trio.Event()

    def put(self, message: Body) -> None:
        self.messages.append(message)
        self._arrived.set()

    def close(self, error: RsgwError | None = None) -> None:
        if not self.closed:
            self.closed = True
            self.error = error
            self._arrived.set()

    async def get(self) -> bytes | None:
        while not self.messages:
            if self.closed:
                if self.error is not None:
                    raise self.error
                return None
            await self._arrived.wait()
            self._arrived = trio.Event()
        await trio.lowlevel.checkpoint()
        message = self.messages.popleft()
        return message if type(message) is bytes else plain(message, self.limit)


class _Outlet:
    """Sends through the connection; waits while the peer's window holds a backlog.

    Several tasks may send on one stream (a worker answering a stream's requests
    as each completes): every sender waiting for the backlog waits on the same
    event, which `drained` sets and replaces.
    """

    __slots__ = ("_drained", "_send")

    def __init__(self, send: Callable[[bytes], bool]) -> None:
        self._send = send
        self._drained = trio.Event()

    async def send(self, message: bytes) -> None:
        if self._send(message):
            await trio.lowlevel.checkpoint()
            return
        await self._drained.wait()

    def drained(self) -> None:
        self._drained.set()
        self._drained = trio.Event()


class ServerStream:
    """A streaming call, for its handler: `async for request in stream`, `await stream.send()`.

    The handler's return ends the call OK; an `RsgwError` it raises ends it with
    that status (after the messages it sent), as for a unary handler.
    """

    def __init__(
        self,
        call: CallContext,
        send: Callable[[bytes], bool],
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.call = call
        self._inbox = _Inbox(max_message_bytes)
        self._outlet = _Outlet(send)

    async def receive(self) -> bytes | None:
        """The next request message, or None once the client has half-closed."""
        return await self._inbox.get()

    async def send(self, message: bytes) -> None:
        """Send one response message (the first sends the response headers)."""
        await self._outlet.send(message)

    def __aiter__(self) -> ServerStream:
        return self

    async def __anext__(self) -> bytes:
        # A plain iterator, not an async generator: a handler cancelled mid-loop
        # leaves no generator for the garbage collector to finalize.
        message = await self.receive()
        if message is None:
            raise StopAsyncIteration
        return message

    # -- fed by the server shell ----------------------------------------------------------

    def deliver(self, message: Body) -> None:
        self._inbox.put(message)

    def half_closed(self) -> None:
        self._inbox.close()

    def drained(self) -> None:
        self._outlet.drained()


#: A streaming method's handler: it reads and answers on its `ServerStream`.
StreamHandler = Callable[[ServerStream], Awaitable[None]]


class ClientStream:
    """A streaming call, for its caller: send, `end()`, and read the replies.

    Use it through `Channel.stream`, which opens the call and resets it on the way
    out if it has not ended.
    """

    def __init__(
        self,
        send: Callable[[bytes], bool],
        end: Callable[[], None],
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._inbox = _Inbox(max_message_bytes)
        self._outlet = _Outlet(send)
        self._end = end
        #: The call has ended (replies may still wait to be read).
        self.ended = False

    async def send(self, message: bytes) -> None:
        """Send one request message; raises the call's error if it has already failed."""
        if self.ended and self._inbox.error is not None:
            raise self._inbox.error
        await self._outlet.send(message)

    def end(self) -> None:
        """Half-close: no more requests (replies keep coming)."""
        self._end()

    async def receive(self) -> bytes | None:
        """The next reply, None once the call ended OK; the call's error if it failed."""
        return await self._inbox.get()

    def __aiter__(self) -> ClientStream:
        return self

    async def __anext__(self) -> bytes:
        message = await self.receive()
        if message is None:
            raise StopAsyncIteration
        return message

    # -- fed by the client shell ----------------------------------------------------------

    def deliver(self, message: Body) -> None:
        self._inbox.put(message)

    def finish(self, error: RsgwError | None) -> None:
        self.ended = True
        self._inbox.close(error)
        self._outlet.drained()  # a sender waiting on a call that ended must wake

    def drained(self) -> None:
        self._outlet.drained()
