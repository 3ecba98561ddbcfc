"""Placing models by loading and unloading them: what to load, route, drain and unload.

Pure: no trio, no sockets, no logging, no clock. ReactantServer's workers take a
placement as routing alone (their weight caches follow the traffic); a worker with
only Triton's repository extension (Triton in explicit model control, MLServer)
serves exactly the models it has loaded, so a placement is carried out by
RepositoryModelLoad and RepositoryModelUnload, for the models the operator handed to
the gateway (`repository.models`) and nothing else. A move must fail no call, so it
goes in two steps, each decided here and carried out by the shell
(`rsgw.gateway.placement._repository_placer`):

1. `plan_moves`: the loads the new placement needs, and the placement to route by
   while they run. A model whose new holders are all loaded routes by its new
   placement at once; one still waiting for a load keeps routing where it is loaded
   now (its placement in force, less the workers that no longer have it, or, if
   that leaves none, every worker that has it).
2. `settle`, once the loads have answered: the placement to route by from now on (the
   new one, less the holders whose load failed: a model keeps its old placement if
   none of its new holders could load it) and the unloads, each of a worker that
   holds a model its placement no longer names, only once the model is loaded on a
   worker its placement does name. The shell drains each leaving worker of the calls
   it holds for the model before unloading it there.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Set
from dataclasses import dataclass
from types import MappingProxyType

from rsgw.scheduling.placement._placement import Placement

#: A (model, worker URL) pair: one load or one unload.
Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class MovePlan:
    """The first step of a placement (see the module docstring).

    Attributes:
        target: the packer's placement, for every model.
        routing: the placement to route by while `loads` run.
        loads: the (model, worker) pairs to load, in order.
    """

    target: Mapping[str, Placement]
    routing: Mapping[str, Placement]
    loads: tuple[Pair, ...]


@dataclass(frozen=True, slots=True)
class Settled:
    """The second step: route by `routing`; drain and unload `unloads`."""

    routing: Mapping[str, Placement]
    unloads: tuple[Pair, ...]


def uniform(urls: Collection[str]) -> Placement:
    """Equal weights over `urls` (a model routed where it happens to be loaded)."""
    ordered = sorted(set(urls))
    return Placement(tuple((url, 1.0 / len(ordered)) for url in ordered))


def without(
    routing: Mapping[str, Placement], pairs: Iterable[tuple[str, str]]
) -> dict[str, Placement]:
    """`routing` with the copies `pairs` (model, url) taken out of it, equal weights
    over the rest (a model left nowhere is left out)."""
    routed = dict(routing)
    for model, url in pairs:
        placement = routed.get(model)
        if placement is not None and url in placement.urls:
            rest = [u for u in placement.urls if u != url]
            if rest:
                routed[model] = uniform(rest)
            else:
                del routed[model]
    return routed


def plan_moves(
    target: Mapping[str, Placement],
    routing: Mapping[str, Placement],
    handed: Set[str],
    controlled: Set[str],
    loaded: Mapping[str, Collection[str]],
) -> MovePlan:
    """The loads `target` needs and the placement to route by meanwhile.

    Args:
        target: the packer's new placement.
        routing: the placement routing is by now.
        handed: the models the gateway may load and unload.
        controlled: the workers placed by loading and unloading (the others, with
            ReactantServer's control plane, need nothing done).
        loaded: model -> the workers that serve it now (the routing table's replicas).
    """
    plan: dict[str, Placement] = {}
    loads: list[Pair] = []
    for model, placement in target.items():
        if model not in handed:
            plan[model] = placement
            continue
        have = set(loaded.get(model, ()))
        missing = [url for url in placement.urls if url in controlled and url not in have]
        loads.extend((model, url) for url in missing)
        if not missing:
            plan[model] = placement
            continue
        before = routing.get(model)
        serving = (
            [] if before is None else [u for u in before.urls if u in have or u not in controlled]
        )
        if before is not None and len(serving) == len(before):
            plan[model] = before
        elif serving or have:
            plan[model] = uniform(serving or have)
        # else: loaded nowhere: unplaced until a load lands (its calls find no replica)
    return MovePlan(MappingProxyType(dict(target)), MappingProxyType(plan), tuple(loads))


def settle(
    plan: MovePlan,
    handed: Set[str],
    controlled: Set[str],
    loaded: Mapping[str, Collection[str]],
    failed: Set[Pair],
) -> Settled:
    """Where to route once `plan`'s loads answered, and what to unload.

    Args:
        plan: the first step.
        handed, controlled: as for `plan_moves`.
        loaded: model -> the workers that serve it now (rediscovered after the loads).
        failed: the loads that failed.
    """
    routing: dict[str, Placement] = {}
    unloads: list[Pair] = []
    for model, placement in plan.target.items():
        if model not in handed:
            routing[model] = placement
            continue
        have = set(loaded.get(model, ()))
        kept = tuple(
            (url, weight)
            for url, weight in placement.replicas
            if (model, url) not in failed and (url in have or url not in controlled)
        )
        if len(kept) == len(placement):
            routing[model] = placement
        elif kept:
            routing[model] = uniform([url for url, _ in kept])
        elif model in plan.routing:
            routing[model] = plan.routing[model]  # no new holder took it: stay put
            continue
        else:
            continue
        holders = set(routing[model].urls)
        unloads.extend(
            (model, url) for url in sorted(have) if url in controlled and url not in holders
        )
    return Settled(MappingProxyType(routing), tuple(unloads))
