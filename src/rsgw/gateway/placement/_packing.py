"""lpt_packing's I/O shell: startup, the repack loop, compaction, the operator handshake.

The decisions are pure (`rsgw.scheduling.placement._packer`, `_assignment`, `_fill`); this
module feeds them and carries out what they decide:

* `start` (before the prober's first round): wait for the fleet and check it
  (`_preconditions`), then the `startup` repack, so the first request already has a
  placement.
* Every prober round with a ready worker polls ModelControlStatus once
  (`MetaPoller`); the answers reach the repack loop through a mailbox of capacity
  one that keeps the latest poll (a slow compaction never queues stale polls). The
  loop runs the packer's tick, installs a new assignment in the scheduler, logs the
  `lpt_packing: repack` line and its warnings, and fans out CompactMemory when the
  cadence says so.
* An operator repack (`request_repack`) asks the packer, wakes the prober so the
  tick comes now rather than at the end of the interval, and waits on the ticks until
  the packer marks the request served.

Everything the request path reads is swapped by reference in one synchronous step,
so a request sees either the old assignment and counters or the new ones.

With coordination (`rsgw.coordination`, several gateways in front of the same
workers), only the elected placer repacks, loads, unloads and compacts; the others
`follow` the placement it publishes. The `Coordination` hooks say which this is.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

import trio
from google.protobuf.message import DecodeError

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.gateway.fleet._meta_poll import MetaPoller
from rsgw.gateway.fleet._pool import WorkerPool, fan_out
from rsgw.gateway.fleet._prober import Prober
from rsgw.gateway.observe._collectors import PackingView
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.gateway.placement._cold_starts import ColdStarts
from rsgw.gateway.placement._latest import Latest
from rsgw.gateway.placement._preconditions import NO_CONTROL_PLANE, await_fleet
from rsgw.gateway.placement._repack_log import log_repack, log_settings
from rsgw.gateway.placement._repository_placer import RepositoryPlacer
from rsgw.scheduling.calls._meta import RoutingMeta, RoutingMetaTracker, WorkerCounters
from rsgw.scheduling.fleet._capabilities import Capability
from rsgw.scheduling.knobs._settings import SchedulingConfig
from rsgw.scheduling.placement._lpt import LptScheduler
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._reports import (
    CompactionPlan,
    PollSummary,
    RepackReport,
    RepackWait,
    summarize_poll,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from rsgw.gateway.placement._coordinator import Coordinator

logger = logging.getLogger(__name__)

#: Deadline of each compaction call: reloading weights can take a while.
COMPACTION_DEADLINE = 60.0


class Polls:
    """The prober rounds' polls on their way to the repack loop, the newest kept.

    Built before the metadata poller, which posts each round's answers here (`post` is
    its `on_poll`), and before the packing shell, whose loop takes them (`take`): so
    neither needs the other to exist first.
    """

    def __init__(self) -> None:
        self._latest: Latest[tuple[PollSummary, frozenset[str]]] = Latest()

    def post(
        self, polled: Mapping[str, WorkerCounters], meta: RoutingMeta, ready: frozenset[str]
    ) -> None:
        """A prober round's poll (from `MetaPoller`): post it for the loop, latest wins."""
        summary = summarize_poll(polled, fleet_compute=meta.fleet_compute_seconds)
        self._latest.post((summary, ready))

    async def take(self) -> tuple[PollSummary, frozenset[str]]:
        return await self._latest.take()


