"""One client connection a server serves: its calls dispatched, its life kept.

Each accepted stream gets a `ServedConnection`: the sans-IO core
(`rsgw.grpc.protocol._server_connection.ServerConnection`, which owns every call's state)
and a `Transport` (which reads into it and writes out of it), and the core's
events in: a call whose path has no handler is answered UNIMPLEMENTED; a unary
call's handler starts once the client has sent its one message and half-closed,
in the connection's nursery (`rsgw.grpc._handling` runs it); a call that ends
before its handler does (the client reset it, the connection died) has its scope
cancelled. The connection's life is here too: the server's periodic sweep (idle
and slowloris clients closed), GOAWAY, the drain's end, and the hang-up.
"""

from __future__ import annotations

import logging
import math
from functools import partial

import outcome
import trio

from rsgw.base._call import CallContext
from rsgw.base._errors import GrpcError, shown
from rsgw.base._status import StatusCode
from rsgw.grpc._handling import HandlerRunner, Pending
from rsgw.grpc._streams import ServerStream
from rsgw.grpc.protocol._calls import (
    CallEnded,
    CallStarted,
    ConnectionTerminated,
    EndCause,
    Event,
    HalfClosed,
    MessageReceived,
    OutboxDrained,
)

logger = logging.getLogger(__name__)

#: How long a graceful stop waits for idle clients to hang up after GOAWAY.
LINGER_SECONDS = 1.0
#: A connection whose bytes complete no frame for `header_seconds` is a slowloris
#: unless they came at least this fast (a slow link sending one big frame).
SLOW_BYTES_PER_SECOND = 1024


class ServedConnection(HandlerRunner):
    """One connection: the core, its transport, and the calls it runs handlers for."""

    def sweep(self, now: float) -> None:
        """The server's periodic look (see `ConnectionLimits`): refill, stalled uploads,
        idle, slowloris."""
        limits = self._server.limits
        core = self.connection
        if now - self._refilled_at >= limits.refill_seconds:
            core.guard.refill()
            self._refilled_at = now
        if core.upload_budget is not None:
            stalled = core.stalled_uploads(now, limits.header_seconds)
            for event in stalled:
                self._dispatch(event)
            if stalled:
                self.transport.flush()
        if core.frames != self._frames_seen or core.active_calls:
            self._frames_seen = core.frames
            self._active_at = now
            self._stuck_since = None
            return
        received = self.transport.received_bytes
        if core.frames == 0 or received != self._stuck_bytes:  # bytes, but no frame from them
            if self._stuck_since is None:
                self._stuck_since, self._stuck_bytes = now, received
            stuck_for = now - self._stuck_since
            slow = received - self._stuck_bytes < SLOW_BYTES_PER_SECOND * stuck_for
            if stuck_for >= limits.header_seconds and slow:
                what = "no HTTP/2 preface" if core.frames == 0 else "bytes that complete no frame"
                self.close(f"sent {what} for {stuck_for:.0f} s")
                return
        if limits.idle_seconds and now - self._active_at >= limits.idle_seconds:
            self.close(f"idle for {now - self._active_at:.0f} s")

    def close(self, reason: str) -> None:
        """End the connection now: GOAWAY (what h2 can still send), then hang up."""
        logger.debug("closing a client connection", extra={"peer": self._peer, "why": reason})
        for event in self.connection.close(reason):
            self._dispatch(event)
        if self._nursery is not None:
            self._nursery.start_soon(self._hang_up)

    async def _hang_up(self) -> None:
        with trio.move_on_after(LINGER_SECONDS):
            await self.transport.flushed()
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    def go_away(self) -> None:
        """Take no new calls; GOAWAY follows the last answer (see `ServerConnection`)."""
        self.connection.go_away()
        self.transport.flush()

    def abandon(self, reason: str) -> int:
        """End every call still open with UNAVAILABLE `reason`; how many there were.

        A running handler is cancelled and answers `reason`; a call still receiving
        its request is refused with it at once.
        """
        error = GrpcError(StatusCode.UNAVAILABLE, reason)
        calls = list(self._calls.items())
        for stream_id, pending in calls:
            if pending.call.scope is not None:
                pending.call.abandoned = reason
                pending.call.scope.cancel()
            else:
                del self._calls[stream_id]
                self.connection.reject(stream_id, error)
        self.transport.flush()
        return len(calls)

    async def run(self, first: bytes = b"") -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.transport.run(self._dispatch, first)
            nursery.cancel_scope.cancel()

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, MessageReceived):
            pending = self._calls.get(event.stream_id)
            if pending is not None:
                if pending.stream is not None:
                    pending.stream.deliver(event.message)
                else:
                    pending.messages.append(event.message)
        elif isinstance(event, CallStarted):
            self._on_started(event)
        elif isinstance(event, HalfClosed):
            self._on_half_closed(event.stream_id)
        elif isinstance(event, CallEnded):
            pending = self._calls.pop(event.stream_id, None)
            if pending is not None:
                pending.ended = True
                if pending.call.scope is not None:
                    pending.call.scope.cancel()
                elif event.cause is EndCause.FAILED and event.error is not None:
                    self._refused(pending.call.path.encode(), event.error.code)
        elif isinstance(event, OutboxDrained):
            pending = self._calls.get(event.stream_id)
            if pending is not None and pending.stream is not None:
                pending.stream.drained()
        elif isinstance(event, ConnectionTerminated):
            self.go_away()  # the client opens no more calls; finish these, then hang up

    def _on_started(self, event: CallStarted) -> None:
        head = event.head
        server = self._server
        passing = server.pass_through_lookup(head.path)  # first: ModelInfer is one
        handler = None if passing else server.lookup(head.path)
        stream_handler = None if handler or passing else server.stream_lookup(head.path)
        if handler is None and passing is None and stream_handler is None:
            error = GrpcError(StatusCode.UNIMPLEMENTED, f"unknown method {shown(head.path)}")
            self.connection.reject(event.stream_id, error)
            self._refused(head.path, error.code)
            return
        deadline = math.inf if head.timeout is None else trio.current_time() + head.timeout
        call = CallContext(
            head.path.decode(),
            deadline,
            head.metadata,
            self._peer,
            accept=head.accept,
            client=self._client,
        )
        if stream_handler is None:
            self._calls[event.stream_id] = Pending(
                handler, call, passing, server.time_limits.get(head.path)
            )
            return
        stream = ServerStream(
            call, partial(self._send, event.stream_id), self._server.max_receive_message_bytes
        )
        pending = self._calls[event.stream_id] = Pending(None, call, stream=stream)
        assert self._nursery is not None
        self._nursery.start_soon(self._run_stream, event.stream_id, pending, stream_handler)

    def _on_half_closed(self, stream_id: int) -> None:
        pending = self._calls.get(stream_id)
        if pending is None:
            return
        if pending.stream is not None:
            pending.stream.half_closed()
            return
        if len(pending.messages) != 1:
            del self._calls[stream_id]
            error = GrpcError(
                StatusCode.INTERNAL,
                f"unary call expects one request message, got {len(pending.messages)}",
            )
            self.connection.reject(stream_id, error)
            self._refused(pending.call.path.encode(), error.code)
            return
        assert self._nursery is not None
        self._server.intake.started()
        if self._idle_runners:
            handover = outcome.Value((stream_id, pending))
            trio.lowlevel.reschedule(self._idle_runners.pop(), handover)
        else:
            self._nursery.start_soon(self._run_unaries, stream_id, pending)
