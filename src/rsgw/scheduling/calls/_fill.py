"""lpt_packing's request path: which of a model's replicas takes the next request.

Pure: no trio, no sockets, no logging, no clock. As in `_outstanding.py`, "select and
reserve" is one synchronous call, so the counters a choice reads cannot change before
the choice is charged; the shell releases the reservation in a `finally`.

Theory of operation
-------------------

A multi-replica model concentrates its requests on one replica at a time, so workers
get deep same-model groupings to coalesce (docs/original.md §4.5). The fill quantum `Q` is
the model's max batch size times the fill factor, counted in items. Per model we keep
each replica's outstanding items, and per worker a float load in work-basis units
(shared by every model on that worker; what `fill_least` compares). Invariants:

* `run` mode spends `Q` items on a run's replica, then opens the next run. A run also
  ends when the model has nothing in flight (a low-rate model rotates per request),
  when its replica falls a whole quantum behind the least-backed-up one (a slow replica
  loses its turn), and when it already holds `Q` units, checked before this request is
  added (so one full-batch request closes its run). A run never opens, nor continues,
  on a replica that is behind.
* `spread` sends each request to the replica with the fewest outstanding items.
* `inflight` (legacy) keeps filling a replica until it holds a whole quantum at once.
* Exact ties rotate through the model's cursor (docs/product.md §3.13): among tied
  replicas the first at or after the cursor wins, and the cursor moves just past it.
  Loads are compared quantized (`load_key`), so float residue cannot decide.
* Each reservation captures its units and weight; `release` subtracts exactly those,
  once. A worker load settles to exactly 0.0 when its worker holds no reservation.
  `routed` only grows while its pair stays placed: it feeds a counter metric.
* A repack re-keys the counters (`rebuild`): pairs that stay keep their cells, dropped
  ones are forgotten, and a reservation holds its cells, so a late release can never
  push a new placement's counter below zero.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from rsgw.scheduling.calls._outstanding import load_key, settle
from rsgw.scheduling.knobs._knobs import FillMode, RoutingPolicy


@dataclass(frozen=True, slots=True)
class FillPlan:
    """How one model's requests fill its replicas, and where its items are counted.

    Attributes:
        mode: `run`, `spread` or `inflight` (never `inherit`: resolved already).
        quantum: `Q` in items, at least 1.
        batch_input: the input tensor carrying the batch axis ("" = none).
        batch_axis: that tensor's 1-based batch axis (< 1 = one item per request).

    Raises:
        ValueError: `mode` is `inherit` or not a fill mode, or `quantum` < 1.
    """

    mode: FillMode = FillMode.RUN
    quantum: int = 1
    batch_input: str = ""
    batch_axis: int = 0

    def __post_init__(self) -> None:
        if FillMode(self.mode) is FillMode.INHERIT:
            raise ValueError("a fill plan needs a resolved mode, not 'inherit'")
        if self.quantum < 1:
            raise ValueError(f"fill quantum must be >= 1, got {self.quantum}")


#: The plan of a model with none published yet (docs/original.md §4.5 step 1).
DEFAULT_FILL_PLAN = FillPlan()


def resolve_fill_plan(
    fleet_mode: FillMode,
    fleet_factor: float,
    override_mode: FillMode | None,
    override_factor: float | None,
    max_batch: int,
    batch_input: str = "",
    batch_axis: int = 0,
) -> FillPlan:
    """One model's plan from the fleet knobs, its override and its reported max batch.

    Args:
        fleet_mode: `scheduling.routing_fill_mode`.
        fleet_factor: `scheduling.routing_fill_factor`.
        override_mode: the model's `fill_mode`; None or `inherit` uses the fleet's.
        override_factor: the model's `fill_factor`; None or <= 0 uses the fleet's.
        max_batch: the worker-reported max batch size (<= 0: the model is unbatched
            or unpolled, so the quantum is 1 and the model rotates per request).

    Returns:
        The plan, `quantum = max(1, round(factor * max_batch))`, rounded half to even.
    """
    inherit = override_mode is None or override_mode is FillMode.INHERIT
    mode = fleet_mode if inherit or override_mode is None else override_mode
    factor = (
        override_factor if override_factor is not None and override_factor > 0 else fleet_factor
    )
    quantum = 1 if max_batch <= 0 else max(1, round(factor * max_batch))
    return FillPlan(FillMode(mode), quantum, batch_input, batch_axis)


@dataclass(eq=False, slots=True)
class _Replica:
    """The counters of one (model, worker) pair: in-flight items, requests routed."""

    items: int = 0
    routed: int = 0


@dataclass(eq=False, slots=True)
class _WorkerLoad:
    """One worker's in-flight work (work-basis units) and its unreleased reservations."""

    work: float = 0.0
    held: int = 0


