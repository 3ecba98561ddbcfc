"""The routing table (model -> workers serving it) and round-robin replica choice.

Pure. The prober builds a new `RoutingTable` from each round's RepositoryIndex
answers (a model is served where its state reads ready, `is_ready_state`) and swaps
it in by reference; request handlers read whichever table is
current, with no lock, because a table never changes once built.

Round robin keeps one cursor per model. A swap that leaves a model's replica list
unchanged keeps its cursor, so a table rebuilt every probe interval does not
restart every model at its first worker (which would skew traffic towards it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

#: How a model's state reads when it is ready, in the spellings real servers use:
#: Triton (and rsgw's worker) write `READY`, MLServer writes its enum, `State.READY`.
READY_STATE = "READY"


def is_ready_state(state: str) -> bool:
    """Whether a RepositoryIndex row's `state` says the model is ready to serve.

    The part after the last dot, in any case: `READY`, `State.READY`, `ready`.
    """
    return state.rpartition(".")[2].upper() == READY_STATE


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """Which workers serve each model, in the configured worker order."""

    models: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    #: Counts rebuilds; 0 is the empty table before the first discovery.
    generation: int = 0

    def replicas(self, model: str) -> tuple[str, ...]:
        return self.models.get(model, ())

    def __len__(self) -> int:
        return len(self.models)

    def without(self, url: str, generation: int) -> RoutingTable:
        """This table with `url` taken out of every model (a model it alone served goes)."""
        models = {m: tuple(u for u in urls if u != url) for m, urls in self.models.items()}
        return RoutingTable(
            MappingProxyType({m: urls for m, urls in models.items() if urls}), generation
        )

    def without_copy(self, model: str, url: str, generation: int) -> RoutingTable:
        """This table with `url` no longer serving `model` (it is being unloaded there)."""
        left = tuple(u for u in self.replicas(model) if u != url)
        models = {m: urls for m, urls in self.models.items() if m != model}
        if left:
            models[model] = left
        return RoutingTable(MappingProxyType(dict(sorted(models.items()))), generation)


def build_routing_table(
    served: Mapping[str, Iterable[str]], worker_order: Sequence[str], generation: int
) -> RoutingTable:
    """A table from each worker's READY models.

    Args:
        served: worker URL -> the models it reported READY. Workers that did not
            answer are simply absent.
        worker_order: the configured order of worker URLs; each model's replicas
            follow it, so the table is deterministic.
    """
    by_model: dict[str, list[str]] = {}
    for url in worker_order:
        for model in served.get(url, ()):
            replicas = by_model.setdefault(model, [])
            if url not in replicas:
                replicas.append(url)
    return RoutingTable(
        MappingProxyType({m: tuple(urls) for m, urls in sorted(by_model.items())}), generation
    )


class RoundRobin:
    """Uniform rotation over each model's replicas, with failover order.

    `select` returns every replica: the chosen one first, then the others in
    rotation order, which is the order failover tries them.
    """

    def __init__(self) -> None:
        self._cursors: dict[str, tuple[tuple[str, ...], int]] = {}

    def select(self, model: str, replicas: tuple[str, ...]) -> tuple[str, ...]:
        if len(replicas) <= 1:
            return replicas
        known, cursor = self._cursors.get(model, (replicas, 0))
        if known != replicas:
            cursor = 0
        start = cursor % len(replicas)
        self._cursors[model] = (replicas, start + 1)
        return replicas[start:] + replicas[:start]

    def forget_missing(self, table: RoutingTable) -> None:
        """Drop cursors of models the new table no longer has (bounded state)."""
        for model in [m for m in self._cursors if m not in table.models]:
            del self._cursors[model]
