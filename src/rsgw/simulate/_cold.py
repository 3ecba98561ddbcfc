"""The gateway's cold path (issue 49) in virtual time: more models than GPU memory.

With `rsgw simulate --eviction`, the simulated workers start with nothing loaded
(explicit model control, `_device.Command`) and the simulated gateway places the
scenario's models by loading and unloading them, within each worker's budget, as
`rsgw.gateway.placement._cold_starts` and `_repository_placer` do on real processes.
Those are Trio shells around pure decisions; this module is the same shell in virtual
time, around the same decisions, which it calls and never re-implements:
`plan_cold_load` (where a cold model goes and what is evicted there), `ModelTerms` and
`LoadTimes` (through `_ledger.SimLedger`, the gateway's memory ledger), `Packer.demand`
(`DecayedDemand`, residency by value) or `Packer.recency` (LRU), and, for placements,
`Packer.repack` with the ledger's facts (`fit_to_budgets`), `plan_moves` and `settle`
(`_placer`).

What it mirrors, and why each matters for the figures:

* A call for a model with no READY replica in the routing table waits (ColdStarts.warm)
  holding its admission slot, or is refused at once (UNAVAILABLE) when its deadline is
  shorter than the model's expected load (`LoadTimes`, learned as the gateway's ledger
  times each load: from its RPC, or from the end of the load before it on the same
  worker). Every call that waited or was refused is a cold start
  (`gateway_cold_starts_total`), one per call, not per load; a waiting call whose
  deadline passes ends DEADLINE_EXCEEDED (the engine's give-up) and counts too.
* Loads are single-flight per model; cold models waiting for room are served by demand,
  then in the order they began waiting, and only the first may plan; a plan that must
  wait (NoRoom) looks again when the ledger changes or after `ROOM_RETRY_SECONDS`.
* A load on demand: the worker's room lock, a rediscovery, the evicted copies out of
  routing and the routing table, drained of their calls, unloaded (a control command: it
  waits behind the running batch and the worker's earlier commands), a rediscovery, the
  load (device time), a rediscovery, then the model routed there (`placer.route_with`,
  `Packer.placed_on_demand`). The rediscoveries take `REDISCOVERY_SECONDS` each: the
  room an unload frees is seen by the other waiting calls before the load takes it, so
  plans collide as on the real fleet (without that the simulated queue of cold models
  stalled far more often than the bench's).
* The routing table is rebuilt from what the workers list READY (a model is READY from
  its load's start) at every prober round and at every rediscovery the gateway makes
  (around each load and unload), so a call may find a model whose load is running and
  queue behind it, as on the real fleet.
* In-flight calls per (model, worker) protect copies (never evicted, drained before an
  unload).

Simplified: loads never fail (the ledger never asks past a budget, and the simulated
worker has no other failure); an RPC takes no time (a rediscovery does, see above); the
ledger is the truth (nothing loads behind the gateway's back, so it needs no
following); a waiting call's 50 ms retries share one timer; a model's waiting calls
plan as one (they would each reach the same plan). Pure: no Trio, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.scheduling.calls._routing import RoutingTable, build_routing_table
from rsgw.scheduling.placement._budget_fit import ResidencyFacts
from rsgw.scheduling.placement._lpt import LptScheduler
from rsgw.scheduling.placement._repository_moves import Pair, uniform, without
from rsgw.scheduling.placement._residency import (
    ColdLoad,
    NoRoom,
    first_for_room,
    plan_cold_load,
)
from rsgw.simulate._device import LOAD, UNLOAD, Command, SimCall
from rsgw.simulate._ledger import SimLedger
from rsgw.simulate._placer import Moves

#: How often a cold model waiting for room looks again if nothing signals sooner (the
#: gateway's `_cold_starts.ROOM_RETRY_SECONDS`).
ROOM_RETRY_SECONDS = 0.05
#: What one rediscovery (RepositoryIndex of every worker, the table swapped) or the
#: unload's look at the worker's index takes: the bench's gateway logs a load on demand
#: 3 to 9 ms (median 5) after its worker logs it loaded, and begins a load 5 to 10 ms
#: after the worker unloaded what made room for it. It matters: room an unload frees is
#: seen by the other waiting calls (the ledger changed) before the load it was made for
#: takes it, so their plans can pick it too, and a second plan's evictions may be in
#: vain (its load then finds no room and its calls plan again), as on the real fleet.
REDISCOVERY_SECONDS = 0.005
REFUSED = "UNAVAILABLE"


class Hooks(Protocol):
    """What the cold path asks of the engine (the simulated fleet and request path)."""

    def command(self, url: str, command: Command) -> None:
        """Queue `command` on worker `url` (RepositoryModelLoad or Unload)."""

    def serve(self, call: SimCall, now: float) -> None:
        """`call`'s model is routable now: route it, as `resolve` returns."""

    def refuse(self, call: SimCall, code: str, now: float) -> None:
        """End a waiting call with `code`."""

    def call_at(self, when: float, action: Callable[[float], None]) -> None:
        """Call `action(when)` at `when` (a retry, or the next step after a wait)."""

    def loading(self, url: str, now: float) -> None:
        """A load begins or ends on `url` (the admission forecast measures it afresh)."""

    def table(self, table: RoutingTable) -> None:
        """A new routing table is in force."""


