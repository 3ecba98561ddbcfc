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
The bookkeeping is the pure `rsgw.scheduling.placement._copies.CopyBook`; this is
its Trio shell: events to wait for a load or any change, room locks, and following
the workers. The pure decisions (`_residency`, `_budget_fit`) take its `memory()` and
`facts()` snapshots.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping

import trio

from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.scheduling.placement._copies import UNBOUNDED, Copy, CopyBook, CopyState

__all__ = ["UNBOUNDED", "CopyState", "MemoryLedger"]


class MemoryLedger(CopyBook):
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
        super().__init__(config, weight, names)
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

    # -- reading -------------------------------------------------------------------

    def room(self, url: str) -> trio.Lock:
        """The lock held while making room on `url` and taking it for a load."""
        lock = self._rooms.get(url)
        if lock is None:
            lock = self._rooms[url] = trio.Lock()
        return lock

    def workers(self) -> tuple[str, ...]:
        return tuple(self._copies)

    def resident(self, model: str) -> tuple[str, ...]:
        """The workers where `model` is loaded (not loading, not unloading)."""
        return tuple(
            sorted(
                url
                for url, held in self._copies.items()
                if (copy := held.get(model)) is not None and copy.state is CopyState.RESIDENT
            )
        )

    def load_under_way(self, model: str) -> trio.Event | None:
        """Set when the loads of `model` under way end; None when none is."""
        under_way = self._loads.get(model)
        return None if under_way is None else under_way[0]

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
                        held[model] = Copy(CopyState.RESIDENT, size, -math.inf)
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
        if not self.take_load(model, url):
            return False
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
        """A load answered (see `CopyBook.load_answered`); its waiters wake."""
        self._settled[(model, url)] = self._reads_begun()
        self.load_answered(model, url, loaded=loaded, now=now, seconds=seconds, protected=protected)
        under_way = self._loads.get(model)
        if under_way is not None:
            under_way[1].discard(url)
            if not under_way[1]:
                del self._loads[model]
                under_way[0].set()
        self._changed()

    def end_unload(self, model: str, url: str, *, unloaded: bool) -> None:
        self._settled[(model, url)] = self._reads_begun()
        self.unload_answered(model, url, unloaded=unloaded)
        self._changed()

    def _changed(self) -> None:
        changed, self.changed = self.changed, trio.Event()
        changed.set()
