"""A better packing than the greedy one, where a bounded search can find it.

Pure: no trio, no sockets, no clock. `compute_assignment` places models heaviest
first (LPT), which can leave the busiest worker up to a third above the best
possible (the classic 4/3 bound: three models of 0.4, 0.3, 0.3 and two of 0.5 on
two workers). Here a depth-first branch and bound re-places the single-replica
models, with the multi-replica ones fixed where the greedy put them, to minimise the
busiest worker's compute load, never overfilling a worker's weight budget.

It explores at most `max_nodes` partial placements, heaviest model first, empty
workers interchangeable, and prunes any branch that cannot beat the best found, so
small instances (the ones a brute force could check) are solved exactly, and large
ones keep the greedy placement unless an improvement turns up within the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: Partial placements the search may explore (a few milliseconds of pure Python).
DEFAULT_MAX_NODES = 20_000


def best_single_placement(
    workers: Sequence[str],
    models: Sequence[str],
    utilization: Mapping[str, float],
    memory: Mapping[str, int],
    base_load: Mapping[str, float],
    base_memory: Mapping[str, int],
    caps: Mapping[str, float],
    incumbent: float,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> dict[str, str] | None:
    """model -> worker for `models`, with a busiest load below `incumbent`; None if none found.

    Args:
        workers: the candidate workers.
        models: the single-replica models to place.
        utilization, memory: per model.
        base_load, base_memory: what the fixed (multi-replica) models already put on
            each worker.
        caps: each worker's weight budget (inf: unlimited).
        incumbent: the busiest load of the placement to beat.
        max_nodes: the search budget.
    """
    order = sorted(models, key=lambda m: (-utilization[m], -memory.get(m, 0), m))
    load = {w: base_load.get(w, 0.0) for w in workers}
    mem = {w: base_memory.get(w, 0) for w in workers}
    # Workers that start identical (nothing fixed on them, same budget) are interchangeable.
    blank = {w for w in workers if load[w] == 0 and mem[w] == 0}
    choice: dict[str, str] = {}
    best: tuple[float, dict[str, str] | None] = (incumbent * (1 - 1e-9), None)
    remaining = sum(utilization[m] for m in order)
    nodes = 0

    def lower_bound(rest: float) -> float:
        # The rest spread perfectly over the workers, but no lower than the busiest now.
        return max(max(load.values()), (sum(load.values()) + rest) / len(workers))

    def place(i: int, rest: float) -> None:
        nonlocal best, nodes
        if nodes >= max_nodes:
            return
        nodes += 1
        if i == len(order):
            busiest = max(load.values())
            if busiest < best[0]:
                best = (busiest, dict(choice))
            return
        if lower_bound(rest) >= best[0]:
            return
        model = order[i]
        u, need = utilization[model], memory.get(model, 0)
        tried_blank = set()
        for w in sorted(workers, key=lambda w: (load[w], w)):
            if w in blank and load[w] == 0 and mem[w] == 0:
                key = caps[w]
                if key in tried_blank:
                    continue
                tried_blank.add(key)
            if mem[w] + need > caps[w] or load[w] + u >= best[0]:
                continue
            load[w] += u
            mem[w] += need
            choice[model] = w
            place(i + 1, rest - u)
            del choice[model]
            load[w] -= u
            mem[w] -= need

    if workers and order:
        place(0, remaining)
    found = best[1]
    return None if found is None or len(found) != len(order) else found
