"""Which models stay in GPU memory, and where a cold one is loaded: residency by value.

Pure: no Trio, no I/O, no clock (the caller passes `now`). Issue 49: with more
handed models than the workers' budgets hold, a model called while it is loaded
nowhere is loaded on demand, and room is made first by unloading the least
valuable resident models. Never over budget: a plan's loads fit once its
evictions are done, and the shell unloads before it loads.

What a resident copy is worth is what evicting it would cost: the cold starts it
would cause, each as long as the model's load. So a model's value is its demand
(calls per second) times its reload time (seconds): the seconds of waiting per
second that keeping it saves. Evictions free bytes, so copies are chosen for
eviction by value per byte, the least first, and only those that may go:

- none with calls in flight (a running call is never cut);
- none loaded less than `min_residency_seconds` ago (no thrash: a model is not
  evicted right after the load that made room for it);
- none whose model would fall below its `min_copies` (an operator's floor).

A cold load goes to the worker where it costs least to make room (free room costs
nothing), ties to the worker the packer prefers, then to the one with most room.
When no worker can make room now (every copy is busy, young or at its floor) the
plan says so and why: the caller waits for a copy to become evictable, or refuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: A cold load waits for copies coming of age rather than evict one worth this many
#: times more than they are (see `plan_cold_load`).
WAIT_VALUE_RATIO = 4.0
#: A load time learned from this many loads weighs the newest as 1 / this.
LOAD_TIME_MEMORY = 4


@dataclass(frozen=True, slots=True)
class ResidentCopy:
    """One model's weights on one worker."""

    model: str
    size: int
    #: When its load finished (the caller's clock).
    loaded_at: float
    #: Calls on this worker for this model not yet answered.
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class WorkerMemory:
    """One worker's budget and what it holds of the handed models."""

    url: str
    budget: int
    copies: Mapping[str, ResidentCopy] = field(default_factory=dict)

    @property
    def used(self) -> int:
        return sum(copy.size for copy in self.copies.values())

    @property
    def free(self) -> int:
        return self.budget - self.used


@dataclass(frozen=True, slots=True)
class ModelTerms:
    """What residency knows of one model: its demand and its operator's floor."""

    #: Calls per second (the scheduler's smoothed arrival rate).
    demand: float = 0.0
    #: Expected seconds one load takes (`LoadTimes.expected`).
    reload_seconds: float = 1.0
    #: Copies never evicted below (always resident).
    min_copies: int = 0
    #: Copies never loaded above (None: no bound).
    max_copies: int | None = None

    @property
    def value(self) -> float:
        """Seconds of cold-start waiting per second a resident copy saves."""
        return self.demand * self.reload_seconds


@dataclass(frozen=True, slots=True)
class ColdLoad:
    """Load `model` on `url` once `evict` (models there) are unloaded."""

    model: str
    url: str
    evict: tuple[str, ...]
    #: The value given up by the evictions (0 when the room was free).
    cost: float


@dataclass(frozen=True, slots=True)
class NoRoom:
    """No worker can take the model now; `reason` says why, for the caller's message."""

    model: str
    reason: str
    #: Whether room may come without anything else changing (copies busy or young):
    #: wait; False: never, as things stand (too large, or every copy at its floor).
    may_wait: bool


#: A cold model that has waited for room this many of its expected loads goes first,
#: whatever its demand (`first_for_room`).
OVERDUE_LOADS = 2.0


def first_for_room(
    waiting: Sequence[str],
    demand: Mapping[str, float],
    since: Mapping[str, float],
    expected_load: Callable[[str], float],
    now: float,
) -> str:
    """Which of the cold models waiting for room (`waiting`, in the order they began
    to wait; `since`: when) plans first: the one most in demand (a hot model that went
    cold before the tail's), then the longest waiting; but one that has waited
    `OVERDUE_LOADS` of its expected loads goes before any that has not (in the
    long-tail bench a tail call passed over by hotter misses waited past its 5 s
    deadline)."""
    order = {m: i for i, m in enumerate(waiting)}

    def turn(m: str) -> tuple[bool, float, int]:
        overdue = now - since[m] >= OVERDUE_LOADS * expected_load(m)
        return (not overdue, 0.0 if overdue else -demand.get(m, 0.0), order[m])

    return min(waiting, key=turn)


def copies_of(workers: Iterable[WorkerMemory]) -> dict[str, int]:
    """How many workers hold each model."""
    counts: dict[str, int] = {}
    for worker in workers:
        for model in worker.copies:
            counts[model] = counts.get(model, 0) + 1
    return counts


