"""The gateway's RPCs: the handler table, and ModelInfer's pass-through.

ModelInfer is the hot path. The body is never decoded: a varint walk reads the
model name, the scheduler picks an order of replicas, and the same bytes go to
the first of them; the worker's answer comes back byte for byte. What to do is
decided by pure code (`rsgw.scheduling._ledger` admits and counts, the scheduler
orders, `rsgw.scheduling._plan.RouteWalk` walks the failover); this module does
the I/O those decisions ask for. The fan-outs to every worker (shared memory,
IPC namespace, compaction) are in `rsgw.gateway._fanout`.

A compressed request (gzip, deflate) stays compressed: routing inflates only its
head (every field before the tensor bytes, `rsgw.scheduling._wire.head_length`),
the worker gets the compressed bytes, and its answer comes back as it was sent
(the server shell decompresses it only for a client that does not accept it).

One deadline per call: the client's `grpc-timeout` or `request_timeout_seconds`,
whichever is sooner, covers the whole call, the wait for admission and the wait at
a worker's register gate included. No per-request log lines, no per-request tasks:
outcomes are counted in metrics.
"""

from __future__ import annotations

import contextlib
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, NoReturn

import trio

from rsgw._blocks import ShmConfig
from rsgw._errors import DecodeError, GrpcError, RsgwError
from rsgw._logging import log_limited
from rsgw._methods import Method
from rsgw._status import StatusCode
from rsgw.gateway._access import REQUEST_ID, AccessLog, request_id
from rsgw.gateway._admission import AdmissionQueue
from rsgw.gateway._fanout import FleetCalls
from rsgw.gateway._metrics import UNKNOWN_MODEL, GatewayMetrics
from rsgw.gateway._models import ModelCalls
from rsgw.gateway._streaming import StreamProxy
from rsgw.grpc._compression import inflate_prefix
from rsgw.grpc._framing import DEFAULT_MAX_MESSAGE_BYTES, Gathered
from rsgw.grpc._metadata import HeaderBlock
from rsgw.grpc._metering import Meter, metered
from rsgw.scheduling._budget import RetryBudget
from rsgw.scheduling._ledger import Ledger, Ticket
from rsgw.scheduling._plan import (
    CLIENT_FAULT_CODES,
    RouteWalk,
    Shed,
    gateway_deadline,
    no_ready_replica,
    shed_at_gateway,
    shed_at_replicas,
    unknown_model,
)
from rsgw.scheduling._schedulers import AnyReservation, RoundRobinScheduler, Scheduler
from rsgw.scheduling._sequences import SequenceTable, holder_lost
from rsgw.scheduling._wire import SequenceFlags, head_length, peek_routing

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from rsgw._call import CallContext, UnaryHandler
    from rsgw._config import ServerMetadataConfig
    from rsgw.gateway._pool import WorkerPool
    from rsgw.gateway._prober import Prober
    from rsgw.grpc._streams import StreamHandler
    from rsgw.scheduling._routing import RoutingTable

logger = logging.getLogger(__name__)


