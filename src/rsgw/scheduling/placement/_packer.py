"""lpt_packing's packer state machine: when to repack, and what a repack decides.

Pure: no trio, no sockets, no logging, no clock. The prober shell polls the ready
workers, summarizes the answers into a `PollSummary`, and calls `Packer.tick` with the
knob snapshot and the wall time. The tick returns a `TickOutcome`: the tick report, the
`RepackReport` when a repack ran (with its log fields and warnings as data), and the
`CompactionPlan` when compaction is due. The shell logs, exports metrics, rebuilds the
fill router's counters against `Packer.assignment`, and fans out CompactMemory.

Theory of operation (docs/original.md §4.4, §4.6.2, §4.6.3, §4.6.5)
----------------------------------------------------------------

* Repacks are driven by accumulated fleet compute, never by wall time. Each tick adds
  the positive delta of the fleet's cumulative compute-seconds to `compute_accum`; the
  first non-zero observation is only a baseline (docs/original.md §9.3 [6], kept), and a
  negative delta (a restart) re-baselines without counting. An idle fleet accrues
  nothing and so never repacks on its own.
* The first traffic-driven repack waits for `first_rebalance_compute_seconds` (when
  > 0), later ones for `rebalance_compute_seconds`. The tick report shows the threshold
  the tick compared against, so right after the first repack it still shows the first
  budget until the next tick ([9], kept).
* An operator `request_repack` forces a repack on the next tick (trigger `operator`)
  that has an answering worker; a tick whose poll got no answer never repacks (the
  original would install an empty placement). A traffic-driven repack also waits (up
  to `MAX_DEFERRED_TICKS` ticks) while a ready worker is missing from the poll, rather
  than pack that worker's models onto the others because one answer was slow.
  Several requests before one tick coalesce: the tick reads the requested sequence at
  its start and marks everything up to it completed, last, after the assignment and the
  report are published. An operator repack does not use up the first budget.
* Arrival rates and per-request costs are EWMAs whose clock is the compute-seconds
  since the previous repack (halflife `ema_halflife_compute_seconds`, 0 = the rebalance
  budget). A repack with no accumulated compute discards the arrival counts without
  moving the rate EWMA ([7], kept).
* Only models the fleet serves are counted (`record_arrival` ignores any other name),
  so a client cannot grow the arrival map with made-up names ([8], fixed: docs/product.md
  §3.9). The known set is the models the constructor was given plus every model a
  poll has reported, bounded by what the workers serve.
* A model not reported by every polled worker has drifted: it gets its own uniform
  placement over the workers that report it, and a warning entry.
* Everything published (`assignment`, `cost_snapshot`, the reports) is immutable and
  replaced by reference, so a reader holding the old one keeps a consistent view.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from rsgw.scheduling.calls._meta import ewma
from rsgw.scheduling.knobs._knobs import CompactionMode, Replicas
from rsgw.scheduling.knobs._settings import SchedulingConfig
from rsgw.scheduling.placement._assignment import compute_assignment
from rsgw.scheduling.placement._budget_fit import fit_to_budgets
from rsgw.scheduling.placement._demand import DecayedDemand
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._reports import (
    CompactionPlan,
    DriftWarning,
    Oversubscription,
    PollSummary,
    RepackLog,
    RepackReport,
    TickOutcome,
    TickReport,
    Trigger,
)

#: Ticks a traffic-driven repack may wait for a poll that every ready worker answered.
MAX_DEFERRED_TICKS = 3


def replica_overrides(knobs: SchedulingConfig) -> dict[str, Replicas]:
    """model -> replica count, for the overrides that set one (others inherit)."""
    return {m: o.replicas for m, o in knobs.models.items() if o.replicas is not None}


class Packer:
    """lpt_packing's packer state (docs/original.md §4.4), advanced by `tick`.

    Not thread-safe: the shell calls it from one Trio task at a time (every method is
    synchronous, so a call is atomic with respect to other tasks).

    Args:
        known_models: model names whose arrivals count before any poll reported them
            (e.g. the discovery routing table); polls add to this set.
        track_recency: keep each model's last call on a logical clock (`recency`), for
            `repository.eviction: lru`; off, the request path does not pay for it.
        demand: count every call in this meter, which `demand` then reads (models
            placed by loading, issue 49); None, the request path does not pay for it.
    """

    def __init__(
        self,
        known_models: Iterable[str] = (),
        *,
        track_recency: bool = False,
        demand: DecayedDemand | None = None,
    ) -> None:
        self._known: set[str] = set(known_models)
        self._arrivals: dict[str, int] = {}
        self._demand = demand
        self._calls = 0
        self._recent: dict[str, int] | None = {} if track_recency else None
        self._rate: dict[str, float] = {}
        self._cost: dict[str, float] = {}
        self._cost_baseline: dict[tuple[str, str], tuple[float, int]] = {}
        self._last_rebalance: float | None = None
        self._compute_accum = 0.0
        self._last_fleet_compute = 0.0
        self._did_first_tick_repack = False
        self._assignment: Mapping[str, Placement] = MappingProxyType({})
        self._cost_snapshot: Mapping[str, float] = MappingProxyType({})
        self._repack_requested = 0
        self._repack_completed = 0
        self._repacks = 0
        self._repacks_since_compaction = 0
        self._last_tick: TickReport | None = None
        self._last_report: RepackReport | None = None
        self._deferred = 0

    # -- published state ----------------------------------------------------------

    @property
    def assignment(self) -> Mapping[str, Placement]:
        """model -> placement in force (immutable, replaced by each repack)."""
        return self._assignment

    @property
    def cost_snapshot(self) -> Mapping[str, float]:
        """The cost EWMAs at the last repack, plus key "" = their mean (if any)."""
        return self._cost_snapshot

    @property
    def last_tick(self) -> TickReport | None:
        """The last tick's report; None before the first tick (a waiting Repack waits)."""
        return self._last_tick

    @property
    def last_report(self) -> RepackReport | None:
        return self._last_report

    @property
    def repack_requested(self) -> int:
        return self._repack_requested

    @property
    def repack_completed(self) -> int:
        return self._repack_completed

    @property
    def compute_accum(self) -> float:
        return self._compute_accum

    @property
    def did_first_tick_repack(self) -> bool:
        return self._did_first_tick_repack

    @property
    def repacks_since_compaction(self) -> int:
        return self._repacks_since_compaction

    @property
    def known_models(self) -> frozenset[str]:
        return frozenset(self._known)

    def pending_arrivals(self) -> Mapping[str, int]:
        """A copy of the arrival counts not yet folded into the rate EWMA."""
        return MappingProxyType(dict(self._arrivals))

    def demand(self, now: float) -> dict[str, float]:
        """Each model's calls per second now, for residency (issue 49): the demand
        meter's decayed counts (see `_demand`); none without a meter."""
        return self._demand.rates(now) if self._demand is not None else {}

    def rates(self) -> Mapping[str, float]:
        """A copy of the arrival-rate EWMAs (requests per wall second)."""
        return MappingProxyType(dict(self._rate))

    # -- inputs ---------------------------------------------------------------------

    def record_arrival(self, model: str, count: int = 1) -> bool:
        """Count `count` requests for `model` (one, on the request path; a round's
        worth, in the fleet-day simulation); False (not counted) for an unknown name."""
        if model not in self._known:
            return False
        self._arrivals[model] = self._arrivals.get(model, 0) + count
        if self._demand is not None:  # residency only: off the default hot path
            self._demand.count(model, count)
        if self._recent is not None:  # `eviction: lru` only: off the default hot path
            self._calls += count
            self._recent[model] = self._calls
        return True

    @property
    def recency(self) -> Mapping[str, int]:
        """model -> the number of calls counted when its last one was (a logical clock:
        the larger, the more recently used; `repository.eviction: lru`)."""
        return self._recent if self._recent is not None else {}

    def take_arrivals(self) -> dict[str, int]:
        """The arrival counts not yet folded, handed over and cleared: a gateway that
        does not place (coordination) reports them to the one that does."""
        arrivals, self._arrivals = self._arrivals, {}
        return arrivals

    def learn(self, models: Iterable[str]) -> None:
        """Count arrivals for `models` from now on (a gateway that does not tick learns
        the fleet's models from its polls this way)."""
        self._known.update(models)

    def adopt(self, assignment: Mapping[str, Placement]) -> None:
        """Take a placement decided elsewhere (another gateway's, through coordination)
        as the one in force: routing follows it, and a repack here, should this gateway
        become the placer, starts from it (hysteresis keeps what need not move)."""
        self._assignment = MappingProxyType(dict(assignment))

    def placed_on_demand(self, model: str, placement: Placement) -> None:
        """`model` was loaded on demand (issue 49) and is routed by `placement` now: the
        next repack starts from it (hysteresis keeps it where it was loaded)."""
        self._assignment = MappingProxyType({**self._assignment, model: placement})

    def request_repack(self) -> int:
        """Ask for a repack on the next tick; returns its sequence number.

        The request is served once `repack_completed >= sequence`.
        """
        self._repack_requested += 1
        return self._repack_requested

    # -- the state machine -----------------------------------------------------------

    def tick(
        self,
        poll: PollSummary,
        knobs: SchedulingConfig,
        ready: Sequence[str],
        now: float,
    ) -> TickOutcome:
        """One prober round with at least one ready worker (docs/original.md §4.6.2).

        Args:
            poll: this round's summary (shared with the routing metadata).
            knobs: the knob snapshot for this tick.
            ready: the ready worker URLs.
            now: the time, in seconds, on a monotonic clock (the shell passes the
                Trio clock); only differences between calls matter.
        """
        requested = self._repack_requested
        self._known.update(poll.workers)

        if self._last_fleet_compute == 0:
            self._last_fleet_compute = poll.fleet_compute  # baseline only ([6], kept)
        else:
            delta = poll.fleet_compute - self._last_fleet_compute
            self._last_fleet_compute = poll.fleet_compute
            if delta > 0:
                self._compute_accum += delta

        threshold = self._threshold(knobs)

        forced = requested > self._repack_completed
        report: RepackReport | None = None
        compaction: CompactionPlan | None = None
        # No answering worker means nothing to place on: keep the placement in force
        # (an operator request stays pending) rather than install an empty one. A
        # ready worker missing from the poll (one slow answer) would have its models
        # packed onto the others and its weights compacted away, so a traffic-driven
        # repack waits for a complete poll, for at most MAX_DEFERRED_TICKS ticks.
        due = forced or self._compute_accum >= threshold
        partial = not set(ready) <= set(poll.polled)
        if due and not forced and partial and self._deferred < MAX_DEFERRED_TICKS:
            self._deferred += 1
        elif due and poll.polled:
            self._deferred = 0
            if not forced:
                self._did_first_tick_repack = True
            report = self.repack(poll, knobs, now, "operator" if forced else "compute")
            compaction = self._compaction(knobs, report)
            if forced:
                self._repack_completed = requested

        self._last_tick = TickReport(
            now=now,
            ready=tuple(sorted(ready)),
            fleet_compute=poll.fleet_compute,
            compute_accum=self._compute_accum,
            threshold=threshold,
            did_first_tick_repack=self._did_first_tick_repack,
        )
        return TickOutcome(self._last_tick, report, compaction)

    def _threshold(self, knobs: SchedulingConfig) -> float:
        first = knobs.first_rebalance_compute_seconds
        use_first = not self._did_first_tick_repack and first > 0
        return first if use_first else knobs.rebalance_compute_seconds

    def repack_due(self, fleet_compute: float, knobs: SchedulingConfig) -> bool:
        """Whether a tick whose poll reports `fleet_compute` would repack (at a complete
        poll): a caller that builds its poll summary at a cost can build the full one
        only then (the fleet-day simulation does; the prober always builds it)."""
        if self._repack_requested > self._repack_completed:
            return True
        if self._last_fleet_compute == 0:
            return False
        delta = max(0.0, fleet_compute - self._last_fleet_compute)
        return self._compute_accum + delta >= self._threshold(knobs)

    def repack(
        self, poll: PollSummary, knobs: SchedulingConfig, now: float, trigger: Trigger
    ) -> RepackReport:
        """Measure, place and publish (docs/original.md §4.6.3); `tick` calls this when due."""
        self._known.update(poll.workers)
        wall = now - self._last_rebalance if self._last_rebalance is not None else 0.0
        compute = self._compute_accum
        self._last_rebalance = now
        halflife = knobs.resolved_ema_halflife
        self._measure_rates(wall, compute, halflife)
        self._measure_costs(poll, compute, halflife)
        utilization, drifted, warnings = self._utilization(poll)

        previous = self._assignment
        result = compute_assignment(
            sorted(poll.polled),
            utilization,
            poll.mem,
            poll.mem_cap,
            replica_overrides(knobs),
            knobs.default_replicas,
            previous,
            knobs.hysteresis,
            knobs.forbid_memory_oversubscription,
            max_share=knobs.max_worker_share,
        )
        placed = {**result.assignment, **drifted}
        over_budget = result.over_budget_models
        cold: tuple[str, ...] = ()
        if poll.residency is not None:  # models loaded on budgeted workers: cut to fit
            facts = poll.residency
            if trigger != "startup":  # a model's first copy: loaded by a call, not a repack
                facts = dataclasses.replace(facts, loads_cold=False)
            fit = fit_to_budgets(placed, facts)
            placed, cold = dict(fit.assignment), fit.cold
            over_budget = tuple(m for m in over_budget if m not in poll.residency.handed)
        self._assignment = MappingProxyType(placed)
        self._compute_accum = 0.0
        self._last_fleet_compute = poll.fleet_compute

        moved, changed = _moves(previous, placed)
        self._repacks += 1
        stats = result.stats
        report = RepackReport(
            now=now,
            wall_seconds=wall,
            compute_seconds=compute,
            trigger=trigger,
            count=self._repacks,
            models=len(placed),
            moved=moved,
            utilization=MappingProxyType(utilization),
            rate=MappingProxyType(dict(self._rate)),
            cost=MappingProxyType(dict(self._cost)),
            mem=MappingProxyType(dict(poll.mem)),
            mem_cap=MappingProxyType(dict(poll.mem_cap)),
            polled=tuple(sorted(poll.polled)),
            drifted=frozenset(drifted),
            changed_workers=frozenset(changed),
            assignment=self._assignment,
            log=RepackLog(
                models=len(placed),
                moved=moved,
                held_by_hysteresis=stats.held_by_hysteresis,
                max_improvement=round(stats.max_improvement, 3),
                hysteresis=knobs.hysteresis,
                compute_seconds=round(compute, 2),
                wall_seconds=round(wall, 1),
            ),
            drift_warnings=tuple(warnings),
            oversubscribed=_oversubscribed(poll, placed),
            over_budget_models=over_budget,
            cold=cold,
        )
        self._last_report = report
        return report

    def _measure_rates(self, wall: float, compute: float, halflife: float) -> None:
        """Each model's arrival rate, from the calls counted since the last repack."""
        # Arrival rates: the counts since the last repack, per wall second, blended on
        # the compute clock; with no compute they are dropped unblended ([7], kept). A
        # model's first sample is adopted as is, as costs are: the original blended it
        # into 0, so after the first repack every utilization read a small fraction of
        # the truth (0.5% with the default budgets) and memory decided every placement.
        arrivals, self._arrivals = self._arrivals, {}
        for model, count in arrivals.items():
            sample = count / wall if wall > 0 else 0.0
            old_rate = self._rate.get(model)
            if old_rate is not None:
                self._rate[model] = ewma(old_rate, sample, compute, halflife)
            elif compute > 0 and sample > 0:
                self._rate[model] = sample  # no rate yet: adopt it (a missing rate reads 0)

    def _measure_costs(self, poll: PollSummary, compute: float, halflife: float) -> None:
        """Each model's cost per request, from the counters polled since the last repack."""
        # Costs per request, from the counters' deltas since the last repack, taken
        # per (worker, model) and summed: a worker that missed a poll keeps its
        # baseline, so its return counts only its new work (the original took deltas of
        # fleet-wide sums, and a missed poll read as a restart). A pair whose counters
        # went back re-baselines and contributes nothing.
        deltas: dict[str, tuple[float, int]] = {}
        for url, models in poll.served.items():
            for model, (total_compute, total_requests) in models.items():
                b_compute, b_requests = self._cost_baseline.get((url, model), (0.0, 0))
                self._cost_baseline[(url, model)] = (total_compute, total_requests)
                d_compute, d_requests = total_compute - b_compute, total_requests - b_requests
                if d_compute >= 0 and d_requests >= 0:
                    c, r = deltas.get(model, (0.0, 0))
                    deltas[model] = (c + d_compute, r + d_requests)
        for model, (d_compute, d_requests) in deltas.items():
            if d_requests > 0:
                sample = d_compute / d_requests
                old = self._cost.get(model) or sample
                self._cost[model] = ewma(old, sample, compute, halflife)
        snapshot = dict(self._cost)
        if snapshot:
            snapshot[""] = sum(snapshot.values()) / len(snapshot)
        self._cost_snapshot = MappingProxyType(snapshot)

    def _utilization(
        self, poll: PollSummary
    ) -> tuple[dict[str, float], dict[str, Placement], list[DriftWarning]]:
        """The utilization of fully present models; drifted ones (not on every polled
        worker) route uniformly over the workers that report them, with a warning."""
        nready = len(poll.polled)
        utilization: dict[str, float] = {}
        drifted: dict[str, Placement] = {}
        warnings: list[DriftWarning] = []
        for model, reporters in poll.workers.items():
            urls = sorted(set(reporters))
            if len(urls) >= nready:
                rate, cost = self._rate.get(model, 0.0), self._cost.get(model, 0.0)
                utilization[model] = rate * cost if rate > 0 and cost > 0 else 0.0
            else:
                drifted[model] = Placement(tuple((url, 1.0 / len(urls)) for url in urls))
                warnings.append(DriftWarning(model, tuple(urls), nready))
        return utilization, drifted, warnings

    def _compaction(self, knobs: SchedulingConfig, report: RepackReport) -> CompactionPlan | None:
        """The compaction cadence after a tick's repack (docs/original.md §4.6.5)."""
        mode = knobs.compaction_mode
        if mode is CompactionMode.OFF or knobs.compaction_interval <= 0:
            return None
        self._repacks_since_compaction += 1
        if self._repacks_since_compaction < knobs.compaction_interval or not report.changed_workers:
            return None
        self._repacks_since_compaction = 0
        reloads: dict[str, tuple[str, ...]] = {}
        for worker in sorted(report.changed_workers):
            if mode is CompactionMode.SCHEDULED:
                hosted = (m for m, p in report.assignment.items() if worker in p.urls)
                reloads[worker] = tuple(sorted(hosted))
            else:
                reloads[worker] = ()
        return CompactionPlan(mode, MappingProxyType(reloads))