@dataclass(eq=False, slots=True)
class _ColdLoad:
    """One load on demand: its plan, and the evictions it still waits for."""

    plan: ColdLoad
    evicting: int = 0


class ColdPath:
    """The simulated gateway's residency: cold path, placer and routing table.

    Args:
        config: the gateway's `repository` block.
        scheduler: lpt_packing's scheduler (its packer, routing and `install`).
        urls: the workers, in the gateway's order.
        ready: what a worker lists READY now.
        hooks: the engine.
        request_timeout: `worker_client.request_timeout_seconds` (a call's deadline is
            at most this far).
    """

    def __init__(
        self,
        config: RepositoryConfig,
        scheduler: LptScheduler,
        urls: Sequence[str],
        ready: Callable[[str], frozenset[str]],
        hooks: Hooks,
        request_timeout: float,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.packer = scheduler.packer
        self.urls = tuple(urls)
        self.ledger = SimLedger(config, urls)
        self.hooks = hooks
        self.moves = Moves(self, REDISCOVERY_SECONDS)
        self.table = RoutingTable()
        #: Calls that waited for a load or were refused for one (served or not).
        self.cold_starts = 0
        #: (action, reason) -> count: `gateway_residency_changes_total`'s labels.
        self.actions: dict[tuple[str, str], int] = {}
        self._ready = ready
        self._timeout = min(request_timeout, config.load_timeout_seconds)
        #: Cold models with calls waiting, in the order they began waiting.
        self._waiting: dict[str, list[SimCall]] = {}
        #: model -> when its first waiting call began to wait (while any waits).
        self._waiting_since: dict[str, float] = {}
        #: model -> its load on demand under way.
        self._warming: dict[str, _ColdLoad] = {}
        #: url -> the loads on demand holding (the first) or awaiting its room lock.
        self._rooms: dict[str, deque[_ColdLoad]] = {}
        self._in_flight: dict[Pair, int] = {}
        #: Pairs out of the routing table: being unloaded.
        self._unloading: set[Pair] = set()
        #: Pairs to unload once their calls are answered -> (tag, unload begun).
        self._draining: dict[Pair, tuple[object, bool]] = {}
        #: Each load's reason (startup, repack, demand), until it ends.
        self._reasons: dict[Pair, str] = {}
        self._retry: float | None = None
        self._serving = self._again = False

    # -- the request path --------------------------------------------------------------

    def holds(self, call: SimCall) -> bool:
        return call in self._waiting.get(call.model, ())

    def warm(self, call: SimCall, now: float) -> bool:
        """`call` found no READY replica: True, it waits here; False, refused at once
        (its deadline cannot cover the expected load: UNAVAILABLE)."""
        deadline = min(call.deadline, now + self._timeout)
        expected = self.ledger.expected_load(call.model)
        if expected > 0 and deadline - now < expected:
            self.cold_starts += 1
            return False
        self._waiting.setdefault(call.model, []).append(call)
        self._waiting_since.setdefault(call.model, now)
        self._serve_room(now)
        return True

    def give_up(self, call: SimCall) -> None:
        """A waiting call's deadline passed (the engine ends it DEADLINE_EXCEEDED)."""
        calls = self._waiting[call.model]
        calls.remove(call)
        if not calls:
            del self._waiting[call.model]  # its turn goes with its last call
            del self._waiting_since[call.model]
        self.cold_starts += 1

    def sent(self, call: SimCall) -> None:
        pair = (call.model, call.worker)
        self._in_flight[pair] = self._in_flight.get(pair, 0) + 1

    def answered(self, call: SimCall, now: float) -> None:
        """A call sent to a worker ended: a copy it was the last call of may go."""
        pair = (call.model, call.worker)
        left = self._in_flight[pair] - 1
        if left:
            self._in_flight[pair] = left
            return
        del self._in_flight[pair]
        drained = self._draining.pop(pair, None)
        if drained is not None:
            self._unload(pair, *drained, now)

    def in_flight(self, model: str, url: str) -> int:
        return self._in_flight.get((model, url), 0)

    def retry(self, now: float) -> None:
        self._retry = None
        self._serve_room(now)

    def call_at(self, when: float, action: Callable[[float], None]) -> None:
        self.hooks.call_at(when, action)

    # -- the routing table ----------------------------------------------------------------

    def discover(self) -> None:
        """A discovery: what each worker lists READY, less the copies being unloaded."""
        served = {
            url: [m for m in sorted(self._ready(url)) if (m, url) not in self._unloading]
            for url in self.urls
        }
        self._swap(build_routing_table(served, self.urls, self.table.generation + 1))

    def _swap(self, table: RoutingTable) -> None:
        self.table = table
        self.hooks.table(table)

    def _hide(self, pair: Pair) -> None:
        """`discovery.unloading`: out of the table now, whatever a read says."""
        if pair not in self._unloading:
            self._unloading.add(pair)
            self._swap(self.table.without_copy(*pair, self.table.generation + 1))

    def facts(self, now: float) -> ResidencyFacts:
        """What a repack's placement is cut to (`Packing._with_residency`)."""
        return self.ledger.facts(self.packer.demand(now), now, self.packer.recency)

    def route_with(self, model: str, url: str) -> None:
        """`RepositoryPlacer.route_with`: a load on demand landed on `url`."""
        routing = dict(self.scheduler.routing)
        before = routing.get(model)
        routing[model] = uniform({url, *(before.urls if before is not None else ())})
        self.scheduler.install(routing)
        self.packer.placed_on_demand(model, routing[model])

    def _out_of_routing(self, pairs: Sequence[Pair]) -> None:
        self.scheduler.install(without(self.scheduler.routing, pairs))

    # -- loads and unloads ---------------------------------------------------------------

    def request_load(self, model: str, url: str, tag: object, reason: str, now: float) -> None:
        """RepositoryModelLoad of `model` on `url` (already begun in the ledger)."""
        self._reasons[(model, url)] = reason
        self.hooks.loading(url, now)
        self.hooks.command(url, Command(LOAD, model, now, tag))

    def retire(self, pair: Pair, tag: object, begun: bool, now: float) -> None:
        """Unload `pair` once its calls are answered (`begun`: the ledger counts it as
        unloading already, an eviction; else a placement's, begun after the drain)."""
        if pair in self._draining:
            return  # its unload is asked for already
        if self.in_flight(*pair):
            self._draining[pair] = (tag, begun)
        else:
            self._unload(pair, tag, begun, now)

    def _unload(self, pair: Pair, tag: object, begun: bool, now: float) -> None:
        if not begun and not self.ledger.begin_unload(*pair):
            return  # no longer a resident copy there
        self._hide(pair)
        self.hooks.command(pair[1], Command(UNLOAD, pair[0], now, tag))

    def command_done(self, url: str, command: Command, now: float) -> None:
        """A worker carried out `command`: the ledger follows, and whoever waited on it
        goes on; then the calls waiting for room look again (the ledger changed)."""
        pair = (command.model, url)
        tag = command.tag
        if command.kind == UNLOAD:
            self.ledger.end_unload(*pair)
            self._unloading.discard(pair)
            self._count("unload", "eviction" if isinstance(tag, _ColdLoad) else "repack")
            self.discover()
            if isinstance(tag, _ColdLoad):
                tag.evicting -= 1
                if not tag.evicting:  # `placer.unload` rediscovers before it returns
                    load = tag
                    self.call_at(now + REDISCOVERY_SECONDS, lambda t: self._take_room(load, t))
        else:
            self.hooks.loading(url, now)
            reason = self._reasons.pop(pair)
            self._count("load", reason)
            seconds = now - command.asked
            self.ledger.end_load(*pair, now=now, seconds=seconds, protected=reason != "startup")
            if isinstance(tag, _ColdLoad):  # rediscovered, then routed there
                load = tag
                self.call_at(now + REDISCOVERY_SECONDS, lambda t: self._loaded(load, t))
            else:
                self.moves.load_done(tag, now)
        self._serve_room(now)

    def _count(self, action: str, reason: str) -> None:
        self.actions[(action, reason)] = self.actions.get((action, reason), 0) + 1

    # -- loads on demand -----------------------------------------------------------------

    def plan(self, model: str, now: float) -> ColdLoad | NoRoom:
        """Where `model` would be loaded now, and what evicted there first."""
        ledger = self.ledger
        return plan_cold_load(
            model,
            ledger.weight(model),
            ledger.memory(self.in_flight),
            ledger.terms(self.packer.demand(now), self.packer.recency),
            now,
            self.config.min_residency_seconds,
            by_recency=ledger.by_recency,
        )

    def _begin(self, plan: ColdLoad, now: float) -> None:
        load = self._warming[plan.model] = _ColdLoad(plan)
        room = self._rooms.setdefault(plan.url, deque())
        room.append(load)
        if len(room) == 1:
            self._locked(load, now)

    def _locked(self, load: _ColdLoad, now: float) -> None:
        """The room lock is ours: a rediscovery (what the worker holds now), then the
        evictions."""
        self.call_at(now + REDISCOVERY_SECONDS, lambda t: self._evict(load, t))

    def _evict(self, load: _ColdLoad, now: float) -> None:
        self.discover()
        url = load.plan.url
        pairs = [(m, url) for m in load.plan.evict if self.ledger.begin_unload(m, url)]
        if not pairs:
            self._take_room(load, now)
            return
        self._out_of_routing(pairs)
        for pair in pairs:
            self._hide(pair)
        load.evicting = len(pairs)
        for pair in pairs:
            self.retire(pair, load, True, now)

    def _take_room(self, load: _ColdLoad, now: float) -> None:
        """The evictions are done: the load, if its room is there; the lock goes on."""
        model, url = load.plan.model, load.plan.url
        room = self._rooms[url]
        assert room[0] is load
        room.popleft()
        taken = self.ledger.begin_load(model, url)
        if room:
            self._locked(room[0], now)
        if taken:
            self.request_load(model, url, load, "demand", now)
        else:
            del self._warming[model]  # its waiters plan again
            self._serve_room(now)

    def _loaded(self, load: _ColdLoad, now: float) -> None:
        model, url = load.plan.model, load.plan.url
        self.discover()
        self.route_with(model, url)
        del self._warming[model]
        self._serve_room(now)  # its calls return from their wait

    # -- the calls waiting for room ------------------------------------------------------

    def _serve_room(self, now: float) -> None:
        """Every waiting call looks at the table and the room again (`_wait_for_load`);
        re-entered from the engine's hooks, it runs once more instead."""
        if self._serving:
            self._again = True
            return
        self._serving = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._room_step(now)
        finally:
            self._serving = False
        if self._retry is None and self._for_room():
            self._retry = now + ROOM_RETRY_SECONDS
            self.call_at(self._retry, self.retry)

    def _for_room(self) -> list[str]:
        """The waiting models whose calls wait for room (no load of theirs under way)."""
        ledger = self.ledger
        return [m for m in self._waiting if m not in self._warming and not ledger.load_under_way(m)]

    def _room_step(self, now: float) -> None:
        # Calls whose model a table now lists (its load ended, or began and a discovery
        # saw it READY) return from their wait: served.
        for model in [
            m for m in self._waiting if m not in self._warming and self.table.replicas(m)
        ]:
            if not self.ledger.load_under_way(model):
                self._served(model, now)
        waiting = self._for_room()
        if not waiting:
            return
        demand = self.packer.demand(now)
        expected = self.ledger.expected_load
        first = first_for_room(waiting, demand, self._waiting_since, expected, now)
        plan = self.plan(first, now)
        if isinstance(plan, ColdLoad):
            self._begin(plan, now)
        elif not plan.may_wait:
            self._waiting_since.pop(first, None)
            for call in self._waiting.pop(first):
                self.cold_starts += 1
                self.hooks.refuse(call, REFUSED, now)

    def _served(self, model: str, now: float) -> None:
        self._waiting_since.pop(model, None)
        for call in self._waiting.pop(model, []):
            self.cold_starts += 1
            self.hooks.serve(call, now)
