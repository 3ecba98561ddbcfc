"""The simulated gateway: its decisions on the request path and at each prober round.

What decides is the production code, called as the gateway calls it: the scheduler of
the mode (`RoundRobinScheduler`, `LeastOutstandingScheduler`, `LptScheduler` with its
`Packer`), the `Ledger` that admits calls and holds each worker's share,
deadline-aware admission (`rsgw.scheduling.calls._forecast`: the same forecast and rule
refuse at arrival what would not finish in time), the `RoutingMetaTracker` and
`summarize_poll` the prober feeds; under `--eviction`, the cold path and the placer
(`_cold`); with a `tenancy:` block, priority bands, fair shares and quotas
(`_tenants`, issue 52). The engine (`_engine`) drives it through events.

Pure: no Trio, no clock (the engine passes `now`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping

from rsgw.config._config import GatewayConfig
from rsgw.scheduling.calls._forecast import (
    INITIAL_SLOT_SECONDS,
    SLOT_ALPHA,
    AdmissionRule,
    Forecast,
    wait_for_slot,
)
from rsgw.scheduling.calls._ledger import Ledger, Ticket
from rsgw.scheduling.calls._meta import ModelCounters, RoutingMetaTracker, WorkerCounters
from rsgw.scheduling.calls._routing import RoutingTable, build_routing_table
from rsgw.scheduling.calls._schedulers import (
    AnyReservation,
    LeastOutstandingScheduler,
    RoundRobinScheduler,
    Scheduler,
)
from rsgw.scheduling.knobs._knobs import SchedulingMode, WorkBasis
from rsgw.scheduling.knobs._settings import SchedulingConfig
from rsgw.scheduling.placement._demand import DecayedDemand
from rsgw.scheduling.placement._lpt import LptScheduler
from rsgw.scheduling.placement._packer import Packer
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._reports import summarize_poll
from rsgw.simulate._cold import ColdPath, Hooks
from rsgw.simulate._device import SimCall, SimDevice
from rsgw.simulate._results import OK
from rsgw.simulate._tenants import DEADLINE, SimTenancy

SHED = "RESOURCE_EXHAUSTED"
ADMITTED = "admitted"
WAITING = "waiting"


def packer_knobs(knobs: SchedulingConfig) -> SchedulingConfig:
    """The knobs the packer ticks with: the EMA halflife resolved once, at start-up, as
    the gateway resolves it."""
    return dataclasses.replace(knobs, ema_halflife_compute_seconds=knobs.resolved_ema_halflife)


class SimGateway:
    """The gateway's decisions on the request path and at each prober round.

    Args:
        config: the gateway.yml of the run, parsed by the gateway's own parser.
        devices: the simulated workers, by address.
    """

    def __init__(self, config: GatewayConfig, devices: Mapping[str, SimDevice]) -> None:
        knobs = config.scheduling
        self.config = config
        self.devices = devices
        self.urls = tuple(devices)
        self.tracker = RoutingMetaTracker(knobs.routing_meta_halflife)
        self.packer: Packer | None = None
        self.scheduler: Scheduler
        #: The cold path, under `--eviction` (`attach`); None: every model everywhere.
        self.cold: ColdPath | None = None
        if knobs.mode is SchedulingMode.ROUND_ROBIN:
            self.scheduler = RoundRobinScheduler()
        elif knobs.mode is SchedulingMode.LPT_PACKING:
            self.knobs = packer_knobs(knobs)
            # As `rsgw.gateway._parts.choose_policy` builds it for the handed models.
            lru = config.repository.eviction == "lru"
            halflife = config.repository.demand_halflife_seconds
            handed = bool(config.repository.models)
            demand = DecayedDemand(halflife) if handed else None
            self.packer = Packer(track_recency=lru, demand=demand)
            self.scheduler = LptScheduler(self.knobs, self.packer)
        else:
            self.scheduler = LeastOutstandingScheduler(WorkBasis(knobs.work_basis))
        # Under --eviction nothing is loaded until the start-up's placement loads it.
        loads = bool(config.repository.models)
        served = {url: [] if loads else list(d.specs) for url, d in devices.items()}
        self.replicas: dict[str, tuple[str, ...]] = {}
        self.table_swapped(build_routing_table(served, self.urls, 1))
        cap = config.grpc.max_concurrent_requests_per_worker
        self.ledger: Ledger[AnyReservation] = Ledger(
            config.max_concurrent_requests, cap, self.scheduler.release
        )
        #: Calls waiting for a slot: the cap was full when they came.
        self.waiting: deque[SimCall] = deque()
        self.repacks: list[tuple[float, str]] = []
        #: Deadline-aware admission, as `rsgw.gateway.calls._admission` and `_infer` apply it.
        self.forecast = Forecast()
        self.rule = AdmissionRule(config.grpc.max_queue_seconds)
        #: Seconds an admitted call holds its slot (`AdmissionQueue.service_seconds`).
        self.slot_seconds = INITIAL_SLOT_SECONDS
        #: Tenants, priorities and quotas, when `tenancy:` asks for any (else None).
        self.tenancy = SimTenancy(config.tenancy) if config.tenancy.enabled else None

    def attach(self, hooks: Hooks) -> None:
        """Under --eviction: the cold path, on the engine's events (`hooks`)."""
        if self.config.repository.models and isinstance(self.scheduler, LptScheduler):
            self.cold = ColdPath(
                self.config.repository,
                self.scheduler,
                self.urls,
                lambda url: self.devices[url].ready,
                hooks,
                self.config.worker_client.request_timeout_seconds,
            )

    def table_swapped(self, table: RoutingTable) -> None:
        """A new routing table (a discovery): the replicas every call is routed among."""
        self.replicas = {model: table.replicas(model) for model in table.models}
        self.scheduler.table_swapped(table)

    # -- prober ------------------------------------------------------------------

    def poll(self) -> dict[str, WorkerCounters]:
        """Every worker's ModelControlStatus answer, from its counters; under --eviction
        its ModelStatistics, which lists only the models not unloaded there (an evicted
        model's compute leaves the fleet's total until it is loaded again)."""
        answers = {}
        for url, device in self.devices.items():
            listed = device.specs if self.cold is None else device.ready
            models = {
                m: ModelCounters(
                    total_compute_seconds=c[0],
                    requests_served=int(c[1]),
                    rows_served=int(c[2]),
                    max_batch_size=device.specs[m].max_batch_size,
                    batch_input_name="INPUT0",
                    batch_axis=1,
                    weight_nbytes=device.specs[m].weight_bytes,
                )
                for m, c in device.per_model.items()
                if m in listed
            }
            answers[url] = WorkerCounters(
                models, device.weight_cache_bytes, device.discipline.value
            )
        return answers

    def placeable(self, polled: Mapping[str, WorkerCounters]) -> dict[str, WorkerCounters]:
        """As `MetaPoller._placeable`: each worker's counters as the packer takes them,
        every handed model its repository has (zeros for one not loaded), weighed as
        configured, against its budget."""
        cold = self.cold
        if cold is None:
            return dict(polled)
        ledger = cold.ledger
        return {
            url: WorkerCounters(
                {
                    m: dataclasses.replace(
                        counters.models.get(m, ModelCounters()), weight_nbytes=ledger.weight(m)
                    )
                    for m in sorted(ledger.handed)
                },
                ledger.budget(url),
                counters.discipline,
            )
            for url, counters in polled.items()
        }

    def tick(self, now: float, startup: bool = False) -> None:
        """One prober round: metadata, and under lpt_packing the packer's tick."""
        if isinstance(self.scheduler, RoundRobinScheduler):
            return
        cold = self.cold
        if cold is not None:
            cold.discover()  # the round's discovery, before its poll
        answers = self.poll()
        meta = self.tracker.refresh(answers)
        self.scheduler.meta_refreshed(meta)
        if self.packer is None or not isinstance(self.scheduler, LptScheduler):
            return
        placeable = self.placeable(answers)
        summary = summarize_poll(placeable, fleet_compute=meta.fleet_compute_seconds)
        if cold is not None:  # the repack is cut to what the budgets hold
            summary = dataclasses.replace(summary, residency=cold.facts(now))
        if startup:
            self.scheduler.polled(summary)
            report = self.packer.repack(summary, self.knobs, now, "startup")
            self._place(report.assignment, "startup", now)
            self.repacks.append((now, "startup"))
            return
        outcome = self.packer.tick(summary, self.knobs, sorted(self.urls), now)
        if outcome.repack is not None:
            trigger = outcome.repack.trigger
            self._place(outcome.repack.assignment, "repack", now)
            self.repacks.append((now, trigger))
        self.scheduler.polled(summary)
        if outcome.compaction is not None and cold is None:  # Triton has no CompactMemory
            for url in outcome.compaction.reloads:  # reloads are empty under eager
                self.devices[url].compact()

    def _place(self, assignment: Mapping[str, Placement], reason: str, now: float) -> None:
        assert isinstance(self.scheduler, LptScheduler)
        if self.cold is None:
            self.scheduler.install(assignment)
        else:  # carried out by load and unload
            self.cold.moves.place(assignment, reason, now)

    # -- request path --------------------------------------------------------------

    def admit(self, call: SimCall, now: float) -> str:
        """ADMITTED (a slot now), WAITING (in the FIFO for one) or SHED (it would not
        finish in time: refused at arrival), as `Admission.queue_for_slot` decides."""
        if self.tenancy is not None:
            call.band = self.tenancy.band(call)
        if not self.waiting:
            ticket = self.ledger.admit()
            if ticket is not None:
                self.scheduler.arrived(call.model)
                call.ticket = ticket
                return ADMITTED
        cap = self.ledger.max_inflight
        per_call = self.forecast.typical()
        wait = wait_for_slot(len(self.waiting), cap, self.slot_seconds, per_call) if cap else 0.0
        if self.rule.judge(wait, per_call, call.deadline - now) is not None:
            return SHED
        self.waiting.append(call)
        return WAITING

    def route(
        self, call: SimCall, bodies: Mapping[tuple[str, int], bytes], now: float
    ) -> SimDevice | None:
        """The worker an admitted call goes to, or None (over its tenant's quota, shed at
        its replicas, refused there as it would not finish in time or to keep places for
        others: `call.refused` says which)."""
        ticket = call.ticket
        assert isinstance(ticket, Ticket)
        tenancy = self.tenancy
        if tenancy is not None and not call.seated:  # its tenant's quota, as `Tenancy.seat`
            call.refused = tenancy.seat(call, now)
            if call.refused:
                return None
        free = self.ledger.with_room(self.replicas.get(call.model, ()))
        order: tuple[str, ...] = ()
        reservation = None
        if free:
            body = bodies[(call.model, call.rows)]
            order, reservation = self.scheduler.select(call.model, free, body)
        self.ledger.reserve(ticket, reservation)
        if not order:
            return None
        per_call = self.forecast.per_call(order[0])
        held = self.ledger.held(order[0]) if per_call else 0
        if held:
            wait = held * per_call
            if self.rule.judge(wait, per_call, call.deadline - now) is not None:
                call.refused = DEADLINE
                return None
        if tenancy is not None:  # who goes first at a full worker, as `_take_place`
            held = self.ledger.held(order[0])
            call.refused = tenancy.place(call, order[0], per_call, held, self.rule, now)
            if call.refused:
                return None
        call.routed, call.position = now, self.ledger.hold(ticket, order[0])
        if call.position == 1:
            self.forecast.busy_from(order[0], now)
        return self.devices[order[0]]

    def close(self, call: SimCall, now: float) -> SimCall | None:
        """The gateway is done with `call`: its slot goes to the first waiting call that
        has not given up, if any (returned, read now, to be routed)."""
        ticket = call.ticket
        if not isinstance(ticket, Ticket):
            return None
        call.ticket = None
        if self.tenancy is not None:
            self.tenancy.release(call)
        if self.cold is not None and call.worker:  # its reservation there is released
            self.cold.answered(call, now)
        if call.code == OK:
            self.forecast.answered(
                call.worker, now, self.ledger.held(call.worker), now - call.routed, call.position
            )
        if call.routed == call.routed:  # routed (not NaN): it held its slot until now
            held = now - call.routed
            self.slot_seconds += SLOT_ALPHA * (held - self.slot_seconds)
        self.ledger.close(ticket)
        while self.waiting:
            waiter = self.waiting.popleft()
            if waiter.code:
                continue  # gave up while waiting
            admitted = self.ledger.admit()
            if admitted is None:
                self.waiting.appendleft(waiter)
                return None
            self.scheduler.arrived(waiter.model)
            waiter.ticket = admitted
            return waiter
        return None
