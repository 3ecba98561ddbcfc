"""How many replicas each model gets under lpt_packing, beyond what the operator set.

Pure: no trio, no sockets, no clock. Two rules raise a model's count, never above
one replica per worker and never where the weights would not fit:

* `auto_replicas`: a model whose demand is above `max_share` of one GPU cannot be
  carried by one worker at all; it gets `ceil(u / max_share)` replicas.
* `split_hot_models`: a model that is not too big for one GPU may still be too big
  for a balanced node. LPT places the heaviest model first, so a model heavier than
  the fleet's mean load sets the busiest worker by itself. Such models are split
  further while the resulting placement's busiest worker is lighter (measured:
  bench/fleet hot_replicas, where the exhaustive best splits the hot model in three
  and `ceil(u / max_share)` gave two). Replicas under half of `max_share` are not
  split: no worker is near saturation, and one replica batches deepest.

An operator's count (a per-model override) is never changed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

#: A split must lighten the busiest worker by at least this much (relatively) to be
#: taken, as much as a repack must (`PLAN_GAIN_FLOOR`): every replica is one more weight
#: load, and a split decided on a few seconds of noisy demand was undone at the next
#: repack (measured with `rsgw simulate` on hot_replicas: a 5%-share model split at the
#: first repack and merged again, moving four models inside the measured window).
MIN_SPLIT_GAIN = 0.05
#: Worker choices (models x workers per trial placement) the split may spend per repack.
SPLIT_BUDGET = 150_000


def auto_replicas(
    counts: Mapping[str, int],
    utilization: Mapping[str, float],
    memory: Mapping[str, int],
    caps: Sequence[float],
    max_share: float,
    fixed: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Replica counts raised for models one worker cannot carry, as far as memory allows.

    A model whose demand `u` is above `max_share` of one GPU gets `ceil(u / max_share)`
    replicas (at most one per worker), unless its count is `fixed` (an operator's
    override). Every replica must still find a worker with room for its weights
    (`caps`: each worker's budget, inf when unlimited; checked by placing the heaviest
    first on distinct workers); when they do not, the extra replica that relieves the
    least (the smallest `u / (k - 1)`) goes first.
    """
    counts = dict(counts)
    if max_share <= 0:
        return counts
    base = dict(counts)
    for model, u in utilization.items():
        if model not in fixed and u > max_share:
            wanted = math.ceil(u / max_share - 1e-9)
            counts[model] = max(counts[model], min(len(caps), wanted))
    while not replicas_fit(counts, memory, caps):
        extra = [m for m, k in counts.items() if k > base[m]]
        if not extra:
            break
        drop = min(extra, key=lambda m: (utilization[m] / (counts[m] - 1), m))
        counts[drop] -= 1
    return counts


def split_hot_models(
    counts: Mapping[str, int],
    utilization: Mapping[str, float],
    memory: Mapping[str, int],
    caps: Sequence[float],
    max_share: float,
    fixed: frozenset[str],
    busiest: Callable[[Mapping[str, int]], float],
) -> dict[str, int]:
    """`counts`, or counts that split hot models further where that lightens the
    busiest worker.

    First an offer: every model heavier than `floor` (the fleet's mean load per worker,
    or half of `max_share` when that is more) gets `ceil(u / floor)` replicas, so no
    replica is heavier than an even spread, as far as the workers and their budgets
    allow. Then, heaviest replica first, one more replica at a time for any model whose
    replicas are above half of `max_share`, kept while it lightens the busiest worker.
    Each trial is a whole placement (`busiest`), so the trials are held to a budget of
    `SPLIT_BUDGET` worker choices: a node's dozen models get as many as they need, a
    fleet of 1,000 models on 64 workers gets the offer and a trial or two.

    Args:
        counts: the counts so far (after `auto_replicas`).
        utilization, memory: per model.
        caps: each worker's weight budget (inf: unlimited).
        max_share: the `auto_replicas` threshold; 0 disables the split.
        fixed: models with an operator's count.
        busiest: the busiest worker's compute load of the placement some counts give.
    """
    counts = dict(counts)
    workers = len(caps)
    if max_share <= 0 or workers < 2 or not utilization:
        return counts
    trials = max(2, SPLIT_BUDGET // (len(utilization) * workers))
    floor = max(sum(utilization.values()) / workers, max_share / 2)
    best, best_load = counts, math.inf
    offer = dict(counts)
    for model, u in utilization.items():
        if model not in fixed and u / counts[model] > floor:
            offer[model] = max(counts[model], min(workers, math.ceil(u / floor - 1e-9)))
    while offer != counts and not replicas_fit(offer, memory, caps):
        extra = [m for m, k in offer.items() if k > counts[m]]
        drop = min(extra, key=lambda m: (utilization[m] / (offer[m] - 1), m))
        offer[drop] -= 1
    if offer != counts:
        best_load = busiest(counts)
        trials -= 2
        load = busiest(offer)
        if load < best_load * (1 - MIN_SPLIT_GAIN):
            best, best_load = offer, load
    improved = True
    while improved and trials > 0:
        improved = False
        hot = sorted(
            (m for m, u in utilization.items() if m not in fixed and u / best[m] > max_share / 2),
            key=lambda m: (-utilization[m] / best[m], m),
        )
        for model in hot:
            if trials <= 0:
                break
            if best[model] >= workers:
                continue
            trial = {**best, model: best[model] + 1}
            if not replicas_fit(trial, memory, caps):
                continue
            if best_load == math.inf:
                best_load = busiest(best)
                trials -= 1
            trials -= 1
            load = busiest(trial)
            if load < best_load * (1 - MIN_SPLIT_GAIN):
                best, best_load, improved = trial, load, True
                break  # the heaviest replica may be another model's now
    return best


def replicas_fit(
    counts: Mapping[str, int], memory: Mapping[str, int], caps: Sequence[float]
) -> bool:
    """Whether every model's replicas fit on distinct workers (heaviest first, roomiest)."""
    room = sorted(caps, reverse=True)
    for model in sorted(counts, key=lambda m: (-memory.get(m, 0), m)):
        need = memory.get(model, 0)
        if not need:
            continue
        room.sort(reverse=True)
        k = counts[model]
        if k > len(room) or room[k - 1] < need:
            return False
        for i in range(k):
            room[i] -= need
    return True
