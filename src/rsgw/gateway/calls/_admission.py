"""Admission: refuse at arrival what would not finish in time; at the cap, queue for a slot.

At `max_concurrent_requests` the original refused every further call
(RESOURCE_EXHAUSTED). When the gateway's own CPU is what is full, that is the worst
answer: a refusal costs nearly half of what serving the call would (the request is
read and parsed either way), so at three times its capacity a refusing gateway
spends itself refusing and serves almost nothing. Here a call that finds the cap
full waits in a FIFO queue for a slot when it would still finish in time (the
queue's length times how often a slot frees, measured, then the time a call holds
its slot), and is refused at once only when it would not (`rsgw.scheduling.calls._forecast`:
past its deadline, or waiting longer than `grpc.max_queue_seconds`). When the
workers' devices are what is full, a call's slot time is mostly its wait at the
worker, so queueing for a slot is hopeless and the call is refused at arrival,
cheaply, instead of timing out after its whole deadline. The server reads requests
until twice the cap are running (`intake_limit`): past the admitted calls, room to
read, queue or refuse the next; past that it reads nothing more
(`GrpcServer(max_running_calls=)`), so what the gateway cannot even refuse waits in
the clients, not here.

A waiter that gives up (its deadline, its client gone) is marked and left in place,
so leaving costs the same at any queue length (up to 64 x cap); a hand-over skips
the marked ones, and `waiting` is a live count of the others. When more than half the
queue is marked it is swept, so waiters that left never pile up while no slot frees.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Generic, NoReturn, TypeVar

import trio

from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.scheduling.calls._forecast import (
    INITIAL_SLOT_SECONDS,
    SLOT_ALPHA,
    AdmissionRule,
    Forecast,
    Verdict,
    describe,
    wait_for_slot,
)
from rsgw.scheduling.calls._ledger import Ledger, Ticket
from rsgw.scheduling.calls._plan import shed_at_gateway
from rsgw.scheduling.calls._schedulers import AnyReservation

if TYPE_CHECKING:
    from rsgw.gateway.observe._metrics import GatewayMetrics

T = TypeVar("T")

#: Calls queued at most, as a multiple of the cap (without a deadline, calls wait up to it).
MAX_QUEUE_FACTOR = 64
#: Calls running in the server (admitted, queued, or being refused) at which it stops
#: reading requests, as a multiple of the inbound cap.
INTAKE_FACTOR = 2


def intake_limit(cap: int) -> int:
    """`GrpcServer(max_running_calls=)` for an inbound cap (0: uncapped, no limit)."""
    return cap * INTAKE_FACTOR


class _Waiter(Generic[T]):
    __slots__ = ("gone", "granted", "ticket")

    def __init__(self) -> None:
        self.granted = trio.Event()
        self.ticket: T | None = None
        #: It gave up before a slot came: a hand-over skips it.
        self.gone = False


class AdmissionQueue(Generic[T]):
    """FIFO waiting for the inbound cap's slots (see the module docstring).

    A slot is handed over as the ticket the releasing call's successor is admitted
    with, so arrivals never overtake the queue.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        #: Waiters in arrival order, those that gave up among them (`gone`).
        self._waiters: deque[_Waiter[T]] = deque()
        self._waiting = 0
        #: Seconds an admitted call holds its slot, on average (measured).
        self.service_seconds = INITIAL_SLOT_SECONDS

    @property
    def waiting(self) -> int:
        """Calls waiting for a slot now (not those that gave up)."""
        return self._waiting

    @property
    def full(self) -> bool:
        """No call may queue (uncapped, or the queue at its longest)."""
        return self.cap <= 0 or self._waiting >= self.cap * MAX_QUEUE_FACTOR

    async def wait_turn(self, give_back: Callable[[T], None]) -> T:
        """Queue until a slot is handed over; its ticket. Cancellation leaves the queue.

        A slot handed over just as the caller gave up goes back (`give_back`).
        """
        waiter: _Waiter[T] = _Waiter()
        self._waiters.append(waiter)
        self._waiting += 1
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter.ticket is None:
                self._leave(waiter)
            else:
                give_back(waiter.ticket)
            raise
        assert waiter.ticket is not None
        return waiter.ticket

    def observe(self, held_seconds: float) -> None:
        """A call held its slot this long (the service time estimate)."""
        self.service_seconds += SLOT_ALPHA * (held_seconds - self.service_seconds)

    def hand_over(self, admit: Callable[[], T | None]) -> None:
        """A slot was freed: admit the first waiter with it, if any."""
        if self._waiting:
            ticket = admit()
            if ticket is not None:
                waiter = self._waiters.popleft()
                while waiter.gone:  # ends: a waiter still waits
                    waiter = self._waiters.popleft()
                self._waiting -= 1
                waiter.ticket = ticket
                waiter.granted.set()

    def _leave(self, waiter: _Waiter[T]) -> None:
        """`waiter` gave up: marked in place; the queue is swept once mostly marked."""
        waiter.gone = True
        self._waiting -= 1
        if len(self._waiters) > 2 * self._waiting:  # each sweep follows as many leavings
            self._waiters = deque(w for w in self._waiters if not w.gone)


