"""The load a scenario is offered: a reference placement, the capacity it gives, the time scale.

A scenario (`_scenario.py`) states the fleet and the models; the load it is swept
over is derived from them here, never tuned against a result:

1. a reference placement: the models' traffic split into as few equal parts as keep
   every part within one GPU's fair share (a hot model gets replicas), placed on the
   GPUs within their weight budget so that the busiest GPU's share of the traffic is as
   small as it can be (exhaustive search with symmetry breaking);
2. the highest total rate at which, in that placement, a simulation of the worker's own
   cost model (`_capacity`) keeps every GPU's p99 latency within the SLO. This counts
   the launch each co-resident model pays per cycle, which "every GPU in full batches"
   does not.

The offered load is a fraction of that capacity, time-scaled (`--time-scale` of the
workers, and the SLO with it) by the smallest whole factor that keeps the highest load
of the sweep within what this machine's two cores can send and proxy. `describe`
states the figures with their derivation, as bench/fleet and `rsgw simulate` print them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rsgw.simulate import _capacity
from rsgw.simulate._scenario import Scenario, ScenarioError
from rsgw.worker.device._batching import Discipline

MAX_OFFERED_RPS = 400.0  # what bench/fleet asks the machine's 2 cores to carry
#: Above this many model parts the reference placement is greedy (heaviest part onto the
#: lightest GPU), not exhaustive: the bench's scenarios stay well below it.
EXHAUSTIVE_PARTS = 24


@dataclass(frozen=True)
class Packing:
    """A reference placement: per GPU, (model number 1-based, share of its traffic)."""

    groups: tuple[tuple[tuple[int, float], ...], ...]
    shares: tuple[float, ...]  # the share of all requests each GPU serves

    @property
    def bottleneck(self) -> float:
        return max(self.shares)


def replicas_needed(shares: Sequence[float], workers: int, slots: int) -> list[int]:
    """Parts per model: as few as keep each part within one GPU's fair share (1/workers),
    as far as the GPUs' slots allow (the extra parts that help least go first)."""
    parts = [min(workers, max(1, math.ceil(s * workers - 1e-9))) for s in shares]
    while sum(parts) > workers * slots and max(parts) > 1:
        split = [i for i, k in enumerate(parts) if k > 1]
        i = min(split, key=lambda j: shares[j] / (parts[j] - 1))
        parts[i] -= 1
    return parts


def best_packing(shares: Sequence[float], workers: int, slots: int) -> Packing:
    """Minimise the busiest GPU's share, with hot models split into equal parts on
    different GPUs and at most `slots` models per GPU. Exhaustive, symmetry broken."""
    parts = replicas_needed(shares, workers, slots)
    items = sorted(
        ((i + 1, shares[i] / k) for i, k in enumerate(parts) for _ in range(k)),
        key=lambda item: -item[1],
    )
    if len(items) > EXHAUSTIVE_PARTS:
        return _packing(_greedy_groups(items, workers, slots))
    best: tuple[float, list[list[tuple[int, float]]]] = (math.inf, [])
    groups: list[list[tuple[int, float]]] = [[] for _ in range(workers)]
    loads = [0.0] * workers

    def place(i: int) -> None:
        nonlocal best
        if i == len(items):
            worst = max(loads)
            if worst < best[0]:
                best = (worst, [list(g) for g in groups])
            return
        model, share = items[i]
        tried_empty = False
        for g in range(workers):
            if not groups[g]:
                if tried_empty:
                    continue  # empty GPUs are interchangeable
                tried_empty = True
            if len(groups[g]) >= slots or any(m == model for m, _ in groups[g]):
                continue
            if loads[g] + share >= best[0]:
                continue
            groups[g].append((model, share))
            loads[g] += share
            place(i + 1)
            groups[g].pop()
            loads[g] -= share

    place(0)
    return _packing(best[1])