@dataclass(eq=False, slots=True)
class FillReservation:
    """One request's charge, returned by `FillRouter.select`, given to `release`.

    It holds the counter cells it charged, so a release after a repack dropped them
    lands on the orphaned cells and never disturbs the new placement's counters.
    Compared by identity: two equal requests are two reservations.
    """

    model: str
    url: str
    units: int
    weight: float
    _replica: _Replica = field(repr=False)
    _load: _WorkerLoad = field(repr=False)
    released: bool = field(default=False, init=False)


@dataclass(slots=True)
class _Run:
    """A model's current run: its replica's URL ("" = none), cursor and units spent.

    The target is a URL, not an index, so a replica list that changes under an open
    run (discovery lost one) cannot silently move the run to another worker.
    """

    target: str = ""
    cursor: int = 0
    units: int = 0


def _sorted_unique(urls: Sequence[str]) -> Sequence[str]:
    """`urls` sorted without duplicates; as given when they already are (a placement's)."""
    if all(a < b for a, b in itertools.pairwise(urls)):
        return urls
    return sorted(set(urls))


class FillRouter:
    """Per-model fill routing over its replicas, with per-worker loads shared by models.

    One instance serves the whole fleet; the shell calls `select` for each request of
    a placed model and `release` when the call ends.
    """

    def __init__(self) -> None:
        #: model -> worker URL -> its counters (per model first: a select reads one
        #: model's row, replica by replica, without building a key per replica).
        self._replicas: dict[str, dict[str, _Replica]] = {}
        self._loads: dict[str, _WorkerLoad] = {}
        self._runs: dict[str, _Run] = {}
        #: model -> (the replica sequence last given, sorted and unique): a placement's
        #: is the same object call after call, so it is checked once.
        self._sorted: dict[str, tuple[Sequence[str], Sequence[str]]] = {}

    def rebuild(self, placements: Mapping[str, Sequence[str]]) -> None:
        """Re-key the counters to a new assignment (model -> replica URLs).

        Pairs and workers that stay keep their counters (in-flight work survives a
        repack); the others are dropped, and their late releases land on the dropped
        cells. Every model keeps its rotation cursor but its open run ends, so its next
        request opens a run against the new placement (docs/original.md §4.6.4).
        """
        pairs = {(m, url) for m, urls in placements.items() for url in urls}
        workers = {url for _, url in pairs}
        kept: dict[str, dict[str, _Replica]] = {}
        for model, url in pairs:
            cell = self._replicas.get(model, {}).get(url)
            if cell is not None:
                kept.setdefault(model, {})[url] = cell
        self._replicas = kept
        self._loads = {k: v for k, v in self._loads.items() if k in workers}
        runs: dict[str, _Run] = {}
        for model in placements:
            previous = self._runs.get(model)
            runs[model] = _Run(cursor=previous.cursor if previous is not None else 0)
        self._runs = runs

    def select(
        self,
        model: str,
        placement_urls: Sequence[str],
        plan: FillPlan,
        policy: RoutingPolicy,
        units: int,
        weight: float,
    ) -> tuple[tuple[str, ...], FillReservation]:
        """Choose the replica for one request and charge it, in one step.

        Args:
            model: the model.
            placement_urls: its replicas (any order; used sorted, duplicates dropped).
            plan: its fill plan.
            policy: `fill_least` compares worker loads before rotating; `fill_rr`
                only rotates.
            units: the request's items; values below 1 count as 1.
            weight: its charge on the worker's load (work basis units).

        Returns:
            `(order, reservation)`: the chosen URL first, then the failover order
            `(floor(outs/Q), outs, URL)` over the others, from the counts before this
            request was added.

        Raises:
            ValueError: `placement_urls` is empty.
        """
        cached = self._sorted.get(model)
        if cached is not None and cached[0] is placement_urls:
            workers = cached[1]
        else:
            workers = _sorted_unique(placement_urls)
            self._sorted[model] = (placement_urls, workers)
        if not workers:
            raise ValueError(f"no replicas to choose from for model {model!r}")
        units = max(units, 1)
        n = len(workers)
        if n == 1:
            return (workers[0],), self._charge(model, workers[0], units, weight)
        cells = self._replicas.get(model, {})
        outs = [c.items if (c := cells.get(w)) is not None else 0 for w in workers]
        run = self._runs.setdefault(model, _Run())
        q = plan.quantum
        least = policy is RoutingPolicy.FILL_LEAST

        def argmin(keys: Sequence[tuple[int, ...]]) -> int:
            # Every key ends with the replica's distinct rotation, so none are equal.
            return min(range(n), key=keys.__getitem__)

        def keyed(first: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
            cursor = run.cursor
            if not least:
                return [first[j] + ((j - cursor) % n,) for j in range(n)]
            loads = self._loads
            return [
                first[j]
                + (load_key(c.work) if (c := loads.get(w)) is not None else 0, (j - cursor) % n)
                for j, w in enumerate(workers)
            ]

        if plan.mode is FillMode.SPREAD:
            chosen = argmin(keyed([(o,) for o in outs]))
            run.cursor, run.target, run.units = (chosen + 1) % n, workers[chosen], units
        elif plan.mode is FillMode.INFLIGHT:
            progress = [(o // q, -o) for o in outs]
            chosen = argmin(keyed(progress))
            if progress.count(min(progress)) > 1:
                run.cursor = (chosen + 1) % n
            run.target, run.units = workers[chosen], units
        else:
            floors = [o // q for o in outs]
            floor_q = min(floors)
            try:
                target = workers.index(run.target)
            except ValueError:
                target = -1
            if target < 0 or run.units >= q or floors[target] > floor_q or not any(outs):
                chosen = self._open_run(workers, floors, floor_q, least, run.cursor)
                run.cursor, run.target, run.units = (chosen + 1) % n, workers[chosen], units
            else:
                chosen = target
                run.units += units
        reservation = self._charge(model, workers[chosen], units, weight)
        if not any(outs):  # idle: the failover order is the URL order
            return (workers[chosen], *workers[:chosen], *workers[chosen + 1 :]), reservation
        first = workers[chosen]
        rest = sorted(zip([o // q for o in outs], outs, workers, strict=True))
        return (first, *[w for _, _, w in rest if w != first]), reservation

    def _open_run(
        self, workers: Sequence[str], floors: Sequence[int], floor_q: int, least: bool, cursor: int
    ) -> int:
        """The replica a new run goes to: least `(behind, load, rotation)`, as `keyed`
        orders them, in one pass over the replicas at the fill floor (one always is, so
        the behind ones never win)."""
        n = len(workers)
        loads = self._loads
        best = -1
        best_key = (0, 0)
        for j, floor in enumerate(floors):
            if floor > floor_q:
                continue
            work = 0
            if least and (cell := loads.get(workers[j])) is not None:
                work = load_key(cell.work)
            key = (work, (j - cursor) % n)
            if best < 0 or key < best_key:
                best, best_key = j, key
        return best

    def _charge(self, model: str, url: str, units: int, weight: float) -> FillReservation:
        row = self._replicas.setdefault(model, {})
        replica = row.get(url)
        if replica is None:
            replica = row[url] = _Replica()
        load = self._loads.get(url)
        if load is None:
            load = self._loads[url] = _WorkerLoad()
        replica.items += units
        replica.routed += 1
        load.work += weight
        load.held += 1
        return FillReservation(model, url, units, weight, replica, load)

    def release(self, reservation: FillReservation) -> None:
        """Give back exactly the reservation's captured charge; a second call does nothing."""
        if reservation.released:
            return
        reservation.released = True
        reservation._replica.items -= reservation.units
        load = reservation._load
        load.held -= 1
        load.work = 0.0 if load.held <= 0 else settle(load.work - reservation.weight)

    def pending(self, pairs: Iterable[tuple[str, str]]) -> Callable[[], int]:
        """A reader of the items in flight on `pairs` (model, worker URL) now and
        until they are released, even after a rebuild drops the pairs (their late
        releases land on the same cells): a worker leaving a model's placement is
        drained by it before the model is unloaded there."""
        cells = [c for m, u in pairs if (c := self._replicas.get(m, {}).get(u)) is not None]
        return lambda: sum(c.items for c in cells)

    def outstanding(self) -> Mapping[tuple[str, str], int]:
        """A snapshot of outstanding items per (model, worker URL)."""
        return MappingProxyType(
            {(m, u): c.items for m, row in self._replicas.items() for u, c in row.items()}
        )

    def routed(self) -> Mapping[tuple[str, str], int]:
        """A snapshot of requests routed per (model, worker URL); never decreases."""
        return MappingProxyType(
            {(m, u): c.routed for m, row in self._replicas.items() for u, c in row.items()}
        )

    def loads(self) -> Mapping[str, float]:
        """A snapshot of per-worker in-flight work, for `gateway_worker_inflight_work`."""
        return MappingProxyType({k: v.work for k, v in self._loads.items()})
