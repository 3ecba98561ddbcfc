"""lpt_packing's placement: which workers host each model's replicas.

Pure: no trio, no sockets, no logging, no clock. The repack loop takes one snapshot of
the measurements, calls `compute_assignment`, and installs the result by reference.
The result is a `Placement` per model (`rsgw.scheduling.placement._placement`); the heaviest-first
pass below is `rsgw.scheduling.placement._greedy`, and this module decides the replica counts,
refines the pass and holds the placement in force.

Theory of operation
-------------------

Longest-processing-time-first packing over two resources (docs/original.md §4.6.6):

* Models go heaviest first, by `(-utilization, -memory, name)`, so the big ones choose
  while the workers are emptiest and every tie has one answer.
* A worker's "pressure" is whichever of its compute load (capacity 1.0) and its memory
  fraction (resident bytes over its budget) is closer to full. A worker without a
  positive budget has no memory limit, so only compute counts there.
* A model gets `k = clamp(replicas, 1, len(workers))` distinct workers; `all` is every
  worker given (the caller passes the ready ones, docs/product.md §3.12 [15]). Each replica
  takes `u/k` of the compute, all of the memory (every replica holds the whole weight
  set) and a routing weight of `1/k`.
* A single-replica model stays where it was unless moving improves its pressure by more
  than `hysteresis`, because batching depends on traffic staying where the queues are.
  A multi-replica model prefers its previous members only as a tie-break.
* The whole placement in force stays when it still serves today's demand (same
  models, workers still there, enough replicas, weights within budget) and the new
  one would not lighten the busiest worker by more than `PLAN_GAIN_FLOOR`: a repack
  moves weights only for a gain that can repay the reloads.
* Equal pressure goes to the worker with less compute load, then to the one hosting
  fewer models, then the smaller URL; hysteresis compares compute the same way when
  the pressures are equal. The original took the smallest URL. When memory is the
  binding resource (every worker holding as many models as fit, the usual case on a
  packed node) all pressures tie at the memory fraction, and the original's placement
  degraded to striping models over workers in name order, whatever their demand; and a
  cold start (no demand measured, no memory budget) stacked every model on the first
  worker. Both tie-breaks keep the heaviest-first packing meaningful in those cases.
* With `forbid_memory_oversubscription`, a model goes only to workers where its weights
  still fit whenever enough of them exist; otherwise it degrades to the unconstrained
  choice and is listed in `over_budget_models`, which the shell logs as a warning. The
  function never raises on infeasible memory.
* Everything is deterministic: the same inputs give the same result, and feeding a
  result back as `previous` with unchanged inputs moves nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from rsgw.scheduling.knobs._knobs import ALL, Replicas
from rsgw.scheduling.placement._greedy import GreedyPass, greedy_pass, improvement
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._refine import best_single_placement
from rsgw.scheduling.placement._replicas import auto_replicas, split_hot_models

#: A repack whose placement would lighten the busiest worker by less than this keeps
#: the placement in force (whatever `hysteresis`, which acts per model inside it).
#: Demand measured over one repack interval wobbles by a few percent, and a greedy pass
#: re-run on it reshuffles the light models for gains of that size; each move reloads
#: weights, which costs the new GPU far more device time than the gain returns
#: (measured: bench/fleet hot_replicas moved 4-6 of 8 models every repack, with 44% of
#: device time spent loading).
PLAN_GAIN_FLOOR = 0.05
#: The branch and bound refines placements of at most this many single-replica models:
#: it can prove the greedy's worst cases wrong on a node's handful of models, and within
#: its node budget it finds nothing on hundreds (LPT is then within a few percent of
#: the mean anyway), where its recursion would only cost time.
REFINE_MAX_MODELS = 64


@dataclass(frozen=True, slots=True)
class AssignmentStats:
    """What one repack did, for its `lpt_packing: repack` log line.

    `moved` counts models that had a previous placement whose set of workers changed
    (a newly placed model did not move). `held_by_hysteresis` counts single-replica
    models kept on their previous worker although another scored better.
    `max_improvement` is the largest relative pressure gain any single-replica model
    was offered (`prev/best - 1`), to compare against the hysteresis threshold.
    """

    placed: int = 0
    moved: int = 0
    held_by_hysteresis: int = 0
    max_improvement: float = 0.0


@dataclass(frozen=True, slots=True)
class AssignmentResult:
    """The placement of every model and the loads it projects onto each worker.

    Attributes:
        assignment: model -> its `Placement`.
        compute_load: worker -> projected compute load (sum of `u/k` shares).
        memory_load: worker -> projected resident bytes (full weights per replica).
        stats: counts for the repack log line.
        oversubscribed: workers whose projected memory exceeds their budget.
        over_budget_models: with forbid_memory_oversubscription, models placed on at
            least one worker where their weights did not fit (the guard's fallback), in
            placement order; non-empty means "log the warning".
    """

    assignment: Mapping[str, Placement] = field(default_factory=lambda: MappingProxyType({}))
    compute_load: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    memory_load: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    stats: AssignmentStats = AssignmentStats()
    oversubscribed: frozenset[str] = frozenset()
    over_budget_models: tuple[str, ...] = ()


def replica_count(replicas: Replicas, workers: int) -> int:
    """`clamp(replicas, 1, workers)`, with `all` meaning every worker (at least 1)."""
    wanted = workers if replicas == ALL else int(replicas)
    return max(1, min(wanted, workers))


def compute_assignment(
    workers: Sequence[str],
    utilization: Mapping[str, float],
    memory: Mapping[str, int],
    mem_cap: Mapping[str, int],
    replicas: Mapping[str, Replicas],
    default_replicas: Replicas,
    previous: Mapping[str, Placement],
    hysteresis: float,
    forbid_memory_oversubscription: bool,
    max_share: float = 0.0,
    refine: bool = True,
) -> AssignmentResult:
    """Place every model of `utilization` on its replica count of workers.

    Args:
        workers: the ready worker URLs (order and duplicates do not matter).
        utilization: model -> compute demand in GPU fractions; only these models are
            placed.
        memory: model -> resident weight bytes (absent = 0).
        mem_cap: worker -> weight-memory budget in bytes (absent or <= 0 = unlimited).
        replicas: model -> replica count override; others use `default_replicas`.
        default_replicas: the fleet's replica count, a positive int or `all`.
        previous: the placement in force, for hysteresis and `moved`.
        hysteresis: relative improvement a single-replica model must beat to move.
        forbid_memory_oversubscription: place only where the weights fit, when possible.
        max_share: a model without a replica override whose demand is above this share
            of one GPU gets more replicas, and one heavier than the mean load may get
            more while that lightens the busiest worker (`rsgw.scheduling.placement._replicas`);
            0 = never.
        refine: after the greedy, search for a placement of the single-replica models
            whose busiest worker is lighter by more than `hysteresis`
            (`rsgw.scheduling.placement._refine`); it may move models the greedy kept in place.

    Returns:
        The `AssignmentResult`; empty when there are no workers.
    """
    urls = sorted(set(workers))
    if not urls:
        return AssignmentResult()
    cap = {w: float(c) if (c := mem_cap.get(w, 0)) > 0 else math.inf for w in urls}
    order = sorted(utilization, key=lambda m: (-utilization[m], -memory.get(m, 0), m))
    caps = [cap[w] for w in urls]
    fixed = frozenset(replicas)
    base = {m: replica_count(replicas.get(m, default_replicas), len(urls)) for m in order}
    counts = auto_replicas(base, utilization, memory, caps, max_share, fixed)

    placements: dict[tuple[int, ...], GreedyPass] = {}
    forbid = forbid_memory_oversubscription

    def placed_with(trial: Mapping[str, int]) -> GreedyPass:
        key = tuple(trial[m] for m in order)
        if key not in placements:
            placements[key] = greedy_pass(
                urls, order, trial, utilization, memory, cap, previous, hysteresis, forbid
            )
        return placements[key]

    counts = split_hot_models(
        counts,
        utilization,
        memory,
        caps,
        max_share,
        fixed,
        lambda trial: max(placed_with(trial).cload.values()),
    )
    placed = placed_with(counts)
    assignment, cload, mload = placed.assignment, placed.cload, placed.mload
    moved = placed.moved
    refined = (
        _refine(urls, assignment, utilization, memory, cap, cload, hysteresis) if refine else None
    )
    if refined is not None:
        for model, worker in refined.items():
            assignment[model] = Placement(((worker, 1.0),))
        cload, mload = _loads(urls, assignment, utilization, memory)
        moved = _moved(assignment, previous)
    kept = _previous_loads(urls, previous, utilization, memory, cap, counts, base, max_share, fixed)
    if kept is not None and not_worth_moving(max(kept[0].values()), max(cload.values())):
        return _held(assignment, previous, kept, placed, max(cload.values()))
    return AssignmentResult(
        assignment=MappingProxyType(assignment),
        compute_load=MappingProxyType(cload),
        memory_load=MappingProxyType(mload),
        stats=AssignmentStats(len(assignment), moved, placed.held, placed.max_improvement),
        oversubscribed=frozenset(w for w in urls if mload[w] > cap[w]),
        over_budget_models=tuple(placed.over_budget),
    )


def _moved(assignment: Mapping[str, Placement], previous: Mapping[str, Placement]) -> int:
    """The models `assignment` places elsewhere than `previous` did."""
    return sum(
        1
        for model, placement in assignment.items()
        if (before := previous.get(model)) is not None and set(before.urls) != set(placement.urls)
    )


def _held(
    assignment: Mapping[str, Placement],
    previous: Mapping[str, Placement],
    kept: tuple[dict[str, float], dict[str, int]],
    placed: GreedyPass,
    new_busiest: float,
) -> AssignmentResult:
    """The placement in force kept: the new plan is not worth its moves.

    Held are the models the new plan would have moved for a real (if too small) gain; a
    plan no lighter than the one in force differs only by tie-breaks, and holds nothing.
    """
    gain = max(kept[0].values()) > new_busiest
    would_move = gain * sum(
        1 for m, p in assignment.items() if set(p.urls) != set(previous[m].urls)
    )
    return AssignmentResult(
        assignment=MappingProxyType({m: previous[m] for m in assignment}),
        compute_load=MappingProxyType(kept[0]),
        memory_load=MappingProxyType(kept[1]),
        stats=AssignmentStats(len(assignment), 0, placed.held + would_move, placed.max_improvement),
    )


def not_worth_moving(kept_busiest: float, new_busiest: float) -> bool:
    """Whether the new placement's busiest worker is too little lighter to pay for moves.

    The per-model `hysteresis` has already had its say inside the greedy pass; this is
    the floor under it for the plan as a whole.
    """
    return kept_busiest <= new_busiest * (1 + PLAN_GAIN_FLOOR)


def _previous_loads(
    urls: Sequence[str],
    previous: Mapping[str, Placement],
    utilization: Mapping[str, float],
    memory: Mapping[str, int],
    cap: Mapping[str, float],
    counts: Mapping[str, int],
    base: Mapping[str, int],
    max_share: float,
    fixed: frozenset[str],
) -> tuple[dict[str, float], dict[str, int]] | None:
    """The loads `previous` puts on the workers under today's demand, or None when it no
    longer serves it.

    It serves when it places today's models, on workers still ready, within every
    weight budget, each with the replica count the new placement gives it, except that
    a count the automatic rules (`rsgw.scheduling.placement._replicas`) raised may differ while it
    still carries the demand (no replica above `max_share`, with the floor's margin)
    and, when it is above the operator's `base`, the model is still one they would
    split: demand hovering at a threshold must not flip a model between replica counts
    on every repack. An operator's count always holds.
    """
    if any(m not in previous for m in utilization):
        return None
    for model, u in utilization.items():
        placement = previous[model]
        if any(url not in cap for url in placement.urls):
            return None
        k, now = len(placement), counts[model]
        if k == now:
            continue
        if model in fixed or max_share <= 0 or k < base[model]:
            return None  # an operator's count, or no automatic replicas: it must hold
        if u / k > max_share * (1 + PLAN_GAIN_FLOOR):
            return None  # too few replicas for the demand, beyond the noise
        if k > base[model] and u / (k - 1) < max_share / 2 * (1 - PLAN_GAIN_FLOOR):
            return None  # no longer a model the rules would split, beyond the noise
    current = {m: previous[m] for m in utilization}
    cload, mload = _loads(urls, current, utilization, memory)
    if any(mload[w] > cap[w] for w in urls):
        return None
    return cload, mload


def _loads(
    urls: Sequence[str],
    assignment: Mapping[str, Placement],
    utilization: Mapping[str, float],
    memory: Mapping[str, int],
) -> tuple[dict[str, float], dict[str, int]]:
    """Each worker's compute load and resident bytes under `assignment`."""
    cload = dict.fromkeys(urls, 0.0)
    mload = dict.fromkeys(urls, 0)
    for model, placement in assignment.items():
        for url, weight in placement:
            cload[url] += utilization[model] * weight
            mload[url] += memory.get(model, 0)
    return cload, mload


def _refine(
    urls: Sequence[str],
    assignment: Mapping[str, Placement],
    utilization: Mapping[str, float],
    memory: Mapping[str, int],
    cap: Mapping[str, float],
    cload: Mapping[str, float],
    hysteresis: float,
) -> dict[str, str] | None:
    """A re-placement of the single-replica models whose busiest worker beats the greedy
    one's by more than `hysteresis` (`rsgw.scheduling.placement._refine`), or None.

    Skipped when the greedy placement already overfills a budget: then memory, not
    balance, is the problem, and it is the greedy's (logged) choice.
    """
    fixed = {m: p for m, p in assignment.items() if len(p) > 1}
    singles = [m for m, p in assignment.items() if len(p) == 1]
    if not singles or len(singles) > REFINE_MAX_MODELS:
        return None
    base_load, base_memory = _loads(urls, fixed, utilization, memory)
    _, mload = _loads(urls, assignment, utilization, memory)
    if any(mload[w] > cap[w] for w in urls):
        return None
    incumbent = max(cload.values())
    found = best_single_placement(
        urls, singles, utilization, memory, base_load, base_memory, cap, incumbent
    )
    if found is None:
        return None
    trial = {**fixed, **{m: Placement(((w, 1.0),)) for m, w in found.items()}}
    better = max(_loads(urls, trial, utilization, memory)[0].values())
    return found if improvement(incumbent, better) > hysteresis else None
