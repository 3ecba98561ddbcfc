"""The simulated device's request queues: which model runs next, and which requests.

Pure: no Trio, no clock of its own (the shell passes `now`). This is the worker's
coalescing scheduler (REFERENCE.md §8.3): per-model FIFO queues, one batch
executing at a time, and a batch plan that takes requests from the front of the
chosen model's queue while their rows fit the model's max batch size.

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

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable

T = TypeVar("T")


class Discipline(enum.Enum):
    """How the device picks the next model to dispatch."""

    FIFO = "fifo"  # the model whose oldest queued request is oldest


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
class Batch(Generic[T]):
    """What the shell must do next: drop `expired`, then run `requests` together."""

    model: str
    requests: tuple[Pending[T], ...]
    expired: tuple[Pending[T], ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.requests)


class RequestQueues(Generic[T]):
    """Per-model FIFO queues and the dispatch decision over them."""

    def __init__(self, discipline: Discipline = Discipline.FIFO) -> None:
        self.discipline = discipline
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

    def _front(self, model: str) -> Pending[T] | None:
        queue = self._queues[model]
        while queue and not queue[0].queued:
            queue.popleft()
            self._withdrawn -= 1
        if not queue:
            del self._queues[model]
            return None
        return queue[0]

    def _pick_model(self) -> str | None:
        best: tuple[float, int, str] | None = None
        for model in list(self._queues):
            front = self._front(model)
            if front is None:
                continue
            key = (front.enqueued_at, front.seq, model)
            if best is None or key < best:
                best = key
        return None if best is None else best[2]

    def next_batch(self, max_batch_size: dict[str, int], now: float) -> Batch[T] | None:
        """Choose the next batch, or None when nothing is queued.

        Args:
            max_batch_size: per model; a model missing or at 0 takes one request
                per dispatch (it does not coalesce).
            now: the shell's clock, to expire requests whose deadline passed.
        """
        expired: list[Pending[T]] = []
        while True:
            model = self._pick_model()
            if model is None:
                return Batch("", (), tuple(expired)) if expired else None
            batch = self._take(model, max_batch_size.get(model, 0), now, expired)
            if batch:
                return Batch(model, tuple(batch), tuple(expired))

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
