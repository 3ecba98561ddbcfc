"""Loading a handed model when a call asks for it: the cold path (issue 49).

With more handed models than the workers' budgets hold, some are loaded nowhere
(cold). A call for one is held here while the gateway loads it: where the pure
planner says (`rsgw.scheduling.placement._residency.plan_cold_load`: the worker where
making room gives up least value, evicting the least valuable copies per byte, never
one with calls in flight, one within its minimum residency or one at its
`min_copies`), room first (drained, unloaded), then the load, under the worker's
room lock so no other load takes the room meanwhile. Then the call is served.

* Single-flight: the calls that find the model cold while its load runs wait for that
  load, whoever began it (this path, or the placer carrying out a repack).
* The wait counts against the call's deadline. A call whose deadline is shorter than
  the model's expected load (learned from its loads, else `repository.load_seconds`)
  is refused at once, UNAVAILABLE, naming the model and the expected wait: holding it
  would only make it fail later, having cost a load.
* When no worker can make room now (every copy busy or young) the call waits for the
  ledger to change, within its deadline; when none ever could (the model is larger
  than any budget, or the rest are at their floors) it is refused with the reason.
* With several gateways (coordination), a gateway that does not place asks the
  placer to load (`ask`), and its calls wait for the model to appear in its routing
  table: a model is loaded once, by the placer.

The load runs in this part's own nursery, not in the calling task, so a caller that
gives up (deadline, disconnect) never leaves a load half done.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.scheduling.placement._residency import (
    ColdLoad,
    NoRoom,
    first_for_room,
    plan_cold_load,
)

if TYPE_CHECKING:
    from rsgw.gateway.fleet._model_discovery import ModelDiscovery
    from rsgw.gateway.observe._metrics import GatewayMetrics
    from rsgw.gateway.placement._repository_placer import RepositoryPlacer
    from rsgw.scheduling.placement._packer import Packer

logger = logging.getLogger(__name__)

#: How often a gateway that does not place looks for a model the placer loads.
FOLLOWER_POLL_SECONDS = 0.05
#: How often a cold model waiting for room looks again, if nothing signals sooner.
ROOM_RETRY_SECONDS = 0.05


class ColdStarts:
    """The cold path of one gateway; see the module docstring.

    Args:
        placer: loads, unloads and the memory ledger.
        packer: the demand (arrival rates) residency values copies by.
        discovery: the routing table a warm model is found in.
        may_place: whether this gateway places now (coordination: the placer only).
        ask: how a gateway that does not place asks the placer to load a model.
    """

    def __init__(
        self,
        placer: RepositoryPlacer,
        packer: Packer,
        discovery: ModelDiscovery,
        metrics: GatewayMetrics,
        *,
        may_place: Callable[[], bool] = lambda: True,
        ask: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._placer = placer
        self._packer = packer
        self._discovery = discovery
        self._metrics = metrics
        self._may_place = may_place
        self._ask = ask
        #: Cold models with calls waiting here -> how many, in the order they began
        #: waiting (room goes to the one most in demand whose load has not begun,
        #: the first of them among equals).
        self._waiting: dict[str, int] = {}
        #: model -> when its first waiting call began to wait (while any waits).
        self._waiting_since: dict[str, float] = {}
        #: model -> set when the cold load this gateway began for it ends.
        self._warming: dict[str, trio.Event] = {}
        #: model -> (when, worker) of its last cold load that failed (bounded by the
        #: handed models), so its waiters are told rather than load it again at once.
        self._failures: dict[str, tuple[float, str]] = {}
        self._nursery: trio.Nursery | None = None

    def handed(self, model: str) -> bool:
        return model in self._placer.handed

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery cold loads run in, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def request(self, model: str) -> None:
        """Load `model` if it is cold, with no call waiting here (another gateway's
        call asked the placer for it); a name that is not handed is ignored."""
        if self.handed(model) and self._nursery is not None:
            self._nursery.start_soon(self._warm_for_another, model)

    async def _warm_for_another(self, model: str) -> None:
        try:
            await self.warm(model, math.inf)
        except GrpcError as exc:
            logger.warning(
                "cold start: another gateway's call asked for a model that could not be loaded",
                extra={"model": model, "said": exc.message},
            )

    async def warm(self, model: str, deadline: float) -> None:
        """Return once `model` has a ready replica in the routing table.

        Raises:
            GrpcError: UNAVAILABLE, refused (the deadline cannot cover the load, or no
                worker can make room); DEADLINE_EXCEEDED, the deadline passed waiting.
        """
        started = trio.current_time()
        # A call without a deadline (a stream, a metadata call) waits no longer than a
        # load may take.
        deadline = min(deadline, started + self._placer.load_timeout_seconds)
        ledger = self._placer.ledger
        expected = ledger.expected_load(model)
        if expected > 0 and deadline - started < expected:
            self._metrics.cold_starts.labels("refused").inc()
            raise GrpcError(
                StatusCode.UNAVAILABLE,
                f"model '{model}' is not loaded on any worker; loading it takes about "
                f"{expected:.1f} s, more than the {max(deadline - started, 0):.1f} s the "
                "call's deadline leaves; retry with a longer deadline",
            )
        self._waiting[model] = self._waiting.get(model, 0) + 1
        self._waiting_since.setdefault(model, started)
        try:
            await self._warm(model, started, deadline)
        finally:
            self._waiting[model] -= 1  # in place: the model keeps its turn
            if not self._waiting[model]:
                del self._waiting[model]
                del self._waiting_since[model]

    async def _warm(self, model: str, started: float, deadline: float) -> None:
        asked = alone = False
        with trio.move_on_at(deadline):
            while not self._discovery.table.replicas(model):
                if self._ask is not None and not alone and not self._may_place():
                    if not asked:
                        asked = True
                        alone = not await self._asked(model)
                        continue
                    await trio.sleep(FOLLOWER_POLL_SECONDS)
                    await self._discovery.refresh()
                    continue
                await self._wait_for_load(model)
                failed = self._failures.get(model)
                if failed is not None and failed[0] >= started:
                    self._metrics.cold_starts.labels("refused").inc()
                    raise GrpcError(
                        StatusCode.UNAVAILABLE,
                        f"model '{model}' is not loaded on any worker, and loading it on "
                        f"{failed[1]} failed (the gateway's log says why)",
                    )
            waited = trio.current_time() - started
            self._metrics.cold_starts.labels("served").inc()
            self._metrics.cold_start_wait.observe(waited)
            return
        self._metrics.cold_starts.labels("refused").inc()
        raise GrpcError(
            StatusCode.DEADLINE_EXCEEDED,
            f"model '{model}' was still being loaded when the call's deadline passed "
            f"(waited {trio.current_time() - started:.1f} s)",
        )

    async def _asked(self, model: str) -> bool:
        """Ask the placer to load `model`; False (load it here) if it cannot be asked."""
        assert self._ask is not None
        try:
            await self._ask(model)
        except Exception as exc:  # etcd away: a call is better served by a load here
            logger.warning(
                "cold start: the placer could not be asked to load a model; loading it here",
                extra={"model": model, "said": str(exc)[:200]},
            )
            return False
        return True

    async def _wait_for_load(self, model: str) -> None:
        """Wait for one load of `model` to end (beginning it if none runs), or for room
        to appear; the caller looks at the routing table again.

        Cold models waiting for room take turns (`first_for_room`): by demand, then
        first come, first served, but a model waiting for long goes first. A hot model
        that went cold is loaded before the tail's (its calls are most of those
        waiting), and no call is passed over again and again while others get room.
        """
        ledger = self._placer.ledger
        under_way = self._warming.get(model)
        if under_way is None:
            under_way = ledger.load_under_way(model)
        if under_way is not None:
            await under_way.wait()
            return
        waiting = [
            m for m in self._waiting if m not in self._warming and ledger.load_under_way(m) is None
        ]
        now = trio.current_time()
        demand = self._packer.demand(now)
        since, expected = self._waiting_since, ledger.expected_load
        first = first_for_room(waiting, demand, since, expected, now) if waiting else model
        plan = self.plan(model) if first == model else None
        if isinstance(plan, ColdLoad):
            await self._begin(plan).wait()
            return
        if isinstance(plan, NoRoom) and not plan.may_wait:
            self._metrics.cold_starts.labels("refused").inc()
            raise GrpcError(
                StatusCode.UNAVAILABLE,
                f"model '{model}' is not loaded on any worker and cannot be: {plan.reason}",
            )
        # Room comes when a load or unload ends (the ledger changes), when a copy
        # comes of age or its last call is answered (nothing changes): look again soon.
        with trio.move_on_after(ROOM_RETRY_SECONDS):
            await ledger.changed.wait()

    def plan(self, model: str) -> ColdLoad | NoRoom:
        """Where `model` would be loaded now, and what evicted there first."""
        placer = self._placer
        ledger = placer.synced()
        now = trio.current_time()
        return plan_cold_load(
            model,
            ledger.weight(model),
            ledger.memory(placer.in_flight),
            ledger.terms(self._packer.demand(now), self._packer.recency),
            now,
            placer.min_residency_seconds,
            by_recency=ledger.by_recency,
        )

    def _begin(self, plan: ColdLoad) -> trio.Event:
        done = self._warming[plan.model] = trio.Event()
        assert self._nursery is not None, "ColdStarts.serve runs before calls arrive"
        self._nursery.start_soon(self._load, plan, done)
        return done

    async def _load(self, plan: ColdLoad, done: trio.Event) -> None:
        placer = self._placer
        ledger = placer.ledger
        model, url = plan.model, plan.url
        try:
            async with ledger.room(url):
                # What the worker holds now, not at the last probe round: someone may
                # have loaded or unloaded behind the gateway's back.
                await self._discovery.rediscover()
                placer.synced()
                evicted = [(m, url) for m in plan.evict]
                failed = await placer.evict(evicted, "eviction")
                if failed or not ledger.begin_load(model, url):
                    return  # the waiters plan again from what is there now
            loaded = not await placer.act(Method.REPOSITORY_MODEL_LOAD, ((model, url),), "demand")
            await self._discovery.rediscover()
            if not loaded:
                self._failures[model] = (trio.current_time(), placer.label(url))
            else:
                self._failures.pop(model, None)
                placer.route_with(model, url)
                logger.info(
                    "cold start: model loaded on demand",
                    extra={
                        "model": model,
                        "worker": placer.label(url),
                        "evicted": list(plan.evict),
                        "load_seconds": round(ledger.expected_load(model), 3),
                    },
                )
        except Exception:  # a bug must not stop the cold path: its waiters plan again
            logger.exception("cold start: loading a model on demand failed", extra={"model": model})
        finally:
            del self._warming[model]
            done.set()