class Admission:
    """The inbound cap of one gateway: the ledger's slots, the queue for them, refusals.

    ModelInfer admits inline (`ledger.admit()` while nobody waits) and queues through
    `queue_for_slot`; the shared-memory calls hold a slot for their duration
    (`admitted`). Either way a refusal is counted once, as a shed.
    """

    def __init__(
        self,
        ledger: Ledger[AnyReservation],
        metrics: GatewayMetrics,
        max_queue_seconds: float = 0.0,
        forecast: Forecast | None = None,
    ) -> None:
        #: Admitted calls, the calls each worker holds, and the scheduler's charges.
        self.ledger = ledger
        #: Calls waiting for a slot under the cap (ModelInfer only).
        self.queue: AdmissionQueue[Ticket[AnyReservation]] = AdmissionQueue(ledger.max_inflight)
        #: Each worker's seconds per call ahead, from the calls it answered.
        self.forecast = forecast or Forecast()
        self.rule = AdmissionRule(max_queue_seconds)
        self._metrics = metrics
        metrics.track_forecast(self.forecast.estimates, ledger.held)
        metrics.max_concurrent.set(ledger.max_inflight)
        if ledger.max_inflight:
            metrics.track_inflight(lambda: ledger.inflight)

    def resize(self, max_concurrent_requests: int) -> None:
        """A new inbound cap (the workers changed): waiting calls take the new room."""
        self.ledger.max_inflight = max_concurrent_requests
        self.queue.cap = max_concurrent_requests
        self._metrics.max_concurrent.set(max_concurrent_requests)
        while self.queue.waiting:
            waiting = self.queue.waiting
            self.queue.hand_over(self.ledger.admit)
            if self.queue.waiting == waiting:
                break

    def admit(self, rpc: str) -> Ticket[AnyReservation]:
        """A ledger ticket for a new call, or RESOURCE_EXHAUSTED (counted) at the cap."""
        ticket = self.ledger.admit()
        if ticket is None:
            self.shed(rpc)
        return ticket

    def shed(self, rpc: str, protocol: str = "grpc") -> NoReturn:
        """Refuse a call at the cap: counted, and RESOURCE_EXHAUSTED raised."""
        self._metrics.shed.inc()
        self._metrics.observe(rpc, "", StatusCode.RESOURCE_EXHAUSTED, None, protocol)
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

    def refuse(self, verdict: Verdict, model: str, where: str) -> NoReturn:
        """Refuse a call that would not finish in time (counted as shed by the caller's
        meter and `gateway_requests_shed_total`)."""
        self._metrics.shed.inc()
        self._metrics.refusals[verdict.reason].inc()
        raise GrpcError(StatusCode.RESOURCE_EXHAUSTED, describe(verdict, model, where))

    async def queue_for_slot(
        self, rpc: str, deadline: float, protocol: str = "grpc"
    ) -> Ticket[AnyReservation]:
        """The cap is full (or others wait): queue if the call would still finish in
        time once it has a slot, else refuse it now.

        A slot is held `service_seconds` on average, and of that all but a call's own
        service (the forecast's typical seconds per call) is waiting at the worker.
        """
        queue = self.queue
        if queue.full:
            self.shed(rpc, protocol)
        per_call = self.forecast.typical()
        wait = wait_for_slot(queue.waiting, queue.cap, queue.service_seconds, per_call)
        verdict = self.rule.judge(wait, per_call, deadline - trio.current_time())
        if verdict is not None:
            self._metrics.observe(rpc, "", StatusCode.RESOURCE_EXHAUSTED, None, protocol)
            self.refuse(verdict, "", "for a slot and at its worker")
        return await queue.wait_turn(self.release)
