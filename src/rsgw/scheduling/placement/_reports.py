"""What the packer takes in and hands out: the poll summary and its reports.

Pure data, all frozen: the prober shell builds a `PollSummary` from one round's
ModelControlStatus answers, and `Packer.tick` answers with a `TickOutcome` whose
reports carry everything the shell logs and exports (the `lpt_packing: repack` line's
fields, drift and oversubscription warnings, the compaction plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

from rsgw.scheduling.calls._meta import WorkerCounters
from rsgw.scheduling.knobs._knobs import CompactionMode
from rsgw.scheduling.placement._budget_fit import ResidencyFacts
from rsgw.scheduling.placement._placement import Placement

Trigger: TypeAlias = Literal["startup", "compute", "operator"]

DRIFT_WARNING: Final = (
    "lpt_packing: model not on all ready workers; routing uniformly over its replicas"
)
OVERSUBSCRIPTION_WARNING: Final = (
    "lpt_packing: assigned weight footprint exceeds the worker's on-demand budget; "
    "expect eviction churn"
)


@dataclass(frozen=True, slots=True)
class PollSummary:
    """One probe round's ModelControlStatus answers, aggregated (docs/original.md §4.3).

    Attributes:
        served: worker -> model -> (total_compute_seconds, requests_served), the
            cumulative counters of each answering worker (costs are deltas per pair).
        mem: model -> the largest weight_nbytes any answering worker reported.
        max_batch: model -> the largest max_batch_size reported.
        batch_at: model -> the first non-empty (batch_input_name, batch_axis) seen.
        mem_cap: worker -> weight_cache_max_bytes, for the answering workers.
        workers: model -> the answering workers that reported it, in poll order.
        polled: the answering workers, in poll order.
        fleet_compute: the fleet's cumulative compute-seconds (Σ of `served` compute,
            unless the caller passes its own accounting).
        residency: where models are placed by loading them on workers with a
            budget, what they hold (the repack's placement is cut to fit them).
    """

    served: Mapping[str, Mapping[str, tuple[float, int]]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    mem: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    max_batch: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    batch_at: Mapping[str, tuple[str, int]] = field(default_factory=lambda: MappingProxyType({}))
    mem_cap: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    workers: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    polled: tuple[str, ...] = ()
    fleet_compute: float = 0.0
    residency: ResidencyFacts | None = None


def summarize_poll(
    polled: Mapping[str, WorkerCounters], *, fleet_compute: float | None = None
) -> PollSummary:
    """Aggregate one round's answers (worker URL -> counters, in poll order).

    Args:
        polled: the answering workers' counters; a failed worker is simply absent.
        fleet_compute: the fleet compute to report; None sums the answers' compute, as
            the original does (a worker missing one poll then reads as a restart).
    """
    served: dict[str, Mapping[str, tuple[float, int]]] = {}
    total = 0.0
    mem: dict[str, int] = {}
    max_batch: dict[str, int] = {}
    batch_at: dict[str, tuple[str, int]] = {}
    workers: dict[str, list[str]] = {}
    for url, answer in polled.items():
        served[url] = MappingProxyType(
            {m: (c.total_compute_seconds, c.requests_served) for m, c in answer.models.items()}
        )
        for model, c in answer.models.items():
            total += c.total_compute_seconds
            mem[model] = max(mem.get(model, 0), c.weight_nbytes)
            max_batch[model] = max(max_batch.get(model, c.max_batch_size), c.max_batch_size)
            if c.batch_input_name and model not in batch_at:
                batch_at[model] = (c.batch_input_name, c.batch_axis)
            workers.setdefault(model, []).append(url)
    return PollSummary(
        served=MappingProxyType(served),
        mem=MappingProxyType(mem),
        max_batch=MappingProxyType(max_batch),
        batch_at=MappingProxyType(batch_at),
        mem_cap=MappingProxyType({url: a.weight_cache_max_bytes for url, a in polled.items()}),
        workers=MappingProxyType({m: tuple(urls) for m, urls in workers.items()}),
        polled=tuple(polled),
        fleet_compute=total if fleet_compute is None else fleet_compute,
    )


@dataclass(frozen=True, slots=True)
class DriftWarning:
    """A model not on every polled worker: `DRIFT_WARNING` with these fields."""

    model: str
    replicas: tuple[str, ...]
    ready: int


@dataclass(frozen=True, slots=True)
class Oversubscription:
    """A worker whose placed weights exceed its budget: `OVERSUBSCRIPTION_WARNING`."""

    worker: str
    assigned: int
    budget: int


@dataclass(frozen=True, slots=True)
class RepackLog:
    """The fields of the `lpt_packing: repack` info line (docs/original.md §4.6.3 step 8)."""

    models: int
    moved: int
    held_by_hysteresis: int
    max_improvement: float
    hysteresis: float
    compute_seconds: float
    wall_seconds: float


@dataclass(frozen=True, slots=True)
class RepackReport:
    """What one repack measured and decided (docs/original.md §4.6.3 step 11).

    Attributes:
        now: the wall time the repack ran at.
        wall_seconds / compute_seconds: wall time and fleet compute since the last one.
        trigger: `startup`, `compute` or `operator`.
        count: repacks run so far, this one included.
        models: models placed, drifted ones included.
        moved: models whose worker set changed (new models are not moves).
        utilization / rate / cost: per-model copies (u only for fully present models).
        mem / mem_cap / polled: the poll's memory facts and the sorted polled workers.
        drifted: models placed uniformly over their reporting workers.
        changed_workers: workers whose hosted model set changed, for compaction.
        assignment: the placement installed by this repack.
        log: the repack log line's fields.
        drift_warnings / oversubscribed: warnings for the shell to log.
        over_budget_models: models placed where their weights did not fit.
        cold: handed models the budgets left unplaced (loaded on demand).
    """

    now: float
    wall_seconds: float
    compute_seconds: float
    trigger: Trigger
    count: int
    models: int
    moved: int
    utilization: Mapping[str, float]
    rate: Mapping[str, float]
    cost: Mapping[str, float]
    mem: Mapping[str, int]
    mem_cap: Mapping[str, int]
    polled: tuple[str, ...]
    drifted: frozenset[str]
    changed_workers: frozenset[str]
    assignment: Mapping[str, Placement]
    log: RepackLog
    drift_warnings: tuple[DriftWarning, ...] = ()
    oversubscribed: tuple[Oversubscription, ...] = ()
    over_budget_models: tuple[str, ...] = ()
    cold: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TickReport:
    """One tick's state (docs/original.md §4.6.2 step 6).

    `threshold` is the budget the tick compared against, computed before a first
    compute repack flips `did_first_tick_repack` (docs/original.md §9.3 [9], kept).
    """

    now: float
    ready: tuple[str, ...]
    fleet_compute: float
    compute_accum: float
    threshold: float
    did_first_tick_repack: bool


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """CompactMemory to send after a repack: worker -> models to reload after compacting.

    `eager` reloads nothing (empty tuples); `scheduled` reloads the models assigned to
    the worker by the new placement, sorted.
    """

    mode: CompactionMode
    reloads: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class TickOutcome:
    """What a tick did: always a report; a repack and a compaction when they happened."""

    tick: TickReport
    repack: RepackReport | None = None
    compaction: CompactionPlan | None = None


@dataclass(frozen=True, slots=True)
class RepackWait:
    """What an operator repack request saw: its sequence and whether it was served."""

    sequence: int
    completed_sequence: int
    completed: bool
    waited_seconds: float