def evictable(
    copy: ResidentCopy,
    terms: ModelTerms,
    copies: int,
    now: float,
    min_residency_seconds: float,
) -> bool:
    """Whether `copy` may be unloaded now to make room (see the module docstring)."""
    return (
        copy.in_flight == 0
        and now - copy.loaded_at >= min_residency_seconds
        and copies - 1 >= terms.min_copies
    )


def plan_cold_load(
    model: str,
    size: int,
    workers: Sequence[WorkerMemory],
    terms: Mapping[str, ModelTerms],
    now: float,
    min_residency_seconds: float,
    preferred: Sequence[str] = (),
    wait_ratio: float | None = WAIT_VALUE_RATIO,
    *,
    by_recency: bool = False,
) -> ColdLoad | NoRoom:
    """Where to load `model` (`size` bytes), and what to evict there first.

    The evictions giving up least value win. But when the copies they evict are worth
    `wait_ratio` times more than copies that will be evictable once they come of age or
    finish their calls, the plan is to wait for those (a tail model's load does not
    evict a hot one to save a few seconds).

    `preferred`: workers in the packer's order of preference, for ties. `wait_ratio`:
    None: never wait for cheaper copies. `by_recency`: the terms' values are last-use
    clocks (`eviction: lru`, the baseline): copies go least recently used first
    whatever their size, on the worker whose most recent eviction is the oldest (as a
    cache-wide LRU list evicts, ModelMesh's and Seldon Core's), never waiting.
    """
    counts = copies_of(workers)
    rank = {url: i for i, url in enumerate(preferred)}
    best: tuple[float, int, int, ColdLoad] | None = None
    blocked_by_wait = False
    for worker in workers:
        if model in worker.copies or size > worker.budget:
            continue
        plan = _room_on(model, size, worker, terms, counts, now, min_residency_seconds, by_recency)
        if plan is None:
            blocked_by_wait |= _room_if_waiting(size, worker, terms, counts)
            continue
        key = (plan.cost, rank.get(worker.url, len(rank)), -worker.free, plan)
        if best is None or key[:3] < best[:3]:
            best = key
    if best is None:
        if any(model in worker.copies for worker in workers):
            # Loaded (or loading, or leaving) where the caller's routing table does not
            # list it yet, e.g. the start-up placement's load: it will be routable.
            return NoRoom(model, _HELD_ALREADY, True)
        return _no_room(model, size, workers, blocked_by_wait)
    chosen = best[3]
    if wait_ratio is None or by_recency or not chosen.evict:
        return chosen
    dearest = max(terms.get(m, ModelTerms()).value for m in chosen.evict)
    below = math.nextafter(dearest / wait_ratio, -math.inf)  # strictly: 0 waits for nothing
    if dearest <= 0:
        return chosen
    # Copies each worth a small part of the dearest one that could make room now: evict
    # those if they give up less in all (greedy by value per byte preferred one large,
    # dear copy), else the plan stands; waiting would change nothing. Waiting used to
    # be chosen here too, and a cold model waited with nothing to wait for, holding
    # every cold model behind it past their deadlines (the long-tail bench).
    cheap = [
        plan
        for worker in workers
        if model not in worker.copies and size <= worker.budget
        for plan in [
            _room_on(model, size, worker, terms, counts, now, min_residency_seconds, ceiling=below)
        ]
        if plan is not None
    ]
    if cheap:
        cheapest = min(cheap, key=lambda p: (p.cost, rank.get(p.url, len(rank)), p.url))
        return cheapest if cheapest.cost < chosen.cost else chosen
    if _cheaper_by_waiting(chosen, size, workers, terms, counts, below):
        return NoRoom(model, _WAIT_FOR_CHEAPER, True)
    return chosen


_HELD_ALREADY = "it is on a worker already (loading, unloading, or not routed yet)"
_WAIT_FOR_CHEAPER = (
    "the copies that could make room now are worth more than ones that will come of age "
    "or finish their calls soon"
)


def _cheaper_by_waiting(
    plan: ColdLoad,
    size: int,
    workers: Sequence[WorkerMemory],
    terms: Mapping[str, ModelTerms],
    counts: Mapping[str, int],
    below: float,
) -> bool:
    """Whether room could be made, by waiting, from copies each worth less than `below`
    (a small part of the most valuable one `plan` evicts): a hot model is not evicted
    for a tail one while tail copies are about to come of age, but copies of about the
    same worth are not waited for (that would only slow the tail). The caller has
    found that the cheap copies evictable now do not make room: waiting is for the
    busy and young ones among them."""
    return any(
        _room_if_waiting(size, worker, terms, counts, below)
        for worker in workers
        if plan.model not in worker.copies and size <= worker.budget
    )


