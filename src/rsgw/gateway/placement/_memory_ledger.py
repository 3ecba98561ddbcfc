"""What each worker holds of the handed models, counted against its budget.

Issue 49: a worker's budget is a hard limit, so every load is reserved here first, in
one synchronous step with the check (no await between reading what is free and
taking it), by whichever part loads: the placer carrying out a repack or the cold
path loading a model a call asked for. A copy counts from the moment its load is
asked until its unload has answered, so at no moment, not even while a load and an
unload run side by side, do the copies counted on a worker exceed its budget.

What the workers report (each worker's last answered RepositoryIndex, as discovery
keeps it) is the truth this ledger follows (`sync`): a copy it knows of that a worker
no longer has (the worker restarted, an operator unloaded it) is forgotten, and one it
did not load is counted from then on, as if loaded long ago. A worker that did not
answer a read keeps what it said before (a slow answer is not an empty GPU), and an
answer read before the ledger's own last load or unload there says nothing of it.
The pure decisions (`rsgw.scheduling.placement._residency`, `_budget_fit`) take its
`memory()` and `facts()` snapshots.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import trio

from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.scheduling.placement._budget_fit import ResidencyFacts
from rsgw.scheduling.placement._residency import LoadTimes, ModelTerms, ResidentCopy, WorkerMemory

#: The budget a worker without one is given in `memory()` (it never runs out).
UNBOUNDED = 1 << 62


class CopyState(enum.Enum):
    LOADING = "loading"
    RESIDENT = "resident"
    UNLOADING = "unloading"


@dataclass(slots=True)
class _Copy:
    state: CopyState
    size: int
    loaded_at: float


class MemoryLedger:
    """Each controlled worker's copies of the handed models; see the module docstring.

    Args:
        config: the `repository` block (budgets, floors, load times).
        weight: a model's weight in bytes now (reported, configured or default).
        names: a worker URL's other names (its configured name), for its budget.
        reads_begun: how many discovery reads have begun (the workers' answers are
            numbered by the read they came from).
    """

    def __init__(
        self,
        config: RepositoryConfig,
        weight: Callable[[str], int],
        names: Callable[[str], str],
        reads_begun: Callable[[], int] = lambda: 0,
    ) -> None:
        self.handed = frozenset(config.models)
        self._config = config
        self._weight = weight
        self._names = names
        self._copies: dict[str, dict[str, _Copy]] = {}
        #: model -> (set when its loads under way have ended, the workers they are on).
        self._loads: dict[str, tuple[trio.Event, set[str]]] = {}
        #: (model, url) -> the reads begun when our last load or unload of it ended:
        #: an answer from a read begun no later says nothing of it.
        self._settled: dict[tuple[str, str], int] = {}
        self._reads_begun = reads_begun
        #: url -> held by whoever makes room on that worker and takes it for a load, so
        #: the room one unload frees is not taken by another load meanwhile.
        self._rooms: dict[str, trio.Lock] = {}
        #: Set (and replaced) on every change: a cold call waiting for room wakes.
        self.changed = trio.Event()
        self.load_times = LoadTimes(config.load_seconds)

    # -- reading -------------------------------------------------------------------

    def weight(self, model: str) -> int:
        return self._weight(model)

    def room(self, url: str) -> trio.Lock:
        """The lock held while making room on `url` and taking it for a load."""
        lock = self._rooms.get(url)
        if lock is None:
            lock = self._rooms[url] = trio.Lock()
        return lock

    def budget(self, url: str) -> int:
        """`url`'s budget in bytes; 0 when unbounded."""
        return self._config.budget_of(self._names(url), url)

    def used(self, url: str) -> int:
        return sum(copy.size for copy in self._copies.get(url, {}).values())

    def free(self, url: str) -> float:
        budget = self.budget(url)
        return math.inf if budget == 0 else budget - self.used(url)

    def workers(self) -> tuple[str, ...]:
        return tuple(self._copies)

    def copies(self, url: str) -> Mapping[str, CopyState]:
        return MappingProxyType({m: c.state for m, c in self._copies.get(url, {}).items()})

    def resident(self, model: str) -> tuple[str, ...]:
        """The workers where `model` is loaded (not loading, not unloading)."""
        return tuple(
            sorted(
                url
                for url, held in self._copies.items()
                if (copy := held.get(model)) is not None and copy.state is CopyState.RESIDENT
            )
        )

    def expected_load(self, model: str) -> float:
        """Seconds `model`'s load is expected to take (0: nothing to go by)."""
        return self.load_times.expected(model, self._weight(model))

    def load_under_way(self, model: str) -> trio.Event | None:
        """Set when the loads of `model` under way end; None when none is."""
        under_way = self._loads.get(model)
        return None if under_way is None else under_way[0]

    @property
    def by_recency(self) -> bool:
        """`repository.eviction: lru`: copies are worth their recency, not their value."""
        return self._config.eviction == "lru"

    def terms(
        self, demand: Mapping[str, float], recency: Mapping[str, int] | None = None
    ) -> dict[str, ModelTerms]:
        """Each handed model's terms. Under `eviction: lru` a copy's worth is its last
        use on the calls' logical clock (`recency`): the least recently used is then the
        least valuable, and every decision by value becomes one by recency."""
        config = self._config
        if self.by_recency:
            recency = recency or {}
            demand = {model: float(recency.get(model, 0)) for model in self.handed}
        return {
            model: ModelTerms(
                demand=demand.get(model, 0.0),
                reload_seconds=1.0 if self.by_recency else max(self.expected_load(model), 0.001),
                min_copies=config.min_copies.get(model, 0),
                max_copies=config.max_copies.get(model),
            )
            for model in self.handed
        }

    def memory(self, in_flight: Callable[[str, str], int]) -> list[WorkerMemory]:
        """Every controlled worker's budget and copies, for `plan_cold_load`: a copy
        loading or unloading reads as busy (it may not be evicted)."""
        workers = []
        for url, held in self._copies.items():
            copies = {
                model: ResidentCopy(
                    model,
                    copy.size,
                    copy.loaded_at,
                    in_flight(model, url) + (copy.state is not CopyState.RESIDENT),
                )
                for model, copy in held.items()
            }
            workers.append(WorkerMemory(url, self.budget(url) or UNBOUNDED, copies))
        return workers

    def facts(
        self, demand: Mapping[str, float], now: float, recency: Mapping[str, int] | None = None
    ) -> ResidencyFacts:
        """What a repack's placement is cut to (`fit_to_budgets`): budgeted workers only."""
        workers = {
            url: WorkerMemory(
                url,
                self.budget(url),
                {m: ResidentCopy(m, c.size, c.loaded_at) for m, c in held.items()},
            )
            for url, held in self._copies.items()
            if self.budget(url) > 0
        }
        return ResidencyFacts(
            handed=self.handed,
            workers=MappingProxyType(workers),
            weights=MappingProxyType({m: self._weight(m) for m in self.handed}),
            terms=MappingProxyType(self.terms(demand, recency)),
            min_residency_seconds=self._config.min_residency_seconds,
            now=now,
        )

    # -- following the workers ------------------------------------------------------------

    def sync(
        self,
        urls: Collection[str],
        reported: Mapping[str, tuple[int, frozenset[str]]],
    ) -> None:
        """Follow what `urls` (the controlled workers) reported loaded (`reported`:
        url -> the number of the read its answer came from, and the models READY):
        copies under way are left alone, and so is a copy whose load or unload ended
        after the read that reported on it began (the answer predates it); the rest
        are made to agree."""
        urls = set(urls)
        changed = False
        for url in list(self._copies):
            if url not in urls:
                del self._copies[url]
                changed = True
        for url in urls:
            self._copies.setdefault(url, {})
        for model in self.handed:
            size = self._weight(model)
            for url, held in self._copies.items():
                read, ready = reported.get(url, (0, frozenset()))
                if url not in reported or read <= self._settled.get((model, url), 0):
                    continue  # no answer since our own last change there
                self._settled.pop((model, url), None)
                copy = held.get(model)
                if copy is None:
                    if model in ready:  # loaded by someone else (or before we started)
                        held[model] = _Copy(CopyState.RESIDENT, size, -math.inf)
                        changed = True
                elif copy.state is CopyState.RESIDENT:
                    if model not in ready:
                        del held[model]
                        changed = True
                    elif copy.size != size:
                        copy.size = size
                        changed = True
        if changed:
            self._changed()

    # -- reserving -------------------------------------------------------------------------

    def begin_load(self, model: str, url: str) -> bool:
        """Count a load of `model` on `url` from now, if it fits; False if it does not
        (or the model is held there already)."""
        held = self._copies.setdefault(url, {})
        size = self._weight(model)
        if model in held or size > self.free(url):
            return False
        held[model] = _Copy(CopyState.LOADING, size, math.inf)
        self._loads.setdefault(model, (trio.Event(), set()))[1].add(url)
        return True

    def end_load(
        self,
        model: str,
        url: str,
        *,
        loaded: bool,
        now: float,
        seconds: float,
        protected: bool = True,
    ) -> None:
        """A load answered. A copy `protected` is not evicted within the minimum
        residency from `now`; one start-up placed before any call was measured is
        not (nothing says it is worth keeping, and a cold call must not wait for it)."""
        self._settled[(model, url)] = self._reads_begun()
        held = self._copies.get(url, {})
        copy = held.get(model)
        if copy is not None and copy.state is CopyState.LOADING:
            if loaded:
                copy.state = CopyState.RESIDENT
                copy.loaded_at = now if protected else -math.inf
                self.load_times.observe(model, seconds, copy.size)
            else:
                del held[model]
        under_way = self._loads.get(model)
        if under_way is not None:
            under_way[1].discard(url)
            if not under_way[1]:
                del self._loads[model]
                under_way[0].set()
        self._changed()

    def begin_unload(self, model: str, url: str) -> bool:
        """Mark `model` on `url` as unloading (still counted); False if it is not a
        resident copy (already leaving, or not there)."""
        copy = self._copies.get(url, {}).get(model)
        if copy is None or copy.state is not CopyState.RESIDENT:
            return False
        copy.state = CopyState.UNLOADING
        return True

    def end_unload(self, model: str, url: str, *, unloaded: bool) -> None:
        self._settled[(model, url)] = self._reads_begun()
        held = self._copies.get(url, {})
        copy = held.get(model)
        if copy is not None and copy.state is CopyState.UNLOADING:
            if unloaded:
                del held[model]
            else:
                copy.state = CopyState.RESIDENT
        self._changed()

    def _changed(self) -> None:
        changed, self.changed = self.changed, trio.Event()
        changed.set()
