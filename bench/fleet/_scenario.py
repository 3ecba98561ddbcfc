"""The fixed scenario of issue 10, and the cost-model arithmetic behind its load figure.

Everything here is derived from the issue's numbers, never tuned against a result:
four `fifo` workers, twelve models with Zipf(1.0) popularity, max batch 32, 10 ms per
dispatch plus 0.5 ms per row, 300 ms to load a model, and weights such that all twelve
take 0.9 of the four workers' combined weight budget. The offered load is 70% of the
fleet's capacity "when every model is served by one GPU in full batches", and the time
scale is the smallest whole factor that keeps that load at or below 400 requests/s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WORKERS = 4
MODELS = 12
ZIPF_EXPONENT = 1.0
MAX_BATCH = 32
LAUNCH_MS = 10.0
ITEM_MS = 0.5
LOAD_MS = 300.0
# Each worker's on-demand weight budget. Any value works: only the ratio to the weights
# matters. 10^9 keeps the numbers readable in the workers' metrics.
BUDGET_BYTES = 1_000_000_000
WEIGHT_FRACTION = 0.9  # all twelve models' weights / the four budgets together
LOAD_FRACTION = 0.7  # offered load / capacity
MAX_OFFERED_RPS = 400.0  # what the machine's 2 cores are asked to carry
WARMUP_S = 20.0
MEASURE_S = 60.0
REPEAT = 3
# Request elements: one row of 16 FP32, so a request is small and the gateway's cost per
# call is what bench/overhead measured for 1 KiB calls or less.
ROW_ELEMENTS = 16


def model_name(i: int) -> str:
    """Model i (1-based) of the scenario; zero-padded so name order is popularity order."""
    return f"m{i:02d}"


def popularity() -> list[float]:
    """Zipf shares p_i = i^-s / H, i = 1..12: model 1 gets 32% of the requests, model 12 2.7%."""
    raw = [i**-ZIPF_EXPONENT for i in range(1, MODELS + 1)]
    total = sum(raw)
    return [r / total for r in raw]


def weight_bytes() -> int:
    """Equal weights, 0.9 x (4 x budget) / 12: three models fit a worker, four do not.

    So every model fits alone, and the set fits the fleet only packed three per worker.
    """
    return int(WEIGHT_FRACTION * WORKERS * BUDGET_BYTES / MODELS)


def full_batch_ms_per_item() -> float:
    """GPU milliseconds per request when dispatched in full batches (before time scaling)."""
    return (LAUNCH_MS + ITEM_MS * MAX_BATCH) / MAX_BATCH


@dataclass(frozen=True)
class Packing:
    """The best placement with each model on exactly one GPU, under the weight budget."""

    groups: tuple[tuple[int, ...], ...]  # model numbers (1-based) per GPU
    shares: tuple[float, ...]  # the share of all requests each GPU serves

    @property
    def bottleneck(self) -> float:
        return max(self.shares)


def best_packing(shares: Sequence[float] | None = None) -> Packing:
    """Minimise the busiest GPU's share of requests, one GPU per model, within budget.

    Exhaustive (with symmetry breaking: a model goes to a used GPU or the first empty
    one), which for 12 models in 4 GPUs of 3 is 15,400 placements: exact, instant.
    """
    shares = list(shares or popularity())
    per_gpu = BUDGET_BYTES // weight_bytes()
    best: tuple[float, list[list[int]]] = (math.inf, [])
    groups: list[list[int]] = []
    loads: list[float] = []

    def place(i: int) -> None:
        nonlocal best
        if i == len(shares):
            worst = max(loads)
            if worst < best[0]:
                best = (worst, [list(g) for g in groups])
            return
        for g in range(min(len(groups) + 1, WORKERS)):
            if g == len(groups):
                groups.append([])
                loads.append(0.0)
            if len(groups[g]) < per_gpu and loads[g] + shares[i] < best[0]:
                groups[g].append(i + 1)
                loads[g] += shares[i]
                place(i + 1)
                groups[g].pop()
                loads[g] -= shares[i]
            if not groups[g]:
                groups.pop()
                loads.pop()

    place(0)
    chosen = best[1]
    return Packing(
        tuple(tuple(g) for g in chosen),
        tuple(sum(shares[m - 1] for m in g) for g in chosen),
    )


@dataclass(frozen=True)
class Load:
    """The offered load and the figures it is derived from."""

    raw_capacity: float  # req/s of 4 GPUs in full batches, ignoring placement (time scale 1)
    capacity: float  # req/s when each model is on one GPU, in full batches (time scale 1)
    packing: Packing
    time_scale: float
    offered: float  # req/s actually offered, after time scaling


def offered_load() -> Load:
    """70% of the one-GPU-per-model full-batch capacity, at the smallest whole time scale
    that keeps it at or below 400 req/s.

    With every model on one GPU, a GPU serving a share q of the requests in full batches
    saturates at 1 / (q x 0.8125 ms): the GPU with the hottest model (which must also hold
    two more, since a GPU holds three models' weights) is the fleet's limit, well below
    four GPUs' worth of full batches.
    """
    per_item_s = full_batch_ms_per_item() / 1000
    packing = best_packing()
    capacity = 1 / (per_item_s * packing.bottleneck)
    unscaled = LOAD_FRACTION * capacity
    scale = float(math.ceil(unscaled / MAX_OFFERED_RPS))
    return Load(WORKERS / per_item_s, capacity, packing, scale, unscaled / scale)


def catalogue_yaml() -> str:
    """The workers' model catalogue: twelve identical GPU-shaped models, synthetic compute."""
    lines = [
        "# bench/fleet: the fixed scenario of issue 10 (generated).",
        "models:",
    ]
    for i in range(1, MODELS + 1):
        lines += [
            f"  - name: {model_name(i)}",
            f"    inputs: [{{name: INPUT0, datatype: FP32, shape: [-1, {ROW_ELEMENTS}]}}]",
            f"    outputs: [{{name: OUTPUT0, datatype: FP32, shape: [-1, {ROW_ELEMENTS}]}}]",
            f"    max_batch_size: {MAX_BATCH}",
            f"    launch_ms: {LAUNCH_MS}",
            f"    item_ms: {ITEM_MS}",
            f"    weight_bytes: {weight_bytes()}",
            f"    load_ms: {LOAD_MS}",
        ]
    return "\n".join(lines) + "\n"


def describe(load: Load) -> str:
    """The scenario and the load figure, stated with their derivation."""
    pct = ", ".join(f"{model_name(i + 1)} {p:.1%}" for i, p in enumerate(popularity()))
    groups = "; ".join(
        "{" + ",".join(model_name(m) for m in g) + f"}} {s:.1%}"
        for g, s in zip(load.packing.groups, load.packing.shares, strict=True)
    )
    per_item = full_batch_ms_per_item()
    return "\n".join(
        [
            f"scenario: {WORKERS} workers (fifo), {MODELS} models, Zipf({ZIPF_EXPONENT:g}) "
            f"popularity: {pct}",
            f"  each model: max batch {MAX_BATCH}, {LAUNCH_MS:g} ms + {ITEM_MS:g} ms/row, "
            f"load {LOAD_MS:g} ms, weights {weight_bytes():,} B; worker budget "
            f"{BUDGET_BYTES:,} B ({BUDGET_BYTES // weight_bytes()} models fit, all twelve are "
            f"{WEIGHT_FRACTION:g} of the four budgets)",
            f"  full batch: {LAUNCH_MS + ITEM_MS * MAX_BATCH:g} ms for {MAX_BATCH} rows = "
            f"{per_item:.4f} ms/request; four GPUs in full batches: "
            f"{load.raw_capacity:,.0f} req/s (time scale 1)",
            "  one GPU per model, a placement minimising the busiest GPU (exhaustive search): "
            + groups,
            f"  capacity = 1 / ({per_item:.4f} ms x {load.packing.bottleneck:.4f}) = "
            f"{load.capacity:,.0f} req/s at time scale 1; {LOAD_FRACTION:.0%} of it = "
            f"{LOAD_FRACTION * load.capacity:,.0f} req/s",
            f"  --time-scale {load.time_scale:g} (smallest whole factor keeping the load <= "
            f"{MAX_OFFERED_RPS:g} req/s): offered {load.offered:.1f} req/s, open-loop Poisson, "
            f"one row per request",
        ]
    )
