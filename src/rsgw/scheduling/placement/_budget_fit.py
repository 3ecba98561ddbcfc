"""A repack's placement cut to the workers' memory: the resident set, chosen by value.

Pure: no Trio, no I/O, no clock (the facts carry `now`). Issue 49: the packer places
every model somewhere, by compute and memory pressure; where models are placed by
loading them (`repository.models`) on workers with a budget, a placement past a
budget is an out-of-memory on a GPU. So the packer's placement is cut to fit before
it is carried out:

1. Each handed model keeps the copies it has loaded (as many as the packer gives it
   replicas: a move would be a load on a GPU), the packer's choice placing only the
   ones still to load, then trimmed to its `max_copies`. A model loaded nowhere is
   left cold (unless it is below its `min_copies`), but at start-up: after it, a
   model's first copy is loaded by a call asking for it (the cold path), since a
   call is the only proof of demand a model no one has called lately has. A repack
   that loaded the tail into room a cold load had just freed made young copies that
   pushed the middle of the distribution out (the long-tail bench).
2. Each budgeted worker keeps the copies placed on it in order of priority until its
   budget is full: first the ones that must stay (a model at its `min_copies` floor
   where it is loaded, a copy loaded less than the minimum residency ago), then by
   value (demand x reload seconds: the seconds of cold-start waiting a resident copy
   saves each second), then a copy already loaded there before one that would be
   loaded, then by name. The rest of the copies on it are dropped.
3. A model left with no holder moves to the budgeted worker with most room left that
   can take it (where it is loaded first), the most valuable first; a model no worker
   can take is cold: unplaced, loaded on demand by the cold path.
4. A model below its `min_copies` gets copies where room is left.

Workers without a budget (or not placed by loading) and models not handed are left
as the packer placed them. The same facts give the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._residency import ModelTerms, WorkerMemory


@dataclass(frozen=True, slots=True)
class ResidencyFacts:
    """What the fit needs to know besides the packer's placement.

    Attributes:
        handed: the models placed by loading and unloading.
        workers: each budgeted worker placed by loading: its budget and what it holds
            (copies loading or unloading count as held).
        weights: handed model -> the bytes of its weights.
        terms: handed model -> its demand, reload seconds and min/max copies (its
            value; under `eviction: lru`, its recency).
        min_residency_seconds: a copy younger than this is not dropped.
        now: the clock the copies' `loaded_at` are on.
        loads_cold: see step 1 of the module docstring.
    """

    handed: frozenset[str] = frozenset()
    workers: Mapping[str, WorkerMemory] = field(default_factory=lambda: MappingProxyType({}))
    weights: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    terms: Mapping[str, ModelTerms] = field(default_factory=lambda: MappingProxyType({}))
    min_residency_seconds: float = 0.0
    now: float = 0.0
    #: Whether a model loaded nowhere may be placed (a start-up repack); otherwise
    #: only one below its `min_copies` is.
    loads_cold: bool = True


@dataclass(frozen=True, slots=True)
class BudgetFit:
    """The placement to carry out, and the handed models left cold by it."""

    assignment: Mapping[str, Placement]
    cold: tuple[str, ...]


def fit_to_budgets(assignment: Mapping[str, Placement], facts: ResidencyFacts) -> BudgetFit:
    """`assignment` cut to the budgets of `facts.workers`; see the module docstring."""
    budgeted = facts.workers
    if not budgeted or not facts.handed:
        return BudgetFit(MappingProxyType(dict(assignment)), ())
    terms = {m: facts.terms.get(m, ModelTerms()) for m in facts.handed}
    value = {m: terms[m].value for m in facts.handed}
    loaded_on = {
        m: frozenset(url for url, w in budgeted.items() if m in w.copies) for m in facts.handed
    }

    def young(model: str, url: str) -> bool:
        copy = budgeted[url].copies.get(model)
        return copy is not None and facts.now - copy.loaded_at < facts.min_residency_seconds

    # 1. holders on budgeted workers, trimmed to max_copies (loaded ones kept first)
    holders: dict[str, list[str]] = {}
    left_cold: list[str] = []
    for model, placement in assignment.items():
        if model not in facts.handed:
            continue
        if not facts.loads_cold and not loaded_on[model] and not terms[model].min_copies:
            holders[model] = []
            if any(u in budgeted for u in placement.urls):
                left_cold.append(model)
            continue
        # Sticky: a copy loaded stays where it is; the packer's choice places only the
        # copies still to load (a move is a load on a GPU, and its room made first).
        placed = [u for u in placement.urls if u in budgeted]
        loaded = sorted(loaded_on[model])
        urls = loaded[: len(placed)] + [u for u in placed if u not in loaded_on[model]]
        urls = urls[: len(placed)]
        urls += sorted(u for u in loaded_on[model] if u not in urls and young(model, u))
        cap = terms[model].max_copies
        if cap is not None and len(urls) > cap:
            urls.sort(key=lambda u: (u not in loaded_on[model], u))
            urls = urls[:cap]
        holders[model] = urls

    # 2. each worker keeps its copies by priority until its budget is full
    room = {url: w.budget for url, w in budgeted.items()}
    kept: dict[str, list[str]] = {model: [] for model in holders}
    wanted: dict[str, list[str]] = {url: [] for url in budgeted}
    for model, urls in holders.items():
        for url in urls:
            wanted[url].append(model)
    for url, models in wanted.items():

        def priority(m: str, url: str = url) -> tuple[object, ...]:
            must = _at_floor(m, url, terms[m].min_copies, loaded_on[m]) or young(m, url)
            return (not must, -value[m], url not in loaded_on[m], m)

        for model in sorted(models, key=priority):
            size = facts.weights.get(model, 0)
            if size <= room[url]:
                room[url] -= size
                kept[model].append(url)

    # 3. a model left with no holder goes where room is left, or is cold
    cold: list[str] = left_cold
    elsewhere = {
        m for m, p in assignment.items() if m in holders and any(u not in budgeted for u in p.urls)
    }
    homeless = [m for m, urls in kept.items() if holders[m] and not urls and m not in elsewhere]
    for model in sorted(homeless, key=lambda m: (terms[m].min_copies == 0, -value[m], m)):
        home = _roomiest(model, facts.weights.get(model, 0), room, loaded_on[model], [])
        if home is None:
            cold.append(model)
        else:
            room[home] -= facts.weights.get(model, 0)
            kept[model].append(home)

    # 4. a model below its min_copies gets copies where room is left
    for model in sorted(kept, key=lambda m: (-value[m], m)):
        size = facts.weights.get(model, 0)
        while 0 < len(kept[model]) < terms[model].min_copies:
            more = _roomiest(model, size, room, loaded_on[model], kept[model])
            if more is None:
                break
            room[more] -= size
            kept[model].append(more)

    fitted: dict[str, Placement] = {}
    for model, placement in assignment.items():
        if model not in holders:
            fitted[model] = placement
            continue
        chosen = set(kept[model]) | {u for u in placement.urls if u not in budgeted}
        if not chosen:
            continue  # cold
        if chosen == set(placement.urls):
            fitted[model] = placement
        else:
            ordered = sorted(chosen)
            fitted[model] = Placement(tuple((u, 1.0 / len(ordered)) for u in ordered))
    return BudgetFit(MappingProxyType(fitted), tuple(sorted(cold)))


def _at_floor(model: str, url: str, min_copies: int, loaded_on: frozenset[str]) -> bool:
    """Whether the copy of `model` on `url` is one its `min_copies` floor needs: the
    floor is not met by the loaded copies, or this loaded one is among those meeting it."""
    if min_copies <= 0:
        return False
    return len(loaded_on) < min_copies or (url in loaded_on and len(loaded_on) <= min_copies)


def _roomiest(
    model: str,
    size: int,
    room: Mapping[str, int],
    loaded_on: frozenset[str],
    taken: list[str],
) -> str | None:
    """The worker with room for `size` where `model` is loaded, else the one with most
    room left (ties to the smaller URL); None if none has room."""
    fits = [url for url, left in room.items() if left >= size and url not in taken]
    if not fits:
        return None
    return min(fits, key=lambda u: (u not in loaded_on, -room[u], u))
