"""One connection of a channel: the core, its transport, and the callers waiting.

A `ChannelConnection` runs its `Transport` (reader and writer) over one HTTP/2
connection's sans-IO core (`rsgw.grpc.protocol._client_connection.ClientConnection`) and
hands each caller what the core says of its call: a unary caller parks on a
`_Waiter` until its `CallEnded`, a streaming caller reads a `ClientStream`. A call
the peer's stream limit does not let open yet waits for one to end. Closed on
purpose (`close`, no await) or by the peer, it fails every pending call exactly
once, and tells its channel (`Owner.forget`), whose next call connects again
(`rsgw.grpc._client.Channel`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import trio

from rsgw.base._body import Body
from rsgw.base._errors import GrpcError, RsgwError
from rsgw.base._status import StatusCode
from rsgw.grpc._streams import ClientStream
from rsgw.grpc._transport import Transport
from rsgw.grpc.protocol._calls import (
    CallEnded,
    ConnectionTerminated,
    Event,
    MessageReceived,
    OutboxDrained,
    PeerSettled,
)
from rsgw.grpc.protocol._client_connection import ClientConnection, StreamLimitReached
from rsgw.grpc.protocol._connection import ConnectionState


@dataclass(slots=True, eq=False)
class _Waiter:
    """A caller waiting for its unary call to end (fed as a `ClientStream` is).

    It parks its task itself rather than on a `trio.Event`: one waiter, woken once,
    and it sits on every proxied call.
    """

    messages: list[Body] = field(default_factory=list)
    error: RsgwError | None = None
    done: bool = False
    _task: trio.lowlevel.Task | None = None

    async def wait(self) -> None:
        """Until the call ends; a schedule point, and `trio.Cancelled` if cancelled first."""
        if self.done:
            await trio.lowlevel.checkpoint()
            return
        self._task = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED

    def deliver(self, message: Body) -> None:
        self.messages.append(message)

    def finish(self, error: RsgwError | None) -> None:
        self.error = error
        self.done = True
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def drained(self) -> None:
        pass  # a unary request never waits for window: the core queues it whole

    def reply(self, peer: str) -> Body:
        """The one response message, or the error the call ended with."""
        if self.error is not None:
            raise self.error
        if len(self.messages) != 1:
            raise GrpcError(
                StatusCode.INTERNAL,
                f"{peer} answered a unary call with {len(self.messages)} messages",
            )
        return self.messages[0]


class Owner(Protocol):
    """What a connection needs of the channel that made it (`Channel`)."""

    target: str
    max_receive_message_bytes: int
    max_send_message_bytes: int

    def forget(self, connection: ChannelConnection) -> None:
        """`connection` is going away: the next call connects again."""


class ChannelConnection:
    """One connection of a channel: the core, its transport, and the callers waiting."""

    def __init__(self, channel: Owner, stream: trio.abc.Stream) -> None:
        self._channel = channel
        self.connection = ClientConnection(
            peer=channel.target,
            max_receive_message_bytes=channel.max_receive_message_bytes,
            max_send_message_bytes=channel.max_send_message_bytes,
        )
        self._transport = Transport(self.connection, stream)
        self._waiters: dict[int, _Waiter | ClientStream] = {}
        self._cancel_scope = trio.CancelScope()
        #: Set (and replaced) when a call ends while callers wait for the peer's
        #: stream limit to let them open one.
        self._stream_freed: trio.Event | None = None
        self._settled = trio.Event()

    @property
    def usable(self) -> bool:
        return self.connection.state is ConnectionState.ACTIVE

    async def settled(self) -> None:
        """Wait for the peer's first SETTINGS (or the connection's end)."""
        if not self.connection.settled and self.connection.closed_reason is None:
            await self._settled.wait()

    @property
    def pending(self) -> int:
        """Calls waiting for their answer here."""
        return len(self._waiters)

    @property
    def reads(self) -> int:
        return self._transport.reads

    def ping(self) -> None:
        self.connection.ping()
        self._transport.flush()

    def close(self, reason: str) -> None:
        """Fail every pending call and stop the connection's tasks (no await)."""
        for event in self.connection.connection_lost(reason):
            self._dispatch(event)
        self._cancel_scope.cancel()
        self._channel.forget(self)
        self._settled.set()  # nobody waits for SETTINGS that will not come

    async def run(self) -> None:
        try:
            with self._cancel_scope:
                await self._transport.run(self._dispatch)
        finally:
            self._channel.forget(self)
            self._settled.set()
            await self._transport.aclose()

    async def _once_a_stream_frees(self, start: Callable[[], int]) -> int:
        """`start()` a call once the peer's concurrent-stream limit lets it (FIFO-ish)."""
        while True:
            if self._stream_freed is None:
                self._stream_freed = trio.Event()
            await self._stream_freed.wait()
            try:
                return start()
            except StreamLimitReached:
                continue

    async def call(self, headers: bytes, request: Body, gather: bool = False) -> Body:
        try:
            stream_id = self.connection.start_call(headers, request, gather)
        except StreamLimitReached:  # the peer's limit, not ours: wait for a stream
            stream_id = await self._once_a_stream_frees(
                partial(self.connection.start_call, headers, request, gather)
            )
        waiter = self._waiters[stream_id] = _Waiter()
        self._transport.flush()
        try:
            await waiter.wait()
        finally:
            if not waiter.done:  # cancelled (deadline or caller): stop the peer's work
                del self._waiters[stream_id]
                self.connection.cancel(stream_id)
                self._transport.flush()
        return waiter.reply(self._channel.target)

    def open_stream(self, headers: bytes) -> tuple[int, ClientStream]:
        """A streaming call: opened now, fed by `_dispatch`; see `Channel.stream`."""
        stream_id = self.connection.open_call(headers)
        stream = ClientStream(
            partial(self._send, stream_id),
            partial(self._end, stream_id),
            self._channel.max_receive_message_bytes,
        )
        self._waiters[stream_id] = stream
        self._transport.flush()
        return stream_id, stream

    def abandon(self, stream_id: int) -> None:
        """The caller left a stream that had not ended: reset it."""
        if self._waiters.pop(stream_id, None) is not None:
            self.connection.cancel(stream_id)
            self._transport.flush()

    def _send(self, stream_id: int, message: bytes) -> bool:
        fits = self.connection.send_message(stream_id, message)
        self._transport.flush()
        return fits

    def _end(self, stream_id: int) -> None:
        self.connection.end_request(stream_id)
        self._transport.flush()

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, MessageReceived):
            waiter = self._waiters.get(event.stream_id)
            if waiter is not None:
                waiter.deliver(event.message)
        elif isinstance(event, CallEnded):
            waiter = self._waiters.pop(event.stream_id, None)
            if waiter is not None:
                waiter.finish(event.error)
            if self._stream_freed is not None:
                self._stream_freed.set()
                self._stream_freed = None
            if not self._waiters and not self.usable:
                self._hang_up()
        elif isinstance(event, OutboxDrained):
            waiter = self._waiters.get(event.stream_id)
            if waiter is not None:
                waiter.drained()
        elif isinstance(event, PeerSettled):
            self._settled.set()
        elif isinstance(event, ConnectionTerminated):
            self._channel.forget(self)  # calls in flight finish; new ones reconnect
            if not self._waiters:
                self._hang_up()

    def _hang_up(self) -> None:
        """The peer is going away and nothing waits here: close now rather than linger."""
        self._cancel_scope.cancel()
