"""lpt_packing's placements carried out by loading and unloading models.

The decisions are pure (`rsgw.scheduling.placement._repository_moves`); this module does the
I/O they ask for, for the workers placed through Triton's repository extension
(`CapabilityTable.loadable`) and the models handed to the gateway
(`repository.models`):

* `place` (synchronous, from the packing shell, for every repack): route by what is
  loaded now, and post the move for the loop; a newer placement replaces one not yet
  begun.
* `serve`, one move at a time: room first (issue 49): on a worker a load goes to
  where the load would not fit its budget, copies leaving that worker are unloaded
  before it (the ones loaded elsewhere too first); then RepositoryModelLoad on the
  new holders (concurrently, each within `load_timeout_seconds`), a rediscovery so
  routing sees them, the settled placement installed; then each worker leaving a
  model's placement is drained of the calls it holds for it (for at most
  `drain_seconds`), RepositoryModelUnload there, and a rediscovery. A move is
  abandoned before its unloads if a newer placement has arrived: the newer one
  decides from what is loaded then.

Every load and unload is counted in the `MemoryLedger` from when it is asked until it
has answered, and a load is asked only once the ledger has taken it within the
worker's budget: no worker is ever asked to hold more than its budget, during a move
as after it. A copy about to be unloaded leaves routing first (and the routing table,
whatever a discovery read before says), so no call is sent to a worker that is
unloading the model; one that a model's last copy leaves is held by the cold path
(`rsgw.gateway.placement._cold_starts`) until a load lands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import trio

from rsgw.base._methods import Method
from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.gateway.fleet._pool import WorkerPool
from rsgw.gateway.fleet._prober import Prober
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.gateway.placement._latest import Latest
from rsgw.gateway.placement._memory_ledger import CopyState, MemoryLedger
from rsgw.gateway.placement._repository_calls import RepositoryCalls
from rsgw.scheduling.placement._lpt import LptScheduler
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._repository_moves import (
    MovePlan,
    Pair,
    plan_moves,
    settle,
    uniform,
    without,
)

logger = logging.getLogger(__name__)

#: Seconds between looks at a draining worker's calls for the model it loses.
DRAIN_POLL_INTERVAL = 0.02


class RepositoryPlacer:
    """Carries out lpt_packing's placements by load and unload; see the module docstring."""

    def __init__(
        self,
        config: RepositoryConfig,
        scheduler: LptScheduler,
        pool: WorkerPool,
        prober: Prober,
        metrics: GatewayMetrics,
        weight: Callable[[str], int],
        on_loading: Callable[[str], None] = lambda url: None,
    ) -> None:
        self.handed = frozenset(config.models)
        self._config = config
        self._scheduler = scheduler
        self._pool = pool
        self._prober = prober
        self._metrics = metrics
        self.ledger = MemoryLedger(config, weight, pool.label, lambda: prober.discovery.reads_begun)
        self._calls = RepositoryCalls(config, pool, metrics, self.ledger, on_loading)
        self._mail: Latest[tuple[int, MovePlan, str]] = Latest()
        #: (model, worker) pairs routing left -> their calls in flight, until unloaded
        #: there (bounded by the handed models times the workers).
        self._leaving: dict[Pair, Callable[[], int]] = {}
        #: Placements posted (numbered from 1), and the number of the last one carried
        #: out to its end (a move abandoned for a newer one is carried out by that one).
        self.posted = 0
        self.carried = 0
        self._moved = trio.Event()

    @property
    def min_residency_seconds(self) -> float:
        return self._config.min_residency_seconds

    @property
    def load_timeout_seconds(self) -> float:
        return self._config.load_timeout_seconds

    def label(self, url: str) -> str:
        return self._pool.label(url)

    def controlled(self) -> frozenset[str]:
        """The workers placed by loading and unloading models."""
        return frozenset(self._prober.capabilities.table.loadable(self._pool.urls))

    def _loaded(self) -> Mapping[str, tuple[str, ...]]:
        table = self._prober.discovery.table
        return {model: table.replicas(model) for model in self.handed}

    def synced(self) -> MemoryLedger:
        """The ledger, made to agree with what the workers report now."""
        discovery = self._prober.discovery
        self.ledger.sync(self.controlled(), discovery.reported)
        return self.ledger

    def in_flight(self, model: str, url: str) -> int:
        """Calls for `model` on `url` not yet answered (0 unless it is routed there)."""
        return self._scheduler.router.pending(((model, url),))()

    def place(self, target: Mapping[str, Placement], reason: str = "repack") -> None:
        """A repack decided `target`: route by what its loads allow, and post the move."""
        if not self.handed:
            self._scheduler.install(target)
            return
        routing = self._scheduler.routing
        plan = plan_moves(target, routing, self.handed, self.controlled(), self._loaded())
        self._watch_leaving(routing, plan.routing)
        self._scheduler.install(plan.routing)
        self.posted += 1
        self._mail.post((self.posted, plan, reason))

    def follow(self, target: Mapping[str, Placement]) -> None:
        """Another gateway places (coordination): route by what `target`'s loads allow
        now, and load or unload nothing here (the placer does). Called again each
        round, so routing takes in the placer's loads as they are done."""
        if not self.handed:
            self._scheduler.install(target)
            return
        routing = self._scheduler.routing
        plan = plan_moves(target, routing, self.handed, self.controlled(), self._loaded())
        if plan.routing != routing:
            self._scheduler.install(plan.routing)

    async def wait_carried(self, posted: int) -> None:
        """Wait until the placement numbered `posted` (or a later one) is carried out."""
        while self.carried < posted:
            await self._moved.wait()

    def _watch_leaving(
        self, before: Mapping[str, Placement], after: Mapping[str, Placement]
    ) -> None:
        """Keep count of the calls in flight on each (model, worker) pair routing is
        about to stop using, before the fill counters are re-keyed and forget them:
        that worker is drained of them before the model is unloaded there."""
        router = self._scheduler.router
        for model, placement in after.items():
            for url in placement.urls:
                self._leaving.pop((model, url), None)  # routed there again
        for model, placement in before.items():
            if model not in self.handed:
                continue
            staying = after.get(model)
            for url in placement.urls:
                pair = (model, url)
                if (staying is None or url not in staying.urls) and pair not in self._leaving:
                    self._leaving[pair] = router.pending((pair,))

    def route_with(self, model: str, url: str) -> None:
        """Route `model` to `url` too (a load on demand landed there)."""
        routing = dict(self._scheduler.routing)
        before = routing.get(model)
        routing[model] = uniform({url, *(before.urls if before is not None else ())})
        self._scheduler.install(routing)
        self._scheduler.packer.placed_on_demand(model, routing[model])

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Carry out the posted moves, the latest first-come, until cancelled."""
        task_status.started()
        while True:
            mail = await self._mail.take()
            try:
                await self._move(*mail)
            except Exception:  # a bug in one move must not stop placing
                logger.exception("lpt_packing: placement move failed; routing as it stands")

    async def _move(self, number: int, plan: MovePlan, reason: str) -> None:
        discovery = self._prober.discovery
        ledger = self.synced()
        loads, refused = await self._reserve(plan, reason)
        failed = refused | await self.act(Method.REPOSITORY_MODEL_LOAD, loads, reason)
        if plan.loads:
            await discovery.rediscover()
        if self._mail.pending:
            return  # a newer placement: it decides from what is loaded now
        settled = settle(plan, self.handed, self.controlled(), self._loaded(), failed)
        self._watch_leaving(self._scheduler.routing, settled.routing)
        self._scheduler.install(settled.routing)
        watched = [self._leaving[pair] for pair in settled.unloads if pair in self._leaving]
        await self._drain(watched)
        if self._mail.pending:
            return
        unloads = tuple(p for p in settled.unloads if ledger.begin_unload(*p))
        unload_failed = await self.unload(unloads, reason)
        self.carried = number
        moved, self._moved = self._moved, trio.Event()
        moved.set()
        if plan.loads or settled.unloads:
            label = self._pool.label
            logger.info(
                "lpt_packing: placement carried out by load and unload",
                extra={
                    "loaded": [f"{m}@{label(u)}" for m, u in plan.loads if (m, u) not in failed],
                    "unloaded": [
                        f"{m}@{label(u)}" for m, u in unloads if (m, u) not in unload_failed
                    ],
                    "failed": [f"{m}@{label(u)}" for m, u in sorted(failed | unload_failed)],
                },
            )

    async def _reserve(self, plan: MovePlan, reason: str) -> tuple[tuple[Pair, ...], set[Pair]]:
        """Take each of `plan`'s loads in the ledger, making room first where it does not
        fit (one worker at a time, under that worker's room lock); the loads taken, and
        the ones no room could be made for."""
        ledger = self.ledger
        by_worker: dict[str, list[str]] = {}
        for model, url in plan.loads:
            by_worker.setdefault(url, []).append(model)
        taken: list[Pair] = []
        refused: set[Pair] = set()
        for url in sorted(by_worker):
            models = by_worker[url]
            async with ledger.room(url):
                short = sum(ledger.weight(m) for m in models) - ledger.free(url)
                if short > 0:
                    await self.evict(self._leaving_for_room(url, plan, short), reason)
                for model in models:
                    if ledger.begin_load(model, url):
                        taken.append((model, url))
                    else:
                        refused.add((model, url))
        for model, url in sorted(refused):
            self._metrics.repack_failures.labels("load").inc()
            logger.warning(
                "lpt_packing: no room for a placed model on its worker; it stays where it is",
                extra={
                    "model": model,
                    "worker": self._pool.label(url),
                    "free_bytes": ledger.free(url),
                    "weight_bytes": ledger.weight(model),
                },
            )
        return tuple(taken), refused

    def _leaving_for_room(self, url: str, plan: MovePlan, short: float) -> list[Pair]:
        """The copies on `url` the new placement moves away, enough to free `short`
        bytes: first those loaded elsewhere too (their calls go there), then those the
        placement leaves cold, by name."""
        ledger = self.ledger
        leaving = [
            model
            for model, state in ledger.copies(url).items()
            if state is CopyState.RESIDENT
            and (model not in plan.target or url not in plan.target[model].urls)
        ]
        leaving.sort(key=lambda m: (len(ledger.resident(m)) < 2, m in plan.target, m))
        chosen: list[Pair] = []
        for model in leaving:
            if short <= 0:
                break
            chosen.append((model, url))
            short -= ledger.weight(model)
        return chosen

    async def evict(self, pairs: list[Pair], reason: str) -> set[Pair]:
        """Unload `pairs` now: out of routing and the routing table first, drained of
        their calls, then unloaded; the ones that failed."""
        ledger = self.ledger
        pairs = [pair for pair in pairs if ledger.begin_unload(*pair)]
        if not pairs:
            return set()
        routing = without(self._scheduler.routing, pairs)
        self._watch_leaving(self._scheduler.routing, routing)
        self._scheduler.install(routing)
        for model, url in pairs:
            self._prober.discovery.unloading(model, url)
        await self._drain([self._leaving[p] for p in pairs if p in self._leaving])
        return await self.unload(tuple(pairs), reason)

    async def _drain(self, watched: list[Callable[[], int]]) -> None:
        with trio.move_on_after(self._config.drain_seconds):
            # Polled: the request path releases its counts and must not pay for a wake-up.
            while any(held() > 0 for held in watched):  # noqa: ASYNC110
                await trio.sleep(DRAIN_POLL_INTERVAL)

    async def unload(self, pairs: tuple[Pair, ...], reason: str) -> set[Pair]:
        """RepositoryModelUnload on `pairs` (each begun in the ledger), then a
        rediscovery; the ones that failed."""
        if not pairs:
            return set()
        for pair in pairs:
            self._leaving.pop(pair, None)
            self._prober.discovery.unloading(*pair)
        try:
            failed = await self.act(Method.REPOSITORY_MODEL_UNLOAD, pairs, reason)
        finally:
            for pair in pairs:
                self._prober.discovery.unloaded(*pair)
        await self._prober.discovery.rediscover()
        return failed

    async def act(self, method: Method, pairs: tuple[Pair, ...], reason: str) -> set[Pair]:
        """`method` (RepositoryModelLoad or Unload) on every pair at once, each already
        begun in the ledger and ended there as it answers; the failed ones."""
        return await self._calls.act(method, pairs, reason)
