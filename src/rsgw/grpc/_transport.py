"""What the server and client shells share: one `GrpcConnection` on one Trio stream.

`Transport.run` is the one read/dispatch loop: read bytes, feed the connection,
hand its events to the shell's `dispatch`, write what it queued. It is also the
one boundary where the stream's failures (EOF, a reset socket, a broken pipe)
become the connection's `connection_lost`, so every call ends exactly once
whatever happened to the bytes underneath.

Writing: with one call on the connection, `flush` writes what the connection
queued straight to the socket when the kernel takes it all at once, which is nearly
always: no task switch, no scheduler round. With several, it leaves the write to the
writer task, which runs after every task Trio is running in this round: the answers
(or requests) that finished together leave in one write instead of one each (at 32
calls in flight, a system call per call was a tenth of the gateway's CPU). What the
socket cannot take goes to the writer task too, which then owns the send side until
its backlog is gone, so bytes never leave out of order. Streams that are not sockets
(memory streams in tests, TLS) always go through the writer task.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Callable

    from rsgw.grpc._intake import Intake
    from rsgw.grpc.protocol._calls import Event
    from rsgw.grpc.protocol._connection import GrpcConnection

logger = logging.getLogger(__name__)

#: Bytes asked of the stream per read (the core parses them in slices; see
#: `GrpcConnection.receive_data`).
RECEIVE_BYTES = 256 * 1024
#: Buffers one gather write takes at most (Linux's UIO_MAXIOV).
IOV_MAX = 1024
#: How long closing a stream may take before we give up on it.
CLOSE_SECONDS = 1.0


class Transport:
    """Moves one connection's bytes over one stream; see the module docstring."""

    def __init__(self, connection: GrpcConnection, stream: trio.abc.Stream) -> None:
        self.connection = connection
        self.stream = stream
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self._backlog: list[bytes | memoryview] = []
        self._sending = False
        #: The last read took less than it asked for: the socket is probably empty.
        self._drained = False
        self._flush_wanted = trio.Event()
        self._wrote = trio.Event()
        #: Called after each write, e.g. to notice that a draining connection went quiet.
        self.after_write: Callable[[], None] | None = None
        #: Reads that returned bytes: whether the peer said anything lately (a liveness
        #: watch compares it between looks; cheaper than a clock read per read).
        self.reads = 0
        self.received_bytes = 0
        #: A server's intake: while it is closed, this connection reads nothing.
        self.intake: Intake | None = None

    def flush(self) -> None:
        """Send whatever the connection has queued: now if it is the only call's and the
        socket takes it, else at the end of this scheduling round (see the module
        docstring)."""
        if self._sending or self._backlog or self._fd < 0 or self.connection.active_calls > 1:
            self._flush_wanted.set()
            return
        self._write_now(self.connection.pieces_to_send())

    def _write_now(self, pieces: list[bytes | memoryview]) -> None:
        """Write `pieces` without blocking, gathered (no copy to join them); what the
        socket does not take waits, in order, for the writer task."""
        if not pieces:
            return
        try:
            rest = _write_gathered(self._fd, pieces)
        except OSError:  # full (BlockingIOError), or broken: the writer task takes over
            rest = pieces
        if rest:
            self._backlog = rest
            self._flush_wanted.set()
        elif self.after_write is not None:
            self.after_write()

    async def run(self, dispatch: Callable[[Event], None], first: bytes = b"") -> None:
        """Serve the connection until it ends; every call's end reaches `dispatch`.

        Ends when the peer closes or breaks the connection, when the stream fails,
        or when cancelled; in every case the connection ends its remaining calls
        (`connection_lost`) before this returns or raises. A bug in `dispatch` is
        logged here and ends this connection only. `first`: bytes already read
        from the stream (a server reads the client's first before it sets up).
        """
        reason = "closed"
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_writer)
                self.flush()
                await self._read_loop(dispatch, first)
                with trio.move_on_after(CLOSE_SECONDS):
                    await self.flushed()  # our last words (a GOAWAY) before we hang up
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            reason = f"failed: {group.exceptions[0]}"
        except* Exception as group:
            logger.error("gRPC connection with %s failed", self.connection.peer, exc_info=group)
            reason = f"failed: {group.exceptions[0]!r}"
        finally:
            for event in self.connection.connection_lost(reason):
                dispatch(event)

    async def flushed(self) -> None:
        """Wait until what the connection queued so far has been handed to the stream."""
        self.flush()
        while self._sending or self._backlog or self._flush_wanted.is_set():
            await self._wrote.wait()

    async def aclose(self) -> None:
        """Close the stream, shielded and bounded (it may be called while cancelled)."""
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_SECONDS):
            await self.stream.aclose()

    async def _read_loop(self, dispatch: Callable[[Event], None], first: bytes) -> None:
        connection = self.connection
        receive = self.stream.receive_some
        fd = self._fd
        data = first
        intake = self.intake
        while connection.closed_reason is None:
            if not first:
                if intake is not None and not intake.open:
                    await intake.wait()
                data = await self._read_socket() if fd >= 0 else bytes(await receive(RECEIVE_BYTES))
            first = b""
            self.reads += 1
            self.received_bytes += len(data)
            for event in connection.receive_data(data):
                dispatch(event)
            self.flush()  # window updates, h2's GOAWAY after a protocol error, answers

    async def _read_socket(self) -> bytes:
        """One read straight from the socket (trio's `receive_some` wraps the same
        system call in more bookkeeping than the read itself costs).

        A read that filled the buffer is followed by a checkpoint, so a peer that never
        stops sending cannot starve other tasks; after one that did not, the socket is
        most likely empty, so the next read waits for it to be readable first (a
        schedule point either way, and no read that only says "nothing yet").
        """
        while True:
            if self._drained:
                await trio.lowlevel.wait_readable(self._fd)
            try:
                data = os.read(self._fd, RECEIVE_BYTES)
            except BlockingIOError:
                self._drained = True
                continue
            self._drained = len(data) < RECEIVE_BYTES
            if not self._drained:
                await trio.lowlevel.checkpoint()
            return data

    async def _run_writer(self) -> None:
        """Sends what `flush` could not; runs until cancelled or the stream breaks."""
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            pieces = self._backlog + self.connection.pieces_to_send()
            self._backlog = []
            if pieces:
                self._sending = True
                try:
                    if self._fd >= 0:
                        while pieces := _write_gathered(self._fd, pieces):
                            await trio.lowlevel.wait_writable(self._fd)
                    else:
                        await self.stream.send_all(b"".join(pieces))
                finally:
                    self._sending = False
            self._wrote.set()
            self._wrote = trio.Event()
            if self.after_write is not None:
                self.after_write()


def _write_gathered(fd: int, pieces: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """Write as much of `pieces` as the socket takes now; what is left, in order.

    The cost is in the pieces written, not in those left: a backlog of thousands
    of frames drains over many partial writes, and each one only steps over what
    it sent.

    Raises:
        OSError: the socket is broken (a full socket is not an error: all is left).
    """
    while pieces:
        batch = pieces if len(pieces) <= IOV_MAX else pieces[:IOV_MAX]
        try:
            sent = os.writev(fd, batch) if len(batch) > 1 else os.write(fd, batch[0])
        except BlockingIOError:
            return pieces
        done = 0
        for piece in batch:
            size = len(piece)
            if sent < size:
                break
            sent -= size
            done += 1
        else:
            pieces = pieces[done:]  # the whole batch went: on to the next, if any
            continue
        rest = pieces[done:]
        if sent:
            rest[0] = memoryview(rest[0])[sent:]
        return rest
    return []
