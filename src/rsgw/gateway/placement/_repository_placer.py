"""lpt_packing's placements carried out by loading and unloading models.

The decisions are pure (`rsgw.scheduling.placement._repository_moves`); this module does the
I/O they ask for, for the workers placed through Triton's repository extension
(`CapabilityTable.loadable`) and the models handed to the gateway
(`repository.models`):

* `place` (synchronous, from the packing shell, for every repack): route by what is
  loaded now, and post the move for the loop; a newer placement replaces one not yet
  begun.
* `serve`, one move at a time: RepositoryModelLoad on the new holders (concurrently,
  each within `load_timeout_seconds`), a rediscovery so routing sees them, the settled
  placement installed; then each worker leaving a model's placement is drained of the
  calls it holds for it (for at most `drain_seconds`), RepositoryModelUnload there,
  and a rediscovery. A move is abandoned before its unloads if a newer placement has
  arrived: the newer one decides from what is loaded then.

A call that reaches a worker just as it unloads the model (a failover onto it, say)
is answered UNAVAILABLE there and fails over like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import RsgwError
from rsgw.base._methods import Method
from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.gateway.fleet._pool import WorkerPool
from rsgw.gateway.fleet._prober import Prober
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.gateway.placement._latest import Latest
from rsgw.scheduling.placement._lpt import LptScheduler
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._repository_moves import MovePlan, Pair, plan_moves, settle

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
    ) -> None:
        self.handed = frozenset(config.models)
        self._config = config
        self._scheduler = scheduler
        self._pool = pool
        self._prober = prober
        self._metrics = metrics
        self._mail: Latest[tuple[int, MovePlan]] = Latest()
        #: (model, worker) pairs routing left -> their calls in flight, until unloaded
        #: there (bounded by the handed models times the workers).
        self._leaving: dict[Pair, Callable[[], int]] = {}
        #: Placements posted (numbered from 1), and the number of the last one carried
        #: out to its end (a move abandoned for a newer one is carried out by that one).
        self.posted = 0
        self.carried = 0
        self._moved = trio.Event()

    def _controlled(self) -> frozenset[str]:
        return frozenset(self._prober.capabilities.table.loadable(self._pool.urls))

    def _loaded(self) -> Mapping[str, tuple[str, ...]]:
        table = self._prober.discovery.table
        return {model: table.replicas(model) for model in self.handed}

    def place(self, target: Mapping[str, Placement]) -> None:
        """A repack decided `target`: route by what its loads allow, and post the move."""
        if not self.handed:
            self._scheduler.install(target)
            return
        routing = self._scheduler.routing
        plan = plan_moves(target, routing, self.handed, self._controlled(), self._loaded())
        self._watch_leaving(routing, plan.routing)
        self._scheduler.install(plan.routing)
        self.posted += 1
        self._mail.post((self.posted, plan))

    def follow(self, target: Mapping[str, Placement]) -> None:
        """Another gateway places (coordination): route by what `target`'s loads allow
        now, and load or unload nothing here (the placer does). Called again each
        round, so routing takes in the placer's loads as they are done."""
        if not self.handed:
            self._scheduler.install(target)
            return
        routing = self._scheduler.routing
        plan = plan_moves(target, routing, self.handed, self._controlled(), self._loaded())
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

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Carry out the posted moves, the latest first-come, until cancelled."""
        task_status.started()
        while True:
            mail = await self._mail.take()
            try:
                await self._move(*mail)
            except Exception:  # a bug in one move must not stop placing
                logger.exception("lpt_packing: placement move failed; routing as it stands")

    async def _move(self, number: int, plan: MovePlan) -> None:
        discovery = self._prober.discovery
        failed = await self._act(Method.REPOSITORY_MODEL_LOAD, plan.loads)
        if plan.loads:
            await discovery.rediscover()
        if self._mail.pending:
            return  # a newer placement: it decides from what is loaded now
        settled = settle(plan, self.handed, self._controlled(), self._loaded(), failed)
        self._watch_leaving(self._scheduler.routing, settled.routing)
        self._scheduler.install(settled.routing)
        watched = [self._leaving[pair] for pair in settled.unloads if pair in self._leaving]
        with trio.move_on_after(self._config.drain_seconds):
            # Polled: the request path releases its counts and must not pay for a wake-up.
            while any(held() > 0 for held in watched):  # noqa: ASYNC110
                await trio.sleep(DRAIN_POLL_INTERVAL)
        if self._mail.pending:
            return
        for pair in settled.unloads:
            self._leaving.pop(pair, None)
        unload_failed = await self._act(Method.REPOSITORY_MODEL_UNLOAD, settled.unloads)
        if settled.unloads:
            await discovery.rediscover()
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
                        f"{m}@{label(u)}" for m, u in settled.unloads if (m, u) not in unload_failed
                    ],
                    "failed": [f"{m}@{label(u)}" for m, u in sorted(failed | unload_failed)],
                },
            )

    async def _act(self, method: Method, pairs: tuple[Pair, ...]) -> set[Pair]:
        """`method` (RepositoryModelLoad or Unload) on every pair at once; the failed ones."""
        load = method is Method.REPOSITORY_MODEL_LOAD
        action = "load" if load else "unload"
        deadline = trio.current_time() + self._config.load_timeout_seconds
        failed: set[Pair] = set()

        async def one(model: str, url: str) -> None:
            request = (
                pb.RepositoryModelLoadRequest(model_name=model)
                if load
                else pb.RepositoryModelUnloadRequest(model_name=model)
            )
            try:
                await self._pool.channels[url].unary(
                    method.wire, request.SerializeToString(), deadline=deadline
                )
            except RsgwError as exc:
                failed.add((model, url))
                self._metrics.repack_failures.labels(action).inc()
                logger.warning(
                    f"lpt_packing: {method.rpc} failed; the placement keeps what is loaded",
                    extra={
                        "model": model,
                        "worker": self._pool.label(url),
                        "status": exc.code.name,
                        "said": exc.message[:200],
                    },
                )
            else:
                self._metrics.placement_actions.labels(action).inc()

        async with trio.open_nursery() as nursery:
            for model, url in pairs:
                if url in self._pool.channels:  # not one that left meanwhile
                    nursery.start_soon(one, model, url)
        return failed
