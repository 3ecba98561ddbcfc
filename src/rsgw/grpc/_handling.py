"""Running the handlers of one server connection's calls, and answering them.

Handlers are `async def handler(request: bytes, call: CallContext) -> bytes`,
registered by full method path. They raise any `RsgwError` to fail a call with
its status (`GrpcError` to choose one); any other exception becomes INTERNAL.
Streaming handlers take a `ServerStream`, fed by the same `MessageReceived` /
`HalfClosed` events. A unary call's handler runs under a cancel scope carrying
the call's deadline (and its method's own time limit); a call cut short by it,
or by the server's drain, is answered with the status that says which.

Compression (gzip, deflate): a handler sees its request decompressed, unless it
is a pass-through (`GrpcServer(pass_through=)`), which gets the request as it came
(a `rsgw.base._body.Body`: compressed, or `Gathered` in the pieces it arrived in if
large) and may answer likewise. A reply goes out
compressed only in an encoding the client accepts: a compressed reply it does not
accept is decompressed, and with `response_encoding` set, a plain reply is
compressed when the client accepts that encoding. Streamed messages are
decompressed as the handler reads them and sent as they are given.

`HandlerRunner` is the base of `rsgw.grpc._serving.ServedConnection`, which feeds
it the calls its client starts; `Server` is what both ask of the server that
accepted the connection (`rsgw.grpc._server.GrpcServer`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from rsgw.base._body import Body, joined
from rsgw.base._call import CallContext, PassThrough, UnaryHandler
from rsgw.base._limits import ConnectionLimits
from rsgw.base._peer import peer_of
from rsgw.base._status import StatusCode
from rsgw.base._uploads import UploadBudget
from rsgw.grpc._intake import Intake
from rsgw.grpc._streams import ServerStream, StreamHandler
from rsgw.grpc._transport import Transport
from rsgw.grpc.protocol._compression import Compressed, compress, decompress, plain
from rsgw.grpc.protocol._connection import ConnectionState
from rsgw.grpc.protocol._server_connection import ServerConnection
from rsgw.runtime._tls import peer_identity

logger = logging.getLogger(__name__)

#: Handler tasks a connection keeps between unary calls (`_run_unaries`).
IDLE_RUNNERS = 64


@dataclass(slots=True, eq=False)
class Pending:
    """A call this connection serves: its handler, what it received, its cancel scope.

    A unary call collects its one message in `messages` and runs once the client
    half-closes; a streaming call (`stream` set) runs at once and is fed as it goes.
    """

    handler: UnaryHandler | None
    call: CallContext
    #: A pass-through's handler, in place of `handler`: it takes the request as it came.
    passing: PassThrough | None = None
    #: The method's own time limit (`GrpcServer(time_limits=)`), if it has one.
    time_limit: float | None = None
    messages: list[Body] = field(default_factory=list)
    stream: ServerStream | None = None
    ended: bool = False


class Server(Protocol):
    """What a connection asks of the server that accepted it (`GrpcServer`)."""

    limits: ConnectionLimits
    #: The pass-through paths, whose large requests arrive gathered.
    raw_paths: frozenset[bytes]
    #: Methods' own time limits, in seconds from when the handler starts.
    time_limits: dict[bytes, float]
    response_encoding: type[Compressed] | None
    on_refused: Callable[[bytes, StatusCode], None] | None
    max_receive_message_bytes: int
    max_send_message_bytes: int
    window_bytes: int
    connection_window_bytes: int | None
    max_frame_bytes: int
    intake: Intake
    upload_budget: UploadBudget | None

    @property
    def stream_limit(self) -> int: ...

    def lookup(self, path: bytes) -> UnaryHandler | None: ...

    def pass_through_lookup(self, path: bytes) -> PassThrough | None: ...

    def stream_lookup(self, path: bytes) -> StreamHandler | None: ...


class HandlerRunner:
    """One connection's core, its transport, and the handlers running for its calls."""

    def __init__(self, server: Server, stream: trio.abc.Stream) -> None:
        self._server = server
        self.connection = ServerConnection(
            limits=server.limits,
            gather_paths=server.raw_paths,
            max_receive_message_bytes=server.max_receive_message_bytes,
            max_send_message_bytes=server.max_send_message_bytes,
            window_bytes=server.window_bytes,
            connection_window_bytes=server.connection_window_bytes,
            max_frame_bytes=server.max_frame_bytes,
            max_concurrent_streams=server.stream_limit,
            upload_budget=server.upload_budget,
        )
        self.transport = Transport(self.connection, stream)
        self.connection.on_window = self.transport.flush
        self.transport.after_write = self._after_write
        if server.intake.limit:
            self.transport.intake = server.intake
        self._client = peer_of(stream, peer_identity(stream))
        self._peer = self._client.address
        self._calls: dict[int, Pending] = {}
        self._nursery: trio.Nursery | None = None
        #: Handler tasks waiting for the next unary call (`_run_unaries`).
        self._idle_runners: list[trio.lowlevel.Task] = []
        #: Set once GOAWAY has left and no call is in flight.
        self.quiet = trio.Event()
        #: Set when the connection is over (the client hung up, or we closed it).
        self.ended = trio.Event()
        now = trio.current_time()
        #: The sweep's view: when it last saw frames (or calls), and bytes without them.
        self._active_at = self._refilled_at = now
        self._frames_seen = 0
        self._stuck_since: float | None = None
        self._stuck_bytes = 0

    def _after_write(self) -> None:
        if self.connection.state is ConnectionState.CLOSED:
            self.quiet.set()  # the GOAWAY has left too

    async def _run_unaries(self, stream_id: int, pending: Pending) -> None:
        """Run this unary call, then those `_on_half_closed` hands over while we wait.

        A task per call cost more than a small call's routing; a task kept between
        calls costs a wake-up. So does a cancel scope per call: the calls share one,
        which takes each call's deadline when it starts (and keeps it until the next
        one, so a method with a time limit costs one deadline setter per call), and
        which only a call that must end early cancels (its deadline, its client's
        reset, the drain); that call is answered and the next one gets a new scope.
        At most `IDLE_RUNNERS` tasks wait; the connection's end cancels them.
        """
        task = trio.lowlevel.current_task()
        idle = self._idle_runners

        def give_up(_: object) -> trio.lowlevel.Abort:
            idle.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        async def next_call() -> tuple[int, Pending] | None:
            """Wait to be handed a call; None when enough tasks wait already."""
            if len(idle) >= IDLE_RUNNERS:
                return None
            idle.append(task)
            call: tuple[int, Pending] = await trio.lowlevel.wait_task_rescheduled(give_up)
            return call

        handed: tuple[int, Pending] | None = (stream_id, pending)
        while handed is not None:
            running: Pending | None = None
            with trio.CancelScope() as scope:
                # A scope cancelled after a call was handed over, before this task ran
                # (the last call's kept deadline passing just then), must not cut that
                # call short: it goes to a fresh scope.
                while handed is not None and not scope.cancel_called:
                    stream_id, running = handed
                    handed = None
                    await self._run_unary(stream_id, running, scope)
                    running = None
                    if (handed := await next_call()) is None:
                        return
            # Cancelled for the call it ran: answer it. (A cancel that came too late to
            # stop the call it was meant for, or the last call's deadline passing, ends
            # an idle wait instead: nothing to answer.)
            if running is not None:
                self._answer(stream_id, running, None, *running.call.cut_short())
            if handed is None:
                handed = await next_call()

    async def _run_unary(self, stream_id: int, pending: Pending, scope: trio.CancelScope) -> None:
        """Run one call's handler under `scope` and answer it; `trio.Cancelled` (the
        scope's, for this call) leaves unanswered: `_run_unaries` answers it."""
        # Counted from the handover (`_on_half_closed`) to here, for the server's intake.
        call = pending.call
        code = StatusCode.OK
        message = ""
        response: Body | None = None
        call.begin(scope, pending.time_limit)
        try:
            request = pending.messages.pop()
            passing = pending.passing
            if passing is not None:  # the request as it came
                response = await passing(request, call)
            else:
                handler = pending.handler
                assert handler is not None
                if type(request) is not bytes:  # compressed (only pass-throughs gather)
                    request = plain(request, self._server.max_receive_message_bytes)
                response = await handler(request, call)
            if type(response) is not bytes or self._server.response_encoding is not None:
                response = self._recode(response, call)
        except Exception as exc:
            code, message = call.failed(exc)
        finally:
            self._server.intake.ended()
            call.scope = None
        self._answer(stream_id, pending, response, code, message)

    def _answer(
        self,
        stream_id: int,
        pending: Pending,
        response: Body | None,
        code: StatusCode,
        message: str,
    ) -> None:
        if pending.ended:
            return  # the client reset the call, or the connection died
        self._calls.pop(stream_id, None)
        self.connection.send_response(stream_id, response, code, message, pending.call.trailers)
        self.transport.flush()

    async def _run_stream(self, stream_id: int, pending: Pending, handler: StreamHandler) -> None:
        call = pending.call
        assert pending.stream is not None
        code = StatusCode.OK
        message = ""
        with trio.CancelScope() as scope:
            call.begin(scope, None)
            try:
                await handler(pending.stream)
            except Exception as exc:
                code, message = call.failed(exc)
        call.scope = None
        if pending.ended:
            return
        self._calls.pop(stream_id, None)
        if scope.cancelled_caught:
            code, message = call.cut_short()
        self.connection.end_call(stream_id, code, message, call.trailers)
        self.transport.flush()

    def _recode(self, response: Body, call: CallContext) -> Body:
        """A reply the client can read: compressed only in an encoding it accepts."""
        if isinstance(response, Compressed):
            if response.encoding in call.accept:
                return response
            return decompress(response, self._server.max_send_message_bytes)
        encoding = self._server.response_encoding
        if encoding is not None and encoding.encoding in call.accept:
            return compress(joined(response), encoding)
        return response

    def _refused(self, path: bytes, code: StatusCode) -> None:
        if self._server.on_refused is not None:
            self._server.on_refused(path, code)

    def _send(self, stream_id: int, message: bytes) -> bool:
        fits = self.connection.send_message(stream_id, message)
        self.transport.flush()
        return fits
