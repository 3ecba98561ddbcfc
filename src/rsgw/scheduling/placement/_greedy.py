"""lpt_packing's greedy pass: every model, heaviest first, onto its least pressed workers.

Pure: no trio, no sockets, no logging, no clock. `compute_assignment`
(`rsgw.scheduling.placement._assignment`, whose module docstring states the rules: pressure,
tie-breaks, hysteresis, the memory guard) runs this pass once for each set of replica
counts it weighs (`split_hot_models` compares their busiest workers) and builds on the
one it settles on. `_lightest` is the pass's inner loop, run for every model of every
repack, so it allocates nothing per worker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rsgw.scheduling.placement._placement import Placement


def improvement(previous: float, best: float) -> float:
    """How much better `best` is than `previous`, relatively (`previous/best - 1`)."""
    return previous / best - 1 if best > 0 else 0.0


def _lightest(
    urls: Sequence[str],
    u: float,
    wm: int,
    cload: Mapping[str, float],
    mload: Mapping[str, int],
    cap: Mapping[str, float],
    hosted: Mapping[str, int],
    forbid: bool,
) -> tuple[str, bool]:
    """The worker a single replica of (`u`, `wm`) goes to, and whether any has room.

    The least `(pressure, compute load, models hosted)` among the workers where the
    weights fit when `forbid` and some do, else among all. One pass, no allocation per
    worker: it runs for every model of every repack (1,000 x 64 in the scale test).
    """
    inf = math.inf
    best_all = best_fit = (inf, inf, 0)
    chosen_all = chosen_fit = ""
    for w in urls:
        c = cload[w]
        m = mload[w] + wm
        limit = cap[w]
        pressure = c + u
        if limit != inf and m / limit > pressure:
            pressure = m / limit
        # Cheap rejections first: most workers lose on pressure alone.
        if pressure <= best_all[0] or (forbid and m <= limit and pressure <= best_fit[0]):
            key = (pressure, c, hosted[w])
            if not chosen_all or key < best_all:
                best_all, chosen_all = key, w
            if m <= limit and (not chosen_fit or key < best_fit):
                best_fit, chosen_fit = key, w
        elif m <= limit and not chosen_fit:
            best_fit, chosen_fit = (pressure, c, hosted[w]), w
    if forbid and chosen_fit:
        return chosen_fit, True
    return chosen_all, bool(chosen_fit)


@dataclass(slots=True)
class GreedyPass:
    """One heaviest-first pass: the placement, the loads it makes, its counts."""

    assignment: dict[str, Placement]
    cload: dict[str, float]
    mload: dict[str, int]
    moved: int = 0
    held: int = 0
    max_improvement: float = 0.0
    over_budget: list[str] = field(default_factory=list)


def greedy_pass(
    urls: Sequence[str],
    order: Sequence[str],
    counts: Mapping[str, int],
    utilization: Mapping[str, float],
    memory: Mapping[str, int],
    cap: Mapping[str, float],
    previous: Mapping[str, Placement],
    hysteresis: float,
    forbid_memory_oversubscription: bool,
) -> GreedyPass:
    """Place `order` (heaviest first) on `counts` workers each; see `_assignment`'s docstring."""
    out = GreedyPass({}, dict.fromkeys(urls, 0.0), dict.fromkeys(urls, 0))
    cload, mload = out.cload, out.mload
    hosted = dict.fromkeys(urls, 0)  # models placed so far: the tie-break after pressure
    forbid = forbid_memory_oversubscription

    def score(w: str, uc: float, wm: int) -> float:
        mem_fraction = (mload[w] + wm) / cap[w] if cap[w] != math.inf else 0.0
        return max(cload[w] + uc, mem_fraction)

    def fits(w: str, wm: int) -> bool:
        return mload[w] + wm <= cap[w]

    for model in order:
        u = utilization[model]
        wm = memory.get(model, 0)
        k = counts[model]
        before = previous.get(model)
        if k == 1:
            best, any_fits = _lightest(urls, u, wm, cload, mload, cap, hosted, forbid)
            chosen_one = best
            if before is not None and len(before) == 1 and before.urls[0] in cload:
                wp = before.urls[0]
                stay, move = score(wp, u, wm), score(best, u, wm)
                if math.isclose(stay, move, rel_tol=1e-9):
                    # Memory-bound at the same level: compute decides, as in the choice;
                    # moving to a worker with no compute at all relieves nothing.
                    stay, move = cload[wp] + u, cload[best] + u
                    if move <= 0:
                        stay = move
                out.max_improvement = max(out.max_improvement, improvement(stay, move))
                candidate = not (forbid and any_fits) or fits(wp, wm)
                if candidate and stay <= move * (1 + hysteresis):
                    out.held += best != wp and move < stay  # a tie held nothing
                    chosen_one = wp
            chosen = [chosen_one]
        else:
            members = set(before.urls) if before is not None else set()
            share = u / k
            ranked = sorted(
                (
                    int(forbid_memory_oversubscription and not fits(w, wm)),
                    score(w, share, wm),
                    0 if w in members else 1,
                    cload[w],
                    hosted[w],
                    w,
                )
                for w in urls
            )
            chosen = [w for *_, w in ranked[:k]]
        if forbid_memory_oversubscription and any(not fits(w, wm) for w in chosen):
            out.over_budget.append(model)
        for w in chosen:
            cload[w] += u / k
            mload[w] += wm
            hosted[w] += 1
        placement = Placement(tuple((w, 1.0 / k) for w in sorted(chosen)))
        out.assignment[model] = placement
        if before is not None and set(before.urls) != set(placement.urls):
            out.moved += 1
    return out