class GatewayService:
    """The handlers of one gateway, bound to its pool, prober, scheduler and metrics."""

    #: The pass-through methods: their requests reach them still compressed.
    raw_paths = (Method.MODEL_INFER.path,)

    def __init__(
        self,
        pool: WorkerPool,
        prober: Prober,
        metrics: GatewayMetrics,
        *,
        request_timeout: float = 60.0,
        max_concurrent_requests: int = 0,
        max_requests_per_worker: int = 0,
        scheduler: Scheduler | None = None,
        holders: Callable[[str], tuple[str, ...]] | None = None,
        identity: ServerMetadataConfig | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        access: AccessLog | None = None,
        shm: ShmConfig | None = None,
    ) -> None:
        self.pool = pool
        #: The access log, when `logging.access_log_sample_rate` is above 0.
        self.access = access
        self.prober = prober
        self.metrics = metrics
        self.request_timeout = request_timeout
        #: The server cuts ModelInfer short at `request_timeout` from its start, when
        #: the client set no sooner deadline (`GrpcServer(timeouts=)`): the deadline
        #: is on the call's scope from the start, at one setter per call.
        self.timeouts = {Method.MODEL_INFER.path: request_timeout}
        #: The receive limit, which a compressed request's inflated head is held to.
        self.max_message_bytes = max_message_bytes
        self.scheduler: Scheduler = scheduler or RoundRobinScheduler()
        #: Admitted calls, the calls each worker holds, and the scheduler's charges.
        self.ledger: Ledger[AnyReservation] = Ledger(
            max_concurrent_requests, max_requests_per_worker, self.scheduler.release
        )
        #: What failover may add to the fleet's load (`rsgw.scheduling._budget`).
        self.retries = RetryBudget()
        metrics.track_failovers(lambda: self.retries.spent, lambda: self.retries.refused)
        #: Calls waiting for a slot under the cap (ModelInfer only).
        self.queue: AdmissionQueue[Ticket[AnyReservation]] = AdmissionQueue(max_concurrent_requests)
        self.fleet = FleetCalls(
            pool,
            prober,
            metrics,
            self.admitted,
            holders or (lambda model: pool.urls),
            request_timeout=request_timeout,
            shm=shm or ShmConfig(),
        )
        self.models = ModelCalls(
            pool, prober, metrics, request_timeout=request_timeout, identity=identity
        )
        #: Which worker holds each live sequence of a stateful model.
        self.sequences = SequenceTable()
        self.streams = StreamProxy(pool, prober, self.scheduler, metrics, self.sequences)
        self._observe_infer = metrics.observer(Method.MODEL_INFER.rpc)
        metrics.max_concurrent.set(max_concurrent_requests)
        if max_concurrent_requests:
            metrics.track_inflight(lambda: self.ledger.inflight)

    def resize(self, max_concurrent_requests: int) -> None:
        """A new inbound cap (the workers changed): waiting calls take the new room."""
        self.ledger.max_inflight = max_concurrent_requests
        self.queue.cap = max_concurrent_requests
        self.metrics.max_concurrent.set(max_concurrent_requests)
        while self.queue.waiting:
            waiting = self.queue.waiting
            self.queue.hand_over(self.ledger.admit)
            if self.queue.waiting == waiting:
                break

    def handlers(self) -> dict[str, UnaryHandler]:
        """The handler table: one row per method the gateway answers."""
        table: dict[Method, UnaryHandler] = {
            Method.MODEL_INFER: self.model_infer,
            **self.fleet.handlers(),
            **self.models.handlers(),
        }
        return {method.path: handler for method, handler in table.items()}

    def stream_handlers(self) -> dict[str, StreamHandler]:
        """The streaming methods: ModelStreamInfer, passed through per message."""
        return {Method.MODEL_STREAM_INFER.path: self.streams.model_stream_infer}

    @property
    def inflight(self) -> int:
        return self.ledger.inflight

    def on_table_swap(self, table: RoutingTable) -> None:
        self.scheduler.table_swapped(table)

    def admit(self, rpc: str) -> Ticket[AnyReservation]:
        """A ledger ticket for a new call, or RESOURCE_EXHAUSTED (counted) at the cap."""
        ticket = self.ledger.admit()
        if ticket is None:
            self._shed(rpc)
        return ticket

    def _shed(self, rpc: str) -> NoReturn:
        self.metrics.shed.inc()
        self.metrics.observe(rpc, "", StatusCode.RESOURCE_EXHAUSTED, None)
        raise shed_at_gateway(self.ledger.max_inflight)

    def release(self, ticket: Ticket[AnyReservation]) -> None:
        """A call is over: its slot goes to the first call waiting for one, if any."""
        self.ledger.close(ticket)
        self.queue.hand_over(self.ledger.admit)

    @contextlib.contextmanager
    def admitted(self, rpc: str) -> Iterator[Ticket[AnyReservation]]:
        """`admit` for the duration of a block (the fan-out RPCs)."""
        ticket = self.admit(rpc)
        try:
            yield ticket
        finally:
            self.release(ticket)

    async def _queue_for_slot(self, call: CallContext) -> Ticket[AnyReservation]:
        """The cap is full (or others wait): queue if it clears in time (`_admission`)."""
        if self.queue.hopeless(trio.current_time(), call.deadline):
            self._shed(Method.MODEL_INFER.rpc)
        return await self.queue.wait_turn(self.release)

    # -- ModelInfer ---------------------------------------------------------------------

    async def model_infer(self, body: bytes, call: CallContext) -> bytes:
        # A slot now, unless the cap is full or others already wait for one.
        ticket = None if self.queue.waiting else self.ledger.admit()
        if ticket is None:
            ticket = await self._queue_for_slot(call)
        self.retries.deposit()
        started = trio.current_time()
        access = self.access
        logged = access is not None and access.sampled()
        meter = metered(call, self._observe_infer)
        try:
            with meter:
                return await self._infer(body, call, ticket, meter)
        finally:
            elapsed = trio.current_time() - started
            self.queue.observe(elapsed)
            self.release(ticket)
            if logged:
                assert access is not None
                access.write(call, meter, Method.MODEL_INFER.rpc, elapsed)

    async def _infer(
        self, body: bytes, call: CallContext, ticket: Ticket[AnyReservation], meter: Meter
    ) -> bytes:
        meter.timed = False  # refused before routing: counted, but no latency observed
        head = body  # what routing reads: the body itself, or its head
        try:
            if type(body) is not bytes:
                head = self._head_of(body)
            model, sequence = peek_routing(head)
            if len(self.pool.regions):
                self.pool.regions.check_request(head, call.owner)
        except DecodeError as exc:
            raise _malformed(exc) from exc
        if not model:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, "ModelInferRequest.model_name is empty")
        replicas = self.prober.table.replicas(model)
        if not replicas:
            await self.prober.refresh_now()
            replicas = self.prober.table.replicas(model)
        if not replicas:
            meter.timed = True
            if model in self.prober.known:  # served before: its replicas are all down
                meter.label = model
                raise no_ready_replica(model)
            meter.label = UNKNOWN_MODEL
            # Debug only: the name is client-chosen, and a storm of them must not
            # become a log storm.
            logger.debug("model not found on any worker", extra={"model": model[:200]})
            raise unknown_model(model)
        meter.label = model
        self.scheduler.arrived(model)
        pinned = False
        if sequence is not None and not sequence.start:
            replicas, pinned = self._sequence_holder(model, sequence.id, replicas)
        # Replicas holding their share are not offered to the scheduler, so its
        # choice (and the reservation it charges) is where the call really goes.
        ledger = self.ledger
        free = ledger.with_room(replicas)
        try:
            order, reservation = self.scheduler.select(model, free, head) if free else ((), None)
        except DecodeError as exc:  # the batch-extent walk met bad bytes
            raise _malformed(exc) from exc
        ledger.reserve(ticket, reservation)
        if not order and pinned and free:
            order = free  # a live sequence's holder, outside the scheduler's choice
        if not order:  # every replica the scheduler may use holds its share
            self.metrics.shed.inc()
            raise shed_at_replicas(model, ledger.max_per_worker)
        meter.timed = True
        walk = RouteWalk(model, order, replicas, ledger.max_per_worker)
        deadline = min(call.deadline, trio.current_time() + self.request_timeout)
        # The client's request id goes on to the worker (its logs can name the call).
        rid = request_id(call.metadata) if call.metadata else None
        metadata = () if rid is None else ((REQUEST_ID, rid),)
        # The handler's scope ends the call at the deadline (at a gate, say), answering
        # as the gateway's deadline; `trio.Cancelled` passes through here.
        call.limit(deadline, partial(gateway_deadline, model))
        try:
            response = await self._forward(body, walk, ticket, deadline, metadata)
        except Shed:
            meter.timed = False  # the replicas filled up meanwhile: still a refusal
            raise
        finally:
            meter.upstream = walk.answered or ""
        if sequence is not None:
            self._sequence_answered(model, sequence, walk.answered)
        return response

    def _head_of(self, body: bytes) -> bytes:
        """What routing reads of a body that is not plain bytes: a compressed body's
        head inflated, a large body's head from its first pieces (`Gathered`)."""
        if isinstance(body, Gathered):
            first = body.pieces[0]
            end = head_length(first, complete=False)
            if end is None:  # the head goes on past the first piece (rare): the whole body
                return bytes(body)
            return bytes(first[:end])
        return inflate_prefix(body, head_length, self.max_message_bytes)  # type: ignore[arg-type]  # not bytes: Compressed

    def _sequence_holder(
        self, model: str, sequence_id: int | str, replicas: tuple[str, ...]
    ) -> tuple[tuple[str, ...], bool]:
        """A live sequence's request may go to its holder only (docs in `_sequences`).

        Returns the replicas it may use and whether it is pinned to one.
        """
        holder = self.sequences.holder(model, sequence_id, trio.current_time())
        if holder is None:
            return replicas, False  # not a sequence we know: routed as any request
        if holder not in replicas:
            self.sequences.ended(model, sequence_id)
            raise holder_lost(model, sequence_id, self.pool.public_name(holder))
        return (holder,), True

    def _sequence_answered(self, model: str, sequence: SequenceFlags, url: str | None) -> None:
        if sequence.end:
            self.sequences.ended(model, sequence.id)
        elif sequence.start and url is not None:
            self.sequences.started(model, sequence.id, url, trio.current_time())

    async def _forward(
        self,
        body: bytes,
        walk: RouteWalk,
        ticket: Ticket[AnyReservation],
        deadline: float,
        metadata: HeaderBlock = (),
    ) -> bytes:
        """Send to the replicas the walk names until one answers (`RouteWalk` decides)."""
        pool = self.pool
        ledger = self.ledger
        while (url := walk.next(ledger.is_full)) is not None:
            if walk.last is not None and not self.retries.withdraw():
                raise walk.outcome()  # the retry budget cannot pay: the failure it has
            ledger.hold(ticket, url)  # before any wait: the gate queue counts too
            started = time.perf_counter()
            try:
                if pool.gate.closed(url):
                    await pool.gate.wait_open(url)
                response = await pool.channels[url].unary(
                    Method.MODEL_INFER.wire,
                    body,
                    deadline=deadline,
                    metadata=metadata,
                    enforce_deadline=False,
                    raw=True,
                )
                walk.answered = url
                return response
            except RsgwError as exc:
                expired = trio.current_time() >= deadline
                answer = walk.failed(url, exc, expired=expired, who=pool.public_name(url))
                if exc.code is StatusCode.NOT_FOUND:
                    self.prober.request_refresh()
                if answer is not None:
                    if not expired:
                        self._log_worker_error(walk.model, url, answer.code)
                    raise answer from exc
            finally:
                ledger.unhold(ticket)
                self.metrics.observe_worker(
                    Method.MODEL_INFER.rpc, url, time.perf_counter() - started
                )
        outcome = walk.outcome()
        if walk.last is None:
            self.metrics.shed.inc()
        else:
            extra = {"model": walk.model, "replicas": walk.tried, "status": outcome.code.name}
            log_limited(logger, logging.WARNING, "every replica failed", extra, walk.model)
        raise outcome

    def _log_worker_error(self, model: str, url: str, code: StatusCode) -> None:
        # The request's own fault is the client's business (and a storm of bad
        # requests must not become a log storm); the worker's fault is ours.
        level = logging.DEBUG if code in CLIENT_FAULT_CODES else logging.WARNING
        if logger.isEnabledFor(level):
            worker = self.pool.label(url)
            extra = {"model": model, "worker": worker, "status": code.name}
            log_limited(logger, level, "worker error", extra, (worker, code))


def _malformed(exc: DecodeError) -> GrpcError:
    return GrpcError(StatusCode.INVALID_ARGUMENT, f"malformed ModelInferRequest: {exc}")