class Packing:
    """lpt_packing's shell around the packer and the scheduler; see the module docstring."""

    def __init__(
        self,
        scheduler: LptScheduler,
        pool: WorkerPool,
        prober: Prober,
        metrics: GatewayMetrics,
        tracker: RoutingMetaTracker,
        *,
        poller: MetaPoller,
        polls: Polls,
        startup_wait: float,
        repository: RepositoryConfig | None = None,
        coordinate: Callable[[Packing], Coordinator] | None = None,
        on_loading: Callable[[str], None] = lambda url: None,
    ) -> None:
        self.scheduler = scheduler
        #: Carries out placements on workers placed by loading and unloading models.
        self.placer = RepositoryPlacer(
            repository or RepositoryConfig(),
            scheduler,
            pool,
            prober,
            metrics,
            poller.weight_of,
            on_loading,
        )
        #: The metadata poller (it posts to `polls`), which reads the workers placed by
        #: load and unload at start-up too.
        self.poller = poller
        self.packer = scheduler.packer
        self._pool = pool
        self._prober = prober
        self._metrics = metrics
        self._tracker = tracker
        self._startup_wait = startup_wait
        self._polls = polls
        self._ticked = trio.Event()
        #: Models and (model, worker) pairs ever placed, so unplaced ones export 0.
        self._exported_models: frozenset[str] = frozenset()
        self._exported_pairs: frozenset[tuple[str, str]] = frozenset()
        self._repacks = metrics.track_packing(self.metrics_view)
        metrics.track_inflight_work(lambda: str(scheduler.knobs.work_basis), scheduler.loads)
        #: Bumped by every accepted runtime knob change; 0 = as configured.
        self.generation = 0
        #: The startup repack has run: a worker joining from now on is placed by a
        #: repack of its own (`Members`), one joining before by that one.
        self.started = False
        #: Several gateways, one placer (None: this gateway places alone). The
        #: coordinator drives the packing it belongs to (`follow`, `request_repack_now`),
        #: so the packing builds it, through the factory it is given.
        self.coordination = None if coordinate is None else coordinate(self)
        #: The placement another gateway published, while this one follows it.
        self._followed: Mapping[str, Placement] | None = None
        #: The cold path: a handed model loaded nowhere is loaded when a call asks.
        self.cold = ColdStarts(
            self.placer,
            self.packer,
            prober.discovery,
            metrics,
            may_place=lambda: self.coordination is None or self.coordination.may_place(),
            ask=None if self.coordination is None else self.coordination.ask_load,
        )
        metrics.track_residency(self._residency_bytes)

    @property
    def knobs(self) -> SchedulingConfig:
        return self.scheduler.knobs

    def holders(self, model: str) -> tuple[str, ...]:
        """The workers `model` is routed to by placement; every worker if unplaced."""
        placed = self.scheduler.routing.get(model)
        return placed.urls if placed is not None else self._pool.urls

    def retune(self, knobs: SchedulingConfig) -> int:
        """Put a new knob set in force (the control plane); returns the new generation.

        In memory only: a restart reverts to gateway.yml.
        """
        self.scheduler.knobs = knobs
        self.generation += 1
        return self.generation

    # -- startup ------------------------------------------------------------------------

    async def start(self) -> None:
        """Wait for the fleet, check it, and run the `startup` repack.

        Raises:
            StartupError: the fleet does not meet the preconditions.
            GatewayWedged: every startup poll hung for `wedge_rounds` rounds.
        """
        await self._start()
        self.started = True

    async def _start(self) -> None:
        answers, lacking = await await_fleet(
            self._pool,
            self._prober,
            wait_seconds=self._startup_wait,
            wedge_rounds=self._prober.wedge_rounds,
        )
        polled, placeable = dict(answers), dict(answers)
        if lacking:  # some may be placed by load and unload
            others, loadable = await self.poller.read(lacking)
            polled.update(others)
            placeable.update(loadable)
        self._log_unplaced(lacking, placeable)
        if self.placer.handed:  # the placement's loads are of what is not loaded yet
            await self._prober.discovery.refresh()
        meta = self._tracker.refresh(polled)
        self.scheduler.meta_refreshed(meta)
        summary = self._with_residency(
            summarize_poll(placeable, fleet_compute=meta.fleet_compute_seconds)
        )
        knobs = self.knobs
        log_settings(knobs, len(self._pool.urls))
        self.scheduler.polled(summary)
        report = self.packer.repack(summary, knobs, trio.current_time(), "startup")
        coordination = self.coordination
        if coordination is not None and not coordination.may_place():
            # Another gateway places (or the election is not over): route by the placer's
            # placement if it has arrived, else by this one until it does; move nothing.
            if not self._followed:
                self.placer.follow(report.assignment)
                self._export(report.assignment)
            return
        self._installed(report, knobs)

    def _with_residency(self, poll: PollSummary) -> PollSummary:
        """`poll` with what the budgeted workers hold, so the repack fits their budgets."""
        if not self.placer.handed:
            return poll
        now = trio.current_time()
        facts = self.placer.synced().facts(self.packer.demand(now), now, self.packer.recency)
        return dataclasses.replace(poll, residency=facts) if facts.workers else poll

    def _residency_bytes(self) -> Mapping[str, tuple[int, int]]:
        ledger = self.placer.ledger
        return {url: (ledger.used(url), ledger.budget(url)) for url in self._pool.urls}

    def _log_unplaced(self, lacking: Sequence[str], placeable: Mapping[str, object]) -> None:
        """Say which workers without the control plane are placed by load and unload,
        and which are not placed at all, and why."""
        label = self._pool.label
        loaded = [url for url in lacking if url in placeable]
        if loaded:
            logger.info(
                "lpt_packing: placing these workers' models by loading and unloading them",
                extra={
                    "workers": [label(u) for u in loaded],
                    "models": sorted(self.placer.handed),
                },
            )
        unplaced = [url for url in lacking if url not in placeable]
        if unplaced:
            table = self._prober.capabilities.table
            missing = sorted(
                {
                    str(capability)
                    for url in unplaced
                    for capability in (Capability.REPOSITORY_INDEX, Capability.MODEL_CONTROL)
                    if not table.of(url).implements(capability)
                }
            )
            if not self.placer.handed:
                missing.append("repository.models is empty")
            logger.warning(
                NO_CONTROL_PLANE,
                extra={
                    "workers": [label(u) for u in unplaced],
                    "lacking": [str(Capability.CONTROL_PLANE), *missing],
                },
            )

    # -- the repack loop ----------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The repack loop: one tick per posted poll, until cancelled.

        Compactions run beside the loop (a worker reloading weights can take a while),
        so ticks, and the operator repacks waiting on them, never queue behind one.
        """
        async with trio.open_nursery() as compactions:
            await compactions.start(self.placer.serve)
            await compactions.start(self.cold.serve)
            task_status.started()
            while True:
                mail = await self._polls.take()
                try:
                    compaction = self.tick(*mail)
                except Exception:  # a bug in one tick must not stop packing
                    logger.exception("lpt_packing tick failed; keeping the placement in force")
                    self._metrics.repack_failures.labels("tick").inc()
                    continue
                if compaction is not None:
                    compactions.start_soon(self._compact, compaction)

    def tick(self, poll: PollSummary, ready: frozenset[str]) -> CompactionPlan | None:
        """Run one tick (synchronously: requests see all of it or none of it).

        Waiters on the operator handshake are woken even if the tick fails, so a bug
        costs them their repack, not their whole wait.
        """
        try:
            knobs = self.knobs
            coordination = self.coordination
            if coordination is not None and not coordination.may_place():
                if self._followed is not None:  # routing takes in the placer's loads
                    self.placer.follow(self._followed)
                self.packer.learn(poll.workers)  # its calls count as demand, for the placer
                self.scheduler.polled(poll)
                return None
            if coordination is not None:
                coordination.before_tick()
            poll = self._with_residency(poll)
            outcome = self.packer.tick(poll, knobs, sorted(ready), trio.current_time())
            if outcome.repack is not None:
                self._installed(outcome.repack, knobs)
            self.scheduler.polled(poll)
            return outcome.compaction
        finally:
            ticked, self._ticked = self._ticked, trio.Event()
            ticked.set()

    def follow(self, assignment: Mapping[str, Placement]) -> None:
        """Route by a placement another gateway published (coordination): this gateway
        repacks, loads and unloads nothing while it follows, but should it become the
        placer, it starts from this placement."""
        self._followed = assignment
        self.packer.adopt(assignment)
        self.packer.learn(assignment)  # calls for its models count as demand from now on
        self.placer.follow(assignment)
        self._export(assignment)

    def _export(self, assignment: Mapping[str, Placement]) -> None:
        self._exported_models |= set(assignment)
        self._exported_pairs |= {
            (model, url) for model, placement in assignment.items() for url in placement.urls
        }

    def _installed(self, report: RepackReport, knobs: SchedulingConfig) -> None:
        """A repack ran: put its assignment in force, export it, and say so."""
        self._followed = None
        reason = report.trigger if report.trigger in ("operator", "startup") else "repack"
        self.placer.place(report.assignment, reason)
        if self.coordination is not None:
            self.coordination.placed(report)
        self._export(report.assignment)
        self._repacks.labels(report.trigger).inc()
        log_repack(report, self._pool.label)

    async def _compact(self, plan: CompactionPlan) -> None:
        """CompactMemory on each changed worker, concurrently (docs/original.md §4.6.5)."""
        able = self._prober.capabilities.table.able(self._pool.urls, Method.COMPACT_MEMORY)
        workers = [url for url in plan.reloads if url in able]  # not departed or Triton ones
        deadline = trio.current_time() + COMPACTION_DEADLINE

        async def one(url: str) -> int:
            request = cpb.CompactMemoryRequest(reload_models=plan.reloads[url])
            reply = await self._pool.channels[url].unary(
                Method.COMPACT_MEMORY.wire, request.SerializeToString(), deadline=deadline
            )
            try:
                return cpb.CompactMemoryResponse.FromString(reply).reloaded_models
            except DecodeError as exc:  # that worker's failure, as a bad status would be
                raise GrpcError(
                    StatusCode.INTERNAL, f"malformed CompactMemoryResponse: {exc}"
                ) from exc

        results = await fan_out(
            workers, one, lambda url, s: self._metrics.observe_worker("CompactMemory", url, s)
        )
        failed = [self._pool.label(u) for u, r in results.items() if isinstance(r, Exception)]
        if failed:
            self._metrics.repack_failures.labels("compaction").inc(len(failed))
        logger.info(
            "lpt_packing: compaction",
            extra={
                "mode": str(plan.mode),
                "workers": len(workers) - len(failed),
                "reloaded": sum(r for r in results.values() if isinstance(r, int)),
                "failed": failed,
            },
        )

    # -- the operator handshake ------------------------------------------------------------

    async def request_repack(self, wait_seconds: float) -> RepackWait:
        """Ask for a repack on the next tick and wait up to `wait_seconds` for it.

        The prober is woken so the tick comes now. A request made before the first
        tick waits for that tick (docs/product.md §3.12). Where models are placed by
        load and unload, it is served once the loads and unloads are done too.
        """
        sequence = self.packer.request_repack()
        self._prober.wake()
        started = trio.current_time()
        carried = False
        if wait_seconds > 0:
            with trio.move_on_after(wait_seconds):
                while self.packer.repack_completed < sequence:
                    await self._ticked.wait()
                # Models placed by load and unload: served once they are where placed.
                await self.placer.wait_carried(self.placer.posted)
                carried = True
        completed = self.packer.repack_completed
        done = completed >= sequence and (carried or not self.placer.handed)
        return RepackWait(sequence, completed, done, trio.current_time() - started)

    def load_on_demand(self, model: str) -> None:
        """Another gateway's call asked for `model`, cold (coordination): load it."""
        self.cold.request(model)

    def request_repack_now(self) -> None:
        """Ask for a repack on the next tick without waiting for it (a worker joined
        or left: the placement should take it in, or stop counting on it)."""
        self.packer.request_repack()
        self._prober.wake()

    def forget(self, url: str) -> None:
        """`url` left the fleet: its placement series go once no placement names it."""
        self._exported_pairs = frozenset(p for p in self._exported_pairs if p[1] != url)

    # -- metrics ------------------------------------------------------------------------

    def metrics_view(self) -> PackingView:
        """The live state for `/metrics`; unplaced but once-exported entries read 0."""
        assignment = self.packer.assignment
        report = self.packer.last_report
        replicas = dict.fromkeys(self._exported_models, 0)
        weights = dict.fromkeys(self._exported_pairs, 0.0)
        outstanding = dict.fromkeys(self._exported_pairs, 0)
        for model, placement in assignment.items():
            replicas[model] = len(placement)
            for url, weight in placement:
                weights[(model, url)] = weight
        outstanding.update(self.scheduler.router.outstanding())
        quantum = dict.fromkeys(self._exported_models, 0)
        quantum.update((m, p.quantum) for m, p in self.scheduler.plans.items())
        utilization = dict.fromkeys(self._exported_models, 0.0)
        if report is not None:
            utilization.update(report.utilization)
        return PackingView(
            replicas=MappingProxyType(replicas),
            placement_weight=MappingProxyType(weights),
            outstanding=MappingProxyType(outstanding),
            routed=self.scheduler.router.routed(),
            fill_quantum=MappingProxyType(quantum),
            utilization=MappingProxyType(utilization),
        )
