"""The simulated device's request queues: which model runs next, and which requests.

Pure: no Trio, no clock of its own (the shell passes `now`). This is the worker's
coalescing scheduler (docs/original.md §8.3): per-model FIFO queues, one batch
executing at a time, and a batch plan that takes requests from the front of the
chosen model's queue while their rows fit the model's max batch size.

Which model runs next depends on the discipline:
- `fifo`: the model whose oldest queued request is oldest.
- `edf`: the model with the soonest deadline among its queued requests (no
  deadline is least urgent); ties as fifo, so with uniform deadlines edf *is*
  fifo. Before a batch runs, requests that cannot finish within the learned
  cost of this batch are dropped as expired (laxity): running them would spend
  device time on answers nobody waits for.
- `fair`: the highest priority of `FairShare.priorities` (see `_fair.py`), over
  the learned cost of each model's planned batch; ties as fifo.
The learned costs and the fair state are fed by the shell through `record`
after each dispatch.

A model may hold its requests back to batch them, as Triton's dynamic batcher does
(`BatchPolicy`: `max_queue_delay` and `preferred_batch_size`). Such a model is not
a candidate until its queue can fill a batch (its max batch size, or a preferred
size) or its oldest request has waited `max_queue_delay`; `wake_at` says when the
next held model becomes a candidate, so the shell sleeps until then or until a new
request comes. With a preferred size formed, the batch is the largest preferred
size the queue holds; once the delay is over, whatever is there, up to the max.
A policy with no delay (the default) is today's eager dispatch.

Invariants:
- A request is in at most one queue, and leaves it exactly once: in a batch, as
  expired, or withdrawn by its caller.
- A batch holds at least one request (an oversized front request still runs, as
  a GPU runtime pads or grows the batch for it) and only requests whose input
  shapes share the front request's variant, so they could be stacked.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from rsgw.worker.device._costs import LearnedCosts
from rsgw.worker.device._fair import FairShare

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable, Mapping

T = TypeVar("T")


class Discipline(enum.Enum):
    """How the device picks the next model to dispatch."""

    FIFO = "fifo"  # the model whose oldest queued request is oldest
    EDF = "edf"  # the model whose most urgent queued request is most urgent
    FAIR = "fair"  # the model furthest below its weighted share of recent compute


@dataclass(slots=True, eq=False)
class Pending(Generic[T]):
    """One queued request. `payload` is whatever the shell needs to answer it."""

    model: str
    rows: int
    #: Requests coalesce only with the same variant (their non-batch dimensions).
    variant: Hashable
    enqueued_at: float
    deadline: float = math.inf
    payload: T | None = None
    seq: int = 0
    queued: bool = field(default=False, repr=False)


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """A model's dynamic batching (Triton's `dynamic_batching`); see the module docstring."""

    #: Seconds the oldest request may wait for the batch to fill; 0 = dispatch at once.
    max_queue_delay: float = 0.0
    #: Batch sizes (rows) worth dispatching at once, without waiting longer.
    preferred_batch_size: tuple[int, ...] = ()


EAGER = BatchPolicy()


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    """What the shell must do next: drop `expired`, then run `requests` together."""

    model: str
    requests: tuple[Pending[T], ...]
    expired: tuple[Pending[T], ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.requests)


@dataclass(frozen=True, slots=True)
class BatchSeen:
    """One batch a traced request ran in, as the device saw it (its clock's seconds).

    What a span needs to show where the request's time went: waiting in the queue
    (`queued` to `started`), its model's weights loading (`started` to `computing`),
    the batch computing (`computing` to `ended`), and with how many others.
    """

    queued: float
    started: float
    computing: float
    ended: float
    requests: int
    rows: int


class RequestQueues(Generic[T]):
    """Per-model FIFO queues and the dispatch decision over them.

    Args:
        discipline: how the next model is chosen (module docstring).
        costs: the learned dispatch costs; `fair` ranks by them and `edf`
            drops by them. Shared with whoever records into them.
        fair: the weights and recent compute `fair` ranks by.
    """

    def __init__(
        self,
        discipline: Discipline = Discipline.FIFO,
        *,
        costs: LearnedCosts | None = None,
        fair: FairShare | None = None,
    ) -> None:
        self.discipline = discipline
        self.costs = LearnedCosts() if costs is None else costs
        self.fair = FairShare() if fair is None else fair
        self._queues: dict[str, deque[Pending[T]]] = {}
        self._seq = itertools.count()
        self._withdrawn = 0

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values()) - self._withdrawn

    def depth(self, model: str) -> int:
        """Requests of `model` waiting (withdrawn ones may linger until skipped)."""
        queue = self._queues.get(model)
        return 0 if queue is None else sum(1 for p in queue if p.queued)

    def enqueue(self, pending: Pending[T]) -> None:
        pending.seq = next(self._seq)
        pending.queued = True
        self._queues.setdefault(pending.model, deque()).append(pending)

    def withdraw(self, pending: Pending[T]) -> bool:
        """Take a request out before it runs (its caller gave up). True if it was queued.

        The entry stays in its deque, marked, and is skipped when it reaches the
        front: removing from the middle of a deque is linear, skipping is free.
        """
        if not pending.queued:
            return False
        pending.queued = False
        self._withdrawn += 1
        return True

    def record(self, model: str, rows: int, seconds: float, now: float) -> None:
        """Tell the scheduler a dispatch of `rows` rows of `model` took `seconds`, ending `now`."""
        self.costs.record(model, rows, seconds)
        self.fair.record(model, seconds, now)

    def _front(self, model: str) -> Pending[T] | None:
        queue = self._queues[model]
        while queue and not queue[0].queued:
            queue.popleft()
            self._withdrawn -= 1
        if not queue:
            del self._queues[model]
            return None
        return queue[0]

    def _fronts(self) -> dict[str, Pending[T]]:
        fronts: dict[str, Pending[T]] = {}
        for model in list(self._queues):
            front = self._front(model)
            if front is not None:
                fronts[model] = front
        return fronts

    def _pick_model(
        self, max_batch_size: dict[str, int], now: float, policies: Mapping[str, BatchPolicy]
    ) -> str | None:
        fronts = self._fronts()
        if policies:
            fronts = {
                m: f
                for m, f in fronts.items()
                if self._size(m, max_batch_size.get(m, 0), now, policies.get(m, EAGER)) is not None
            }
        if not fronts:
            return None
        if self.discipline is Discipline.EDF:
            urgency = {m: self._soonest_deadline(m) for m in fronts}
            return min(fronts, key=lambda m: (urgency[m], fronts[m].enqueued_at, fronts[m].seq, m))
        if self.discipline is Discipline.FAIR:
            return self._pick_fair(fronts, max_batch_size, now)
        return min(fronts, key=lambda m: (fronts[m].enqueued_at, fronts[m].seq, m))

    def _soonest_deadline(self, model: str) -> float:
        # A scan: deadlines are not ordered within a FIFO queue, and a heap would
        # need its own lazy deletion for withdrawn requests. Queues are bounded
        # by the admission cap, so this stays cheap next to a dispatch.
        return min((p.deadline for p in self._queues[model] if p.queued), default=math.inf)

    def _pick_fair(
        self, fronts: dict[str, Pending[T]], max_batch_size: dict[str, int], now: float
    ) -> str:
        costs: dict[str, float] = {}
        for model in fronts:
            rows, requests = self._plan(model, max_batch_size.get(model, 0), now)
            if requests == 0:
                # Nothing runnable, only expired requests: choose it so that
                # `_take` clears them, whatever its priority would be.
                return model
            cost = self.costs.estimate(model, rows)
            costs[model] = self.fair.effective_cost(cost, requests)
        priority = self.fair.priorities(costs, now)
        return min(fronts, key=lambda m: (-priority[m], fronts[m].enqueued_at, fronts[m].seq, m))

    def next_batch(
        self,
        max_batch_size: dict[str, int],
        now: float,
        policies: Mapping[str, BatchPolicy] | None = None,
    ) -> Batch[T] | None:
        """Choose the next batch, or None when nothing is queued or ready.

        Args:
            max_batch_size: per model; a model missing or at 0 takes one request
                per dispatch (it does not coalesce).
            now: the shell's clock, to expire requests whose deadline passed
                (and, under `edf`, those that could not finish in time).
            policies: per model, how long it may hold requests to batch them
                (missing: dispatch at once); see `wake_at`.
        """
        policies = policies or {}
        expired: list[Pending[T]] = []
        while True:
            model = self._pick_model(max_batch_size, now, policies)
            if model is None:
                return Batch("", (), tuple(expired)) if expired else None
            cap = max_batch_size.get(model, 0)
            if policies:
                cap = self._size(model, cap, now, policies.get(model, EAGER)) or cap
            batch = self._take(model, cap, now, expired)
            if batch and self.discipline is Discipline.EDF:
                batch = self._drop_late(model, batch, now, expired)
            if batch:
                return Batch(model, tuple(batch), tuple(expired))

    def _size(self, model: str, cap: int, now: float, policy: BatchPolicy) -> int | None:
        """The rows `model` should dispatch now under `policy`; None while it holds back.

        Eager (no delay), a timed-out oldest request, or a full batch: `cap`. A
        preferred size the queue holds: the largest such.
        """
        if policy.max_queue_delay <= 0 or cap <= 0:
            return cap
        front = self._front(model)
        if front is None:
            return None
        # The same sum `wake_at` reports, so a caller woken at that instant finds the
        # delay over (a difference could round below the delay, and a simulation in
        # virtual time would then be woken at the same instant forever).
        if now >= front.enqueued_at + policy.max_queue_delay:
            return cap
        rows, _ = self._plan(model, cap, now)
        if rows >= cap:
            return cap
        formed = [size for size in policy.preferred_batch_size if size <= rows]
        return max(formed) if formed else None

    def wake_at(self, policies: Mapping[str, BatchPolicy]) -> float:
        """When the first model held back by its policy may dispatch (inf: none is)."""
        soonest = math.inf
        for model, policy in policies.items():
            if policy.max_queue_delay > 0 and model in self._queues:
                front = self._front(model)
                if front is not None:
                    soonest = min(soonest, front.enqueued_at + policy.max_queue_delay)
        return soonest

    def _drop_late(
        self, model: str, batch: list[Pending[T]], now: float, expired: list[Pending[T]]
    ) -> list[Pending[T]]:
        """Laxity: move to `expired` the requests that would miss their deadline anyway.

        Only against a learned cost: before a model's first dispatch we know
        nothing, and guessing would drop requests that might have made it.
        """
        cost = self.costs.learned(model, sum(p.rows for p in batch))
        if cost is None:
            return batch
        finish = now + cost
        kept: list[Pending[T]] = []
        for pending in batch:
            (kept if pending.deadline >= finish else expired).append(pending)
        return kept

    def _plan(self, model: str, cap: int, now: float) -> tuple[int, int]:
        """The (rows, requests) `_take` would take now, without taking them."""
        rows = 0
        requests = 0
        variant: Hashable = None
        for pending in self._queues[model]:
            if not pending.queued or pending.deadline <= now:
                continue
            if requests:
                if cap <= 0 or pending.variant != variant or rows + pending.rows > cap:
                    break
            else:
                variant = pending.variant
            rows += pending.rows
            requests += 1
            if cap <= 0:
                break
        return rows, requests

    def _take(
        self, model: str, cap: int, now: float, expired: list[Pending[T]]
    ) -> list[Pending[T]]:
        queue = self._queues[model]
        taken: list[Pending[T]] = []
        rows = 0
        variant: Hashable = None
        while queue:
            front = queue[0]
            if not front.queued:
                queue.popleft()
                self._withdrawn -= 1
                continue
            if front.deadline <= now:
                queue.popleft()
                front.queued = False
                expired.append(front)
                continue
            if taken:
                if cap <= 0 or front.variant != variant or rows + front.rows > cap:
                    break
            else:
                variant = front.variant
            queue.popleft()
            front.queued = False
            taken.append(front)
            rows += front.rows
            if cap <= 0:
                break
        if not queue:
            self._queues.pop(model, None)
        return taken

    def drain(self) -> Iterable[Pending[T]]:
        """Remove and return every queued request (the device is shutting down)."""
        for queue in self._queues.values():
            for pending in queue:
                if pending.queued:
                    pending.queued = False
                    yield pending
        self._queues.clear()
        self._withdrawn = 0
