"""ModelInfer's pass-through: admit, resolve, schedule, forward with failover.

ModelInfer is the hot path. The body is never decoded: a varint walk reads the
model name, the scheduler picks an order of replicas, and the same bytes go to
the first of them; the worker's answer comes back byte for byte. What to do is
decided by pure code (`rsgw.scheduling.calls._ledger` admits and counts, the scheduler
orders, `rsgw.scheduling.calls._plan.RouteWalk` walks the failover); this module does
the I/O those decisions ask for. The handler knows its call only as a
`rsgw.base._call.CallContext`, so every front door calls it alike.

A compressed request (gzip, deflate) stays compressed: routing inflates only its
head (every field before the tensor bytes, `rsgw.scheduling.calls._wire.head_length`),
the worker gets the compressed bytes, and its answer comes back as it was sent
(the server shell decompresses it only for a client that does not accept it).

One deadline per call: the client's deadline or `request_timeout_seconds`,
whichever is sooner, covers the whole call, the wait for admission and the wait at
a worker's register gate included. No per-request log lines, no per-request tasks:
outcomes are counted in metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import trio

from rsgw.base._body import Body, Gathered
from rsgw.base._errors import DecodeError, GrpcError, RsgwError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.gateway.calls._tenancy import ADMITTED, REFUSED_BY_REASON, REFUSED_DEADLINE
from rsgw.gateway.observe._propagation import upstream_metadata
from rsgw.grpc._metering import Meter, metered
from rsgw.grpc.protocol._compression import Compressed, inflate_prefix
from rsgw.grpc.protocol._metadata import HeaderBlock
from rsgw.runtime._logging import log_limited
from rsgw.scheduling.calls._budget import RetryBudget
from rsgw.scheduling.calls._plan import (
    CLIENT_FAULT_CODES,
    RouteWalk,
    Shed,
    gateway_deadline,
    shed_at_replicas,
)
from rsgw.scheduling.calls._shares import depth_for, describe_share
from rsgw.scheduling.calls._wire import head_length, peek_routing

if TYPE_CHECKING:
    from rsgw.base._call import CallContext
    from rsgw.gateway.calls._admission import Admission
    from rsgw.gateway.calls._resolve import Resolver
    from rsgw.gateway.calls._tenancy import Seat, Tenancy
    from rsgw.gateway.fleet._pool import WorkerPool
    from rsgw.gateway.fleet._prober import Prober
    from rsgw.gateway.observe._access import AccessLog
    from rsgw.gateway.observe._metrics import GatewayMetrics
    from rsgw.gateway.observe._tracing import AnyAttempt, Traced, Tracer
    from rsgw.scheduling.calls._ledger import Ticket
    from rsgw.scheduling.calls._reported import MeasuredCounters
    from rsgw.scheduling.calls._schedulers import AnyReservation, Scheduler
    from rsgw.scheduling.calls._sequences import SequenceTable

logger = logging.getLogger(__name__)

_MODEL_INFER = Method.MODEL_INFER
_RPC = Method.MODEL_INFER.rpc
_NONE: frozenset[Method] = frozenset()


class InferProxy:
    """The gateway's ModelInfer; see the module docstring.

    Args:
        admission: the inbound cap (its ledger also counts what each worker holds).
        sequences: which worker holds each live sequence of a stateful model.
        request_timeout: the gateway's own limit on a call.
        max_message_bytes: the receive limit, which a compressed request's inflated
            head is held to.
        access: the access log, when `logging.access_log_sample_rate` is above 0.
        measured: records each answered call's service time at its worker, when the
            scheduler reads work counters (`rsgw.scheduling.calls._reported`).
    """

    def __init__(
        self,
        pool: WorkerPool,
        prober: Prober,
        metrics: GatewayMetrics,
        resolver: Resolver,
        scheduler: Scheduler,
        admission: Admission,
        sequences: SequenceTable,
        *,
        request_timeout: float,
        max_message_bytes: int,
        access: AccessLog | None = None,
        measured: MeasuredCounters | None = None,
        tracer: Tracer | None = None,
        tenancy: Tenancy | None = None,
    ) -> None:
        self.pool = pool
        self.prober = prober
        self.metrics = metrics
        self.resolver = resolver
        self.scheduler = scheduler
        self.admission = admission
        self.ledger = admission.ledger
        self.queue = admission.queue
        self.forecast = admission.forecast
        #: Each worker's seconds per call ahead (`Forecast.estimates`, read per call).
        self.estimates = admission.forecast.estimates
        self.rule = admission.rule
        self._queue_limit = admission.rule.queue_limit
        #: What the forecast's times are read from (see `_forecast_clock`).
        self._now: Callable[[], float] | None = None
        self.sequences = sequences
        self.request_timeout = request_timeout
        self.max_message_bytes = max_message_bytes
        self.access = access
        #: Where each answered call's service time goes (workers the gateway measures).
        self.measured = measured
        #: The gateway's spans, when `tracing:` has an exporter (else None: no cost).
        self.tracer = tracer
        #: Tenants, priorities and quotas, when `tenancy:` asks for any (else None).
        self.tenancy = tenancy
        #: What failover may add to the fleet's load (`rsgw.scheduling.calls._budget`).
        self.retries = RetryBudget()
        metrics.track_failovers(lambda: self.retries.spent, lambda: self.retries.refused)
        self._observe_infer = metrics.observer(Method.MODEL_INFER.rpc)

    async def model_infer(self, body: Body, call: CallContext) -> Body:
        tracer = self.tracer
        traced = None if tracer is None else tracer.server(_RPC, call.metadata, call.protocol)
        # A slot now, unless the cap is full or others already wait for one.
        ticket = None if self.queue.waiting else self.ledger.admit()
        if ticket is None:
            if traced is None:
                ticket = await self.admission.queue_for_slot(_RPC, call.deadline, call.protocol)
            else:
                ticket = await self._traced_queue(call, traced)
        self.retries.deposit()
        started = trio.current_time()
        access = self.access
        logged = access is not None and access.sampled()
        # A sampled trace's ids: the latency's exemplar and the access line's fields.
        ids = None if traced is None else traced.ids()
        if ids is None:
            meter = metered(call, self._observe_infer)
        else:
            meter = metered(call, self.metrics.traced_observer(_RPC, ids, time.time))
        tenancy = self.tenancy
        seat: Seat | None = None
        try:
            with meter:
                if tenancy is not None:  # who the call is for, its band, its quota
                    meter.timed = False
                    seat = self._seat(tenancy, body, call)
                return await self._infer(body, call, ticket, meter, traced, seat)
        except BaseException as exc:
            if traced is not None:
                traced.failed(exc)
            raise
        finally:
            elapsed = trio.current_time() - started
            self.queue.observe(elapsed)
            self.admission.release(ticket)
            if logged:
                assert access is not None
                access.write(call, meter, _RPC, elapsed, ids)
            if seat is not None:
                assert tenancy is not None
                tenancy.release(seat)
            if traced is not None and traced.recording:
                traced.end(
                    meter.label,
                    meter.upstream and self.pool.public_name(meter.upstream),
                    meter.code,
                )

    async def _traced_queue(self, call: CallContext, traced: Traced) -> Ticket[AnyReservation]:
        """`Admission.queue_for_slot` for a traced call: the wait is an event on its
        span, a refusal ends the span with its reason."""
        started = trio.current_time()
        try:
            ticket = await self.admission.queue_for_slot(_RPC, call.deadline, call.protocol)
        except BaseException as exc:
            traced.failed(exc)
            traced.end("", "", call.status_for(exc))
            raise
        traced.event("admission wait", seconds=trio.current_time() - started)
        return ticket

    async def _infer(
        self,
        body: Body,
        call: CallContext,
        ticket: Ticket[AnyReservation],
        meter: Meter,
        traced: Traced | None,
        seat: Seat | None = None,
    ) -> Body:
        meter.timed = False  # refused before routing: counted, but no latency observed
        try:
            # What routing reads: the body itself, or the head of a compressed or
            # gathered one.
            head = body if type(body) is bytes else self._head_of(body)
            model, sequence = peek_routing(head)
            regions = (
                self.pool.regions.check_request(head, call.owner) if self.pool.regions else _NONE
            )
        except DecodeError as exc:
            raise _malformed(exc) from exc
        if not model:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, "ModelInferRequest.model_name is empty")
        resolver = self.resolver
        # Demand counts at arrival: a call for a cold model is demand for it while it
        # waits for its load (issue 49's residency values models by it).
        self.scheduler.arrived(model)
        replicas = resolver.infer_replicas(model)
        if not replicas:
            try:
                deadline = min(call.deadline, trio.current_time() + self.request_timeout)
                if traced is None:
                    replicas = await resolver.resolve(model, _MODEL_INFER, deadline)
                else:
                    with traced.child("load wait", model=model):
                        replicas = await resolver.resolve(model, _MODEL_INFER, deadline)
            except GrpcError:
                meter.timed = True
                meter.label = resolver.label(model)
                raise
        meter.label = model
        if regions:  # it names shared memory registered through the gateway
            replicas = resolver.holding(replicas, regions)
        pinned = False
        if sequence is not None and not sequence.start:
            holder = self.sequences.pinned(
                model, sequence.id, replicas, trio.current_time(), self.pool.public_name
            )
            if holder is not None:
                replicas, pinned = (holder,), True
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
        now = trio.current_time()
        deadline = min(call.deadline, now + self.request_timeout)
        # Would it finish in time at the worker chosen? (`rsgw.scheduling.calls._forecast`)
        per_call = self.estimates.get(order[0], 0.0)
        held = ledger.held(order[0]) if per_call else 0
        if held:  # a worker holding nothing is never refused (`rsgw.scheduling.calls._forecast`)
            wait = held * per_call
            # `AdmissionRule.judge`'s two tests, inline: it is asked only to refuse.
            if wait > self._queue_limit or wait + per_call + self.rule.margin > deadline - now:
                verdict = self.rule.judge(wait, per_call, deadline - now)
                if verdict is not None:
                    where = f"at {self.pool.public_name(order[0])} ({held} calls ahead)"
                    if seat is not None:
                        self._counted(seat, REFUSED_DEADLINE)
                    self.admission.refuse(verdict, model, where)
        if seat is not None:  # who goes first at a full worker (issue 52)
            self._take_place(seat, order[0], per_call, deadline - now, model)
        meter.timed = True
        walk = RouteWalk(model, order, replicas, ledger.max_per_worker)
        # The client's request id and trace context go on to the worker
        # (`rsgw.gateway.observe._propagation`).
        metadata = upstream_metadata(call.metadata) if call.metadata else ()
        # The handler's scope ends the call at the deadline (at a gate, say), answering
        # as the gateway's deadline; `trio.Cancelled` passes through here.
        call.limit(deadline, partial(gateway_deadline, model))
        try:
            if traced is not None and traced.recording:
                traced.event("routed", order=",".join(map(self.pool.public_name, order)))
            response = await self._forward(body, walk, ticket, deadline, metadata, traced)
        except Shed:
            meter.timed = False  # the replicas filled up meanwhile: still a refusal
            raise
        finally:
            meter.upstream = walk.answered or ""
        if sequence is not None:
            self.sequences.routed(model, sequence, walk.answered, trio.current_time())
        return response

    def _take_place(self, seat: Seat, url: str, per_call: float, left: float, model: str) -> None:
        """Give `seat` a place at `url`, or refuse it to keep places for the higher
        bands and the tenants within their shares (`rsgw.scheduling.calls._shares`)."""
        assert self.tenancy is not None
        shares = self.tenancy.shares
        now = trio.current_time()
        shares.arrived(url, seat.band, seat.key, now)
        depth = depth_for(per_call, left, self.rule)
        held = self.ledger.held(url)
        verdict = shares.judge(url, seat.band, seat.key, held, depth, per_call, now)
        if verdict is not None:
            self._counted(seat, REFUSED_BY_REASON[verdict.reason])
            self.metrics.shed.inc()
            where = f"at {self.pool.public_name(url)}"
            raise GrpcError(StatusCode.RESOURCE_EXHAUSTED, describe_share(verdict, model, where))
        shares.hold(url, seat.band, seat.key, now)
        seat.url = url
        self._counted(seat, ADMITTED)

    def _seat(self, tenancy: Tenancy, body: Body, call: CallContext) -> Seat:
        """The call's tenant, band and quota place (`Tenancy.seat`)."""
        try:
            head = body if type(body) is bytes else self._head_of(body)
            return tenancy.seat(call, head, trio.current_time())
        except DecodeError as exc:
            raise _malformed(exc) from exc

    def _counted(self, seat: Seat, outcome: str) -> None:
        assert self.tenancy is not None
        self.tenancy.counted(seat.tenant, seat.band, outcome)

    def _forecast_clock(self) -> Callable[[], float]:
        """The forecast's clock: the run's, which is `time.perf_counter` plus an offset
        under trio's `SystemClock` (so perf_counter itself, a C call: the forecast only
        takes differences), and the run's own otherwise (a MockClock in tests)."""
        clock = trio.lowlevel.current_clock()
        system = type(clock).__name__ == "SystemClock"
        self._now = time.perf_counter if system else clock.current_time
        return self._now

    def _head_of(self, body: Body) -> bytes:
        """What routing reads of a body that is not plain bytes: a compressed body's
        head inflated, a large body's head from its first pieces (`Gathered`)."""
        if isinstance(body, Gathered):
            first = body.pieces[0]
            end = head_length(first, complete=False)
            if end is None:  # the head goes on past the first piece (rare): the whole body
                return bytes(body)
            return bytes(first[:end])
        assert isinstance(body, Compressed)  # a bytes subclass: what else is not plain bytes
        return inflate_prefix(body, head_length, self.max_message_bytes)

    async def _forward(
        self,
        body: Body,
        walk: RouteWalk,
        ticket: Ticket[AnyReservation],
        deadline: float,
        metadata: HeaderBlock = (),
        traced: Traced | None = None,
    ) -> Body:
        """Send to the replicas the walk names until one answers (`RouteWalk` decides)."""
        pool = self.pool
        ledger = self.ledger
        forecast = self.forecast
        clock = self._now or self._forecast_clock()
        while (url := walk.next(ledger.is_full)) is not None:
            if walk.last is not None and not self.retries.withdraw():
                raise walk.outcome()  # the retry budget cannot pay: the failure it has
            position = ledger.hold(ticket, url)  # before any wait: the gate queue counts too
            attempt: AnyAttempt | None = None
            if traced is not None:
                attempt, metadata = traced.attempt(pool.public_name(url), metadata)
            started = clock()
            if position == 1:
                forecast.busy_from(url, started)
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
                if attempt is not None:
                    attempt.failed(exc)
                expired = trio.current_time() >= deadline
                answer = walk.failed(url, exc, expired=expired, who=pool.public_name(url))
                if exc.code is StatusCode.NOT_FOUND:
                    self.prober.discovery.request_refresh()
                if answer is not None:
                    if not expired:
                        self._log_worker_error(walk.model, url, answer.code)
                    raise answer from exc
            finally:
                if attempt is not None:  # ended as its call was: answered, failed, cut short
                    attempt.end(walk.answered == url)
                now = clock()
                held = ledger.unhold(ticket)
                elapsed = now - started
                if walk.answered == url:
                    forecast.answered(url, now, held, elapsed, position)
                self.metrics.observe_worker(Method.MODEL_INFER.rpc, url, elapsed)
                if walk.answered == url:
                    measured = self.measured
                    if measured is not None:
                        measured.record(url, walk.model, elapsed)
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