def _moves(
    previous: Mapping[str, Placement], placed: Mapping[str, Placement]
) -> tuple[int, set[str]]:
    """(moved models, changed workers) between two assignments (docs/original.md §4.6.3 step 7).

    A model in both whose worker set changed is a move and changes the symmetric
    difference of its sets; a dropped model changes all its old workers; a new model
    is an initial placement, neither a move nor a change.
    """
    moved = 0
    changed: set[str] = set()
    for model, before in previous.items():
        after = placed.get(model)
        if after is None:
            changed.update(before.urls)
            continue
        difference = set(before.urls) ^ set(after.urls)
        if difference:
            moved += 1
            changed |= difference
    return moved, changed


def _oversubscribed(
    poll: PollSummary, placed: Mapping[str, Placement]
) -> tuple[Oversubscription, ...]:
    """The polled workers whose placed models' weights exceed their memory budget."""
    oversubscribed: list[Oversubscription] = []
    for worker in sorted(poll.polled):
        budget = poll.mem_cap.get(worker, 0)
        assigned = sum(poll.mem.get(m, 0) for m, p in placed.items() if worker in p.urls)
        if budget > 0 and assigned > budget:
            oversubscribed.append(Oversubscription(worker, assigned, budget))
    return tuple(oversubscribed)