def _room_on(
    model: str,
    size: int,
    worker: WorkerMemory,
    terms: Mapping[str, ModelTerms],
    counts: Mapping[str, int],
    now: float,
    min_residency_seconds: float,
    by_recency: bool = False,
    ceiling: float = math.inf,
) -> ColdLoad | None:
    """The cheapest evictions that fit `size` on `worker` (greedy by value per byte,
    then the ones not needed given back), or None if its evictable copies (each
    worth at most `ceiling`) cannot. `by_recency`: the least recently used first until
    the room fits, each costing the newest last use among them."""
    need = size - worker.free
    if need <= 0:
        return ColdLoad(model, worker.url, (), 0.0)
    candidates = [
        copy
        for copy in worker.copies.values()
        if evictable(
            copy,
            terms.get(copy.model, ModelTerms()),
            counts.get(copy.model, 1),
            now,
            min_residency_seconds,
        )
        and _value(copy, terms) <= ceiling
    ]
    order = _value if by_recency else _density
    candidates.sort(key=lambda c: (order(c, terms), c.model))
    chosen: list[ResidentCopy] = []
    freed = 0
    for copy in candidates:
        if freed >= need:
            break
        chosen.append(copy)
        freed += copy.size
    if freed < need:
        return None
    if by_recency:
        newest = max(_value(c, terms) for c in chosen)
        return ColdLoad(model, worker.url, tuple(sorted(c.model for c in chosen)), newest)
    # Give back the most valuable ones the others already cover (no needless eviction).
    for copy in sorted(chosen, key=lambda c: -_value(c, terms)):
        if freed - copy.size >= need:
            chosen.remove(copy)
            freed -= copy.size
    evicted = tuple(sorted(c.model for c in chosen))
    return ColdLoad(model, worker.url, evicted, sum(_value(c, terms) for c in chosen))


def _room_if_waiting(
    size: int,
    worker: WorkerMemory,
    terms: Mapping[str, ModelTerms],
    counts: Mapping[str, int],
    ceiling: float = math.inf,
) -> bool:
    """Whether `worker` would have room once its busy and young copies worth at most
    `ceiling` may go."""
    may_go = sum(
        copy.size
        for copy in worker.copies.values()
        if counts.get(copy.model, 1) - 1 >= terms.get(copy.model, ModelTerms()).min_copies
        and _value(copy, terms) <= ceiling
    )
    return worker.free + may_go >= size


def _no_room(model: str, size: int, workers: Sequence[WorkerMemory], may_wait: bool) -> NoRoom:
    if not workers:
        return NoRoom(model, "no worker can load models", False)
    largest = max(worker.budget for worker in workers)
    if size > largest:
        return NoRoom(
            model, f"its {size} bytes are more than any worker's budget ({largest} bytes)", False
        )
    if may_wait:
        return NoRoom(
            model,
            "every copy that could make room has calls in flight or was loaded within the "
            "minimum residency",
            True,
        )
    return NoRoom(model, "the models that would make room are at their min_copies", False)


def _value(copy: ResidentCopy, terms: Mapping[str, ModelTerms]) -> float:
    return terms.get(copy.model, ModelTerms()).value


def _density(copy: ResidentCopy, terms: Mapping[str, ModelTerms]) -> float:
    return _value(copy, terms) / max(copy.size, 1)


def over_budget(workers: Iterable[WorkerMemory]) -> list[str]:
    """The workers holding more than their budget (the invariant says: none)."""
    return [worker.url for worker in workers if worker.used > worker.budget]


class LoadTimes:
    """Each model's load time, learned from its loads (a moving average), for the
    cold path's promise: a call whose deadline cannot cover it is refused at once.

    A model never loaded yet is expected to load at the pace the others did (their
    seconds per byte, times its bytes), else in the configured default."""

    __slots__ = ("_default", "_pace", "_seconds")

    def __init__(self, default_seconds: float) -> None:
        self._default = default_seconds
        self._seconds: dict[str, float] = {}
        #: model -> seconds per byte of its loads (for the models not loaded yet).
        self._pace: dict[str, float] = {}

    def observe(self, model: str, seconds: float, size: int = 0) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        known = self._seconds.get(model)
        if known is None:
            self._seconds[model] = seconds
        else:
            self._seconds[model] = known + (seconds - known) / LOAD_TIME_MEMORY
        if size > 0:
            self._pace[model] = self._seconds[model] / size

    def expected(self, model: str, size: int = 0) -> float:
        known = self._seconds.get(model)
        if known is not None:
            return known
        if size > 0 and self._pace:
            return size * sum(self._pace.values()) / len(self._pace)
        return self._default

    def known(self, model: str) -> bool:
        return model in self._seconds