def _greedy_groups(
    items: Sequence[tuple[int, float]], workers: int, slots: int
) -> list[list[tuple[int, float]]]:
    """Heaviest part first onto the lightest GPU with a free slot that lacks the model."""
    groups: list[list[tuple[int, float]]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for model, share in items:
        open_ = [
            g
            for g in range(workers)
            if len(groups[g]) < slots and all(m != model for m, _ in groups[g])
        ]
        if not open_:
            return []
        g = min(open_, key=lambda k: (loads[k], k))
        groups[g].append((model, share))
        loads[g] += share
    return groups


def _packing(found: list[list[tuple[int, float]]]) -> Packing:
    if not found:
        raise ScenarioError(
            "no placement fits: the models' weights need more slots than the GPUs' budgets "
            "hold (fewer models, more GPUs, or a smaller weight_fraction)"
        )
    chosen = [g for g in found if g]
    totals: dict[int, float] = {}
    for group in chosen:
        for model, share in group:
            totals[model] = totals.get(model, 0.0) + share
    return Packing(
        tuple(tuple((m, share / totals[m]) for m, share in g) for g in chosen),
        tuple(sum(share for _, share in g) for g in chosen),
    )


@dataclass(frozen=True)
class Load:
    """The capacity, its derivation, and the time scale of a sweep."""

    packing: Packing
    capacity: float  # req/s at time scale 1 within the SLO (simulated)
    full_batch_capacity: float  # req/s if every GPU ran full batches of one model
    time_scale: float

    def offered(self, fraction: float) -> float:
        """Req/s actually sent at `fraction` of capacity, after time scaling."""
        return fraction * self.capacity / self.time_scale


def derive_load(scenario: Scenario, *, cold_starts: bool = False) -> Load:
    """The scenario's reference placement, capacity and time scale.

    `cold_starts`: the models need not all fit (issue 49's long tail, loaded on demand):
    the reference is then the GPUs' compute as if every model were resident, and the
    cold starts are what the residency policies under test add to it. Otherwise a
    scenario whose weights do not fit is a `ScenarioError`.
    """
    shares = scenario.shares
    slots = scenario.slots_per_gpu
    if cold_starts:
        slots = max(slots, math.ceil(scenario.count / scenario.workers))
    packing = best_packing(shares, scenario.workers, slots)
    gpus = [
        [
            (
                _capacity.SimModel(
                    scenario.model_name(model),
                    shares[model - 1],
                    scenario.max_batch,
                    scenario.launch_ms / 1000,
                    scenario.item_ms / 1000,
                    scenario.max_queue_delay_us / 1e6,
                    scenario.preferred_batch_size,
                ),
                part,
            )
            for model, part in group
        ]
        for group in packing.groups
    ]
    capacity = _capacity.capacity(gpus, scenario.slo_ms / 1000, Discipline(scenario.discipline))
    per_item = (scenario.launch_ms + scenario.item_ms * scenario.max_batch) / scenario.max_batch
    full = scenario.workers / (per_item / 1000)
    scale = float(math.ceil(max(scenario.loads) * capacity / MAX_OFFERED_RPS))
    return Load(packing, capacity, full, max(1.0, scale))


def describe(scenario: Scenario, load: Load) -> str:
    """The scenario and its load figures, stated with their derivation."""
    pct = ", ".join(f"{n} {p:.1%}" for n, p in zip(scenario.names, scenario.shares, strict=True))
    groups = "; ".join(
        "{"
        + ",".join(scenario.model_name(m) + ("" if part == 1 else f"x{part:.2f}") for m, part in g)
        + f"}} {s:.1%}"
        for g, s in zip(load.packing.groups, load.packing.shares, strict=True)
    )
    lines = [
        f"scenario {scenario.name}: {scenario.description}",
        f"  {scenario.workers} workers ({scenario.discipline}), {scenario.count} models: {pct}",
        f"  each model: max batch {scenario.max_batch}, {scenario.launch_ms:g} ms + "
        f"{scenario.item_ms:g} ms/row, load {scenario.load_ms:g} ms, weights "
        f"{scenario.weight_bytes:,} B ({scenario.slots_per_gpu} fit a worker's "
        f"{scenario.budget_bytes:,} B)"
        + _sizes(scenario)
        + (
            f"; dynamic batcher {scenario.max_queue_delay_us} us"
            + (
                f", preferred {list(scenario.preferred_batch_size)}"
                if scenario.preferred_batch_size
                else ""
            )
            if scenario.max_queue_delay_us
            else ""
        ),
        f"  reference placement (hot models split, busiest GPU minimised, exhaustive): {groups}",
        f"  capacity: {load.capacity:,.0f} req/s at time scale 1 = the highest rate at which a "
        f"simulation of the worker's cost model keeps every GPU's p99 within the SLO "
        f"({scenario.slo_ms:g} ms) in that placement (every GPU in full batches would be "
        f"{load.full_batch_capacity:,.0f})",
        f"  --time-scale {load.time_scale:g} (smallest whole factor keeping "
        f"{max(scenario.loads):.0%} of capacity <= {MAX_OFFERED_RPS:g} req/s); SLO "
        f"{scenario.slo_ms * load.time_scale:g} ms scaled; loads "
        + ", ".join(f"{f:.0%} = {load.offered(f):.0f} req/s" for f in scenario.loads),
    ]
    for phase in scenario.phases:
        top = max(range(scenario.count), key=lambda i: phase.shares[i])
        lines.append(
            f"  from {phase.at:.0%} of the run: popularity changes, most popular now "
            f"{scenario.model_name(top + 1)} ({phase.shares[top]:.1%})"
        )
    return "\n".join(lines)


def _sizes(scenario: Scenario) -> str:
    """How the models' weights and loads differ, when they do."""
    if not scenario.weight_classes:
        return ""
    classes = ", ".join(f"{c:g}" for c in scenario.weight_classes)
    fixed = scenario.load_fixed_fraction
    return (
        f" on average: weights in classes {classes} (relative, by popularity rank in turn), "
        f"loads {fixed:.0%} fixed and {1 - fixed:.0%} by weight"
    )
