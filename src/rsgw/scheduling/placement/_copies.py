"""What each budgeted worker holds of the handed models: the bookkeeping of residency.

Pure: no Trio, no I/O, no clock (callers pass `now`). Issue 49: a worker's budget is
a hard limit, so a load is counted from the moment it is asked (`take_load`, one
synchronous step with the check: nothing can take the same room in between) until its
unload has answered (`unload_answered`). The gateway's memory ledger
(`rsgw.gateway.placement._memory_ledger`) adds to this book what a Trio shell needs
(events to wait on, room locks, following the workers' RepositoryIndex answers); the
simulator's (`rsgw.simulate._ledger`) adds what virtual time needs. Both hand the pure
decisions (`_residency.plan_cold_load`, `_budget_fit.fit_to_budgets`) the same
snapshots, `memory()` and `facts()`, and learn load times the same way.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from rsgw.scheduling.placement._budget_fit import ResidencyFacts
from rsgw.scheduling.placement._residency import LoadTimes, ModelTerms, ResidentCopy, WorkerMemory

#: The budget a worker without one is given in `memory()` (it never runs out).
UNBOUNDED = 1 << 62


class RepositoryTerms(Protocol):
    """What the book reads of the gateway's `repository` block (`RepositoryConfig`)."""

    @property
    def models(self) -> tuple[str, ...]: ...
    @property
    def load_seconds(self) -> float: ...
    @property
    def eviction(self) -> str: ...
    @property
    def min_residency_seconds(self) -> float: ...
    @property
    def min_copies(self) -> Mapping[str, int]: ...
    @property
    def max_copies(self) -> Mapping[str, int]: ...
    def budget_of(self, *names: str) -> int: ...


class CopyState(enum.Enum):
    LOADING = "loading"
    RESIDENT = "resident"
    UNLOADING = "unloading"


@dataclass(slots=True)
class Copy:
    """One model's weights on one worker, as the book counts them."""

    state: CopyState
    size: int
    #: When its load answered (inf while loading; -inf: not protected by the minimum
    #: residency, as a start-up copy or one found loaded).
    loaded_at: float


class CopyBook:
    """Each worker's copies of the handed models, against its budget.

    Args:
        config: the `repository` block (budgets, floors, eviction, load times).
        weight: a model's weight in bytes now (reported, configured or default).
        names: a worker URL's other name (its configured name), for its budget.
        urls: the workers known from the start (others are added by their first load).
    """

    def __init__(
        self,
        config: RepositoryTerms,
        weight: Callable[[str], int],
        names: Callable[[str], str] | None = None,
        urls: Collection[str] = (),
    ) -> None:
        self.handed = frozenset(config.models)
        self._config = config
        self._weight = weight
        self._names = names
        self._copies: dict[str, dict[str, Copy]] = {url: {} for url in urls}
        #: url -> when its last load answered (loads there run one by one).
        self._last_load_end: dict[str, float] = {}
        self.load_times = LoadTimes(config.load_seconds)

    # -- reading -------------------------------------------------------------------

    def weight(self, model: str) -> int:
        return self._weight(model)

    def budget(self, url: str) -> int:
        """`url`'s budget in bytes; 0 when unbounded."""
        if self._names is None:
            return self._config.budget_of(url)
        return self._config.budget_of(self._names(url), url)

    def used(self, url: str) -> int:
        return sum(copy.size for copy in self._copies.get(url, {}).values())

    def free(self, url: str) -> float:
        budget = self.budget(url)
        return math.inf if budget == 0 else budget - self.used(url)

    def copies(self, url: str) -> Mapping[str, CopyState]:
        return MappingProxyType({m: c.state for m, c in self._copies.get(url, {}).items()})

    def expected_load(self, model: str) -> float:
        """Seconds `model`'s load is expected to take (0: nothing to go by)."""
        return self.load_times.expected(model, self._weight(model))

    @property
    def by_recency(self) -> bool:
        """`repository.eviction: lru`: copies are worth their recency, not their value."""
        return self._config.eviction == "lru"

    def over_budget(self) -> list[str]:
        """The workers whose copies exceed their budget (the invariant says: none)."""
        return [url for url in self._copies if 0 < self.budget(url) < self.used(url)]

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
        """Every worker's budget and copies, for `plan_cold_load`: a copy loading or
        unloading reads as busy (it may not be evicted)."""
        return [
            WorkerMemory(
                url,
                self.budget(url) or UNBOUNDED,
                {
                    model: ResidentCopy(
                        model,
                        copy.size,
                        copy.loaded_at,
                        in_flight(model, url) + (copy.state is not CopyState.RESIDENT),
                    )
                    for model, copy in held.items()
                },
            )
            for url, held in self._copies.items()
        ]

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

    # -- reserving -------------------------------------------------------------------------

    def take_load(self, model: str, url: str) -> bool:
        """Count a load of `model` on `url` from now, if it fits; False if it does not
        (or the model is held there already)."""
        held = self._copies.setdefault(url, {})
        size = self._weight(model)
        if model in held or size > self.free(url):
            return False
        held[model] = Copy(CopyState.LOADING, size, math.inf)
        return True

    def load_answered(
        self, model: str, url: str, *, loaded: bool, now: float, seconds: float, protected: bool
    ) -> None:
        """A load answered after `seconds`. A copy `protected` is not evicted within the
        minimum residency from `now`; one start-up placed before any call was measured
        is not (nothing says it is worth keeping, and a cold call must not wait for it)."""
        if loaded:
            # A worker loads one model after another: a load asked while another was
            # under way there took the time since that one ended, not since it was
            # asked (the start-up placement asks a dozen at once, and a cold call was
            # refused for a "7 s" load of half a second).
            previous = self._last_load_end.get(url, -math.inf)
            self._last_load_end[url] = now
            seconds = now - max(now - seconds, previous)
        held = self._copies.get(url, {})
        copy = held.get(model)
        if copy is not None and copy.state is CopyState.LOADING:
            if loaded:
                copy.state = CopyState.RESIDENT
                copy.loaded_at = now if protected else -math.inf
                self.load_times.observe(model, seconds, copy.size)
            else:
                del held[model]

    def begin_unload(self, model: str, url: str) -> bool:
        """Mark `model` on `url` as unloading (still counted); False if it is not a
        resident copy (already leaving, or not there)."""
        copy = self._copies.get(url, {}).get(model)
        if copy is None or copy.state is not CopyState.RESIDENT:
            return False
        copy.state = CopyState.UNLOADING
        return True

    def unload_answered(self, model: str, url: str, *, unloaded: bool) -> None:
        """An unload answered: the room is given back, or the copy stays resident."""
        held = self._copies.get(url, {})
        copy = held.get(model)
        if copy is not None and copy.state is CopyState.UNLOADING:
            if unloaded:
                del held[model]
            else:
                copy.state = CopyState.RESIDENT
