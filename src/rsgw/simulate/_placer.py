"""lpt_packing's placements carried out by load and unload, in virtual time.

`rsgw.gateway.placement._repository_placer` for the simulated cold path (`_cold`): a
repack's placement (the start-up's, then each compute-triggered one, cut to the
budgets by `Packer.repack` with the ledger's facts) is carried out in the gateway's
two steps, decided by the same pure functions: `plan_moves` (the loads, and the
placement to route by while they run: a model loaded nowhere stays unplaced until a
load lands), then, once every load has answered, `settle` (the placement from then on,
and the copies to drain and unload). One move at a time; a placement posted while one
runs replaces any other waiting, and the running one is abandoned before its unloads
(the newer decides from what is loaded then).

The start-up's loads are asked all at once, each worker running them in the plan's
order (on real processes the order in which the RPCs reach a worker varies from run to
run); they are not protected by the minimum residency. Later repacks never load a
model loaded nowhere (`loads_cold=False`) but may widen a resident one or drop copies.

Simplified: a load that does not fit its worker's room is refused (the real placer
would first unload copies the same placement moves away from that worker; at the long
tail's load no repack widened a model: the bench's gateway logs show only the
start-up's loads and unloads of duplicate copies); a move is done once its unloads are
asked (the real one waits for them).

Pure: no Trio, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from rsgw.scheduling.calls._routing import RoutingTable
from rsgw.scheduling.placement._lpt import LptScheduler
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._repository_moves import MovePlan, Pair, plan_moves, settle
from rsgw.simulate._ledger import SimLedger


class Shell(Protocol):
    """What the moves need of the cold path (`_cold.ColdPath`) that carries them out."""

    ledger: SimLedger
    scheduler: LptScheduler
    table: RoutingTable
    urls: tuple[str, ...]

    def request_load(self, model: str, url: str, tag: object, reason: str, now: float) -> None:
        """RepositoryModelLoad, already begun in the ledger; `load_done(tag)` when done."""

    def retire(self, pair: Pair, tag: object, begun: bool, now: float) -> None:
        """Drain `pair` of its calls, then unload it."""

    def discover(self) -> None:
        """Rediscover: the routing table from what the workers list READY."""

    def call_at(self, when: float, action: Callable[[float], None]) -> None:
        """Call `action(when)` at `when`."""


@dataclass(eq=False, slots=True)
class Move:
    """One placement under way: its plan, its loads still running, the refused ones."""

    plan: MovePlan
    reason: str
    outstanding: int = 0
    refused: frozenset[Pair] = frozenset()


class Moves:
    """The placer's moves, one at a time; see the module docstring."""

    def __init__(self, path: Shell, rediscovery_seconds: float) -> None:
        self._path = path
        self._rediscovery = rediscovery_seconds
        self.running: Move | None = None
        self.pending: Move | None = None
        self.posted = 0

    def _loaded(self) -> dict[str, tuple[str, ...]]:
        table = self._path.table
        return {model: table.replicas(model) for model in self._path.ledger.handed}

    def place(self, target: Mapping[str, Placement], reason: str, now: float) -> None:
        """A repack decided `target`: route by what its loads allow, and post the move."""
        path = self._path
        handed = path.ledger.handed
        routing = path.scheduler.routing
        plan = plan_moves(target, routing, handed, frozenset(path.urls), self._loaded())
        path.scheduler.install(plan.routing)
        self.posted += 1
        move = Move(plan, reason)
        if self.running is None:
            self._start(move, now)
        else:
            self.pending = move

    def _start(self, move: Move, now: float) -> None:
        path = self._path
        ledger = path.ledger
        self.running = move
        by_worker: dict[str, list[str]] = {}
        for model, url in move.plan.loads:
            by_worker.setdefault(url, []).append(model)
        taken: list[Pair] = []
        refused: set[Pair] = set()
        for url in sorted(by_worker):  # as `_reserve`: worker by worker
            for model in by_worker[url]:
                if ledger.begin_load(model, url):
                    taken.append((model, url))
                else:
                    refused.add((model, url))
        move.refused = frozenset(refused)
        move.outstanding = len(taken)
        asked = set(taken)
        for model, url in move.plan.loads:  # asked all at once, in the plan's order
            if (model, url) in asked:
                path.request_load(model, url, move, move.reason, now)
        if not taken:
            self._loads_done(move, now)

    def load_done(self, move: object, now: float) -> None:
        """One of a move's loads answered."""
        assert isinstance(move, Move)
        move.outstanding -= 1
        if not move.outstanding:  # the placer rediscovers before it settles
            self._path.call_at(now + self._rediscovery, lambda t: self._loads_done(move, t))

    def _loads_done(self, move: Move, now: float) -> None:
        path = self._path
        if move.plan.loads:
            path.discover()
        if self.pending is None:
            handed = path.ledger.handed
            settled = settle(move.plan, handed, frozenset(path.urls), self._loaded(), move.refused)
            path.scheduler.install(settled.routing)
            for pair in settled.unloads:
                path.retire(pair, None, False, now)
        self.running = None
        pending, self.pending = self.pending, None
        if pending is not None:
            self._start(pending, now)
