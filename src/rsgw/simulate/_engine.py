"""A fleet in virtual time behind the gateway's own scheduling cores.

Discrete events, in time order: a call arrives (from the scenario's schedule), a
device finishes a batch, a held batch comes due, a client gives up at its deadline,
the prober ticks. What decides is the production code, called as the gateway calls
it: the scheduler of the mode (`RoundRobinScheduler`, `LeastOutstandingScheduler`,
`LptScheduler` with its `Packer`), the `Ledger` that admits calls and holds each
worker's share, deadline-aware admission (`rsgw.scheduling.calls._forecast`: the same
forecast and rule refuse at arrival what would not finish in time), the
`RoutingMetaTracker` and `summarize_poll` the prober feeds, and on the workers' side
`rsgw.simulate._device` (the worker's queues, weight cache and costs). The gateway's
settings come from the same gateway.yml bench/fleet writes, parsed by the gateway's
own parser.

What is simplified, and why it matters little for the figures: the network and the
gateway's CPU cost nothing (bench/fleet's gateway used a fifth of a core); while the
inbound cap is full, calls the rule admits wait in one FIFO (the real gateway reads
up to twice its cap and leaves the rest in its clients' HTTP/2 streams: here every
call is read); a replica is never down; compaction
frees weights at once rather than between batches.

Deterministic: the same scenario, mode, load and seed give the same figures.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from rsgw.config._config import parse_config
from rsgw.scheduling.calls._forecast import (
    INITIAL_SLOT_SECONDS,
    SLOT_ALPHA,
    AdmissionRule,
    Forecast,
    wait_for_slot,
)
from rsgw.scheduling.calls._ledger import Ledger, Ticket
from rsgw.scheduling.calls._meta import ModelCounters, RoutingMetaTracker, WorkerCounters
from rsgw.scheduling.calls._routing import build_routing_table
from rsgw.scheduling.calls._schedulers import (
    AnyReservation,
    LeastOutstandingScheduler,
    RoundRobinScheduler,
    Scheduler,
)
from rsgw.scheduling.knobs._knobs import SchedulingMode, WorkBasis
from rsgw.scheduling.knobs._settings import SchedulingConfig
from rsgw.scheduling.placement._lpt import LptScheduler
from rsgw.scheduling.placement._packer import Packer
from rsgw.scheduling.placement._reports import summarize_poll
from rsgw.simulate import _offered
from rsgw.simulate import _scenario as sc
from rsgw.simulate._device import SimCall, SimDevice
from rsgw.simulate._results import OK, Outcome, RunResult, Schedule, Snapshot, summarise
from rsgw.worker.device._batching import Discipline
from rsgw.worker.models._catalogue import parse_catalogue

MODES = ("round_robin", "least_outstanding", "lpt_packing")
SHED = "RESOURCE_EXHAUSTED"
LATE = "DEADLINE_EXCEEDED"
ADMITTED = "admitted"
WAITING = "waiting"

# Event kinds, in the order simultaneous events are handled.
_DONE, _WAKE, _TICK, _ARRIVE, _GIVE_UP = range(5)


def gateway_yaml(
    mode: str, workers: Sequence[str], settings: sc.RunSettings, admission_cap: int | None
) -> dict[str, Any]:
    """The gateway.yml of a simulated run (bench/fleet writes the same for real ones)."""
    config: dict[str, Any] = {
        "endpoints": list(workers),
        "listen": {"grpc": "127.0.0.1:0", "metrics": "127.0.0.1:0", "http": "127.0.0.1:0"},
        "scheduling": settings.gateway_scheduling(mode),
    }
    if admission_cap is not None:
        config["grpc"] = {"max_concurrent_requests_per_worker": admission_cap}
        config["worker_client"] = {"max_concurrent_streams": admission_cap}
    return config


def packer_knobs(knobs: SchedulingConfig) -> SchedulingConfig:
    """The knobs the packer ticks with: the EMA halflife resolved once, at start-up, as
    the gateway resolves it."""
    return dataclasses.replace(knobs, ema_halflife_compute_seconds=knobs.resolved_ema_halflife)


class _Gateway:
    """The gateway's decisions on the request path and at each prober round."""

    def __init__(
        self,
        mode: str,
        devices: Mapping[str, SimDevice],
        settings: sc.RunSettings,
        admission_cap: int | None,
    ) -> None:
        config = parse_config(gateway_yaml(mode, list(devices), settings, admission_cap), {})
        knobs = config.scheduling
        self.devices = devices
        self.urls = tuple(devices)
        self.tracker = RoutingMetaTracker(knobs.routing_meta_halflife)
        self.packer: Packer | None = None
        self.scheduler: Scheduler
        if knobs.mode is SchedulingMode.ROUND_ROBIN:
            self.scheduler = RoundRobinScheduler()
        elif knobs.mode is SchedulingMode.LPT_PACKING:
            self.knobs = packer_knobs(knobs)
            self.packer = Packer()
            self.scheduler = LptScheduler(self.knobs, self.packer)
        else:
            self.scheduler = LeastOutstandingScheduler(WorkBasis(knobs.work_basis))
        served = {url: list(device.specs) for url, device in devices.items()}
        table = build_routing_table(served, self.urls, 1)
        self.replicas = {model: table.replicas(model) for model in table.models}
        self.scheduler.table_swapped(table)
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

    # -- prober ------------------------------------------------------------------

    def poll(self) -> dict[str, WorkerCounters]:
        """Every worker's ModelControlStatus answer, from its counters."""
        answers = {}
        for url, device in self.devices.items():
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
            }
            answers[url] = WorkerCounters(
                models, device.weight_cache_bytes, device.discipline.value
            )
        return answers

    def tick(self, now: float, startup: bool = False) -> None:
        """One prober round: metadata, and under lpt_packing the packer's tick."""
        if isinstance(self.scheduler, RoundRobinScheduler):
            return
        answers = self.poll()
        meta = self.tracker.refresh(answers)
        self.scheduler.meta_refreshed(meta)
        if self.packer is None or not isinstance(self.scheduler, LptScheduler):
            return
        summary = summarize_poll(answers, fleet_compute=meta.fleet_compute_seconds)
        if startup:
            self.scheduler.polled(summary)
            report = self.packer.repack(summary, self.knobs, now, "startup")
            self.scheduler.install(report.assignment)
            self.repacks.append((now, "startup"))
            return
        outcome = self.packer.tick(summary, self.knobs, sorted(self.urls), now)
        if outcome.repack is not None:
            self.scheduler.install(outcome.repack.assignment)
            self.repacks.append((now, outcome.repack.trigger))
        self.scheduler.polled(summary)
        if outcome.compaction is not None:
            for url in outcome.compaction.reloads:  # reloads are empty under eager
                self.devices[url].compact()

    # -- request path --------------------------------------------------------------

    def admit(self, call: SimCall, now: float) -> str:
        """ADMITTED (a slot now), WAITING (in the FIFO for one) or SHED (it would not
        finish in time: refused at arrival), as `Admission.queue_for_slot` decides."""
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
        """The worker an admitted call goes to, or None (shed at its replicas, or
        refused there as it would not finish in time)."""
        ticket = call.ticket
        assert isinstance(ticket, Ticket)
        free = self.ledger.with_room(self.replicas[call.model])
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


def run(
    scenario: sc.Scenario,
    mode: str,
    fraction: float,
    rep: int,
    seed: int,
    load: _offered.Load,
    settings: sc.RunSettings,
    *,
    admission_cap: int | None = None,
    schedule: Schedule | None = None,
) -> RunResult:
    """One simulated run: the figures bench/fleet would report for it.

    The calls are the scenario's Poisson arrivals at `fraction` of its capacity (as
    bench/fleet sends them for the same seed), or `schedule` (a trace) when given.
    """
    ts = load.time_scale
    total = settings.warmup_s + settings.measure_s
    if schedule is None:
        schedule = sc.poisson_schedule(scenario, load.offered(fraction), total, seed)
    devices = _devices(scenario, ts)
    gateway = _Gateway(mode, devices, settings, admission_cap)
    deadline = settings.deadline(scenario, ts)
    rows = schedule.rows or [1] * len(schedule.times)
    calls = [
        SimCall(i, scenario.names[m], t, t + deadline, r)
        for i, (t, m, r) in enumerate(zip(schedule.times, schedule.models, rows, strict=True))
    ]
    outcome = Outcome(schedule, [0.0] * len(calls), [math.nan] * len(calls), [""] * len(calls))
    events = _Events(gateway, devices, calls, outcome)
    for call in calls:
        events.at(call.sent, _ARRIVE, call)
        events.at(call.deadline, _GIVE_UP, call)
    gateway.tick(0.0, startup=True)
    tick = settings.health_interval_s
    while tick < total + deadline:
        events.at(tick, _TICK, None)
        tick += settings.health_interval_s
    for name, when in {"start": settings.warmup_s, "end": total}.items():
        events.at(when, _TICK, name)
    events.run()
    for i, call in enumerate(calls):
        outcome.codes[i] = call.code or LATE
        outcome.done[i] = call.done
    return summarise(
        (scenario.name, mode, fraction, rep, seed),
        scenario.slo_ms * ts,
        outcome,
        settings.warmup_s,
        settings.measure_s,
        gateway.repacks,
    )


def _devices(scenario: sc.Scenario, ts: float) -> dict[str, SimDevice]:
    """One simulated device per worker of `scenario`, at the addresses bench/fleet uses."""
    catalogue = parse_catalogue(yaml.safe_load(scenario.catalogue_yaml()), source=scenario.name)
    specs = {m.name: m for m in catalogue.models}
    return {
        f"127.0.0.1:{9000 + k}": SimDevice(
            f"127.0.0.1:{9000 + k}",
            specs,
            Discipline(scenario.discipline),
            scenario.budget_bytes,
            ts,
        )
        for k in range(scenario.workers)
    }


class _Events:
    """A run's event queue and what each event does: arrivals, batches done, device
    wake-ups, calls giving up, prober ticks and the measurement's marks."""

    def __init__(
        self,
        gateway: _Gateway,
        devices: Mapping[str, SimDevice],
        calls: Sequence[SimCall],
        outcome: Outcome,
    ) -> None:
        self._gateway = gateway
        self._devices = devices
        self._outcome = outcome
        shapes = {(c.model, c.rows) for c in calls}
        self._bodies = {(name, r): sc.request_body(name, r) for name, r in shapes}
        self._sequence = itertools.count()
        self._queue: list[tuple[float, int, int, Any]] = []

    def at(self, time: float, kind: int, what: Any) -> None:
        heapq.heappush(self._queue, (time, kind, next(self._sequence), what))

    def run(self) -> None:
        """Every event, in time order, until none is left."""
        gateway, devices = self._gateway, self._devices
        while self._queue:
            now, kind, _, what = heapq.heappop(self._queue)
            if kind == _ARRIVE:
                admitted = gateway.admit(what, now)
                if admitted == ADMITTED:
                    self._end(self._send(what, now), SHED, now)
                elif admitted == SHED:
                    self._end(what, SHED, now)
            elif kind == _DONE:
                done = what.finish()
                for call in done.calls:
                    self._end(call, OK, now)
                self._dispatch(what, now)
            elif kind == _WAKE:
                if what.running is None:
                    self._dispatch(what, now)
            elif kind == _GIVE_UP:
                if not what.code:
                    if what.pending is not None:  # still queued: the gateway cancels it there
                        devices[what.worker].withdraw(what)
                    self._end(what, LATE, now)
            elif isinstance(what, str):
                self._outcome.marks[what] = _snapshot(devices, gateway)
                self._outcome.mark_times[what] = now
            else:
                gateway.tick(now)

    def _dispatch(self, device: SimDevice, now: float) -> None:
        started, expired = device.start(now)
        for call in expired:
            self._end(call, LATE, now)
        if started is not None:
            self.at(started.ends, _DONE, device)
        else:
            due = device.wake_at()
            if due < math.inf:
                self.at(max(due, now), _WAKE, device)

    def _end(self, call: SimCall | None, code: str, now: float) -> None:
        # A loop, not recursion: each ended call admits a waiting one, which may be
        # shed at once and admit the next (a long overload chains thousands).
        while call is not None and not call.code:
            call.code, call.done = code, now
            successor = self._gateway.close(call, now)
            call, code = (None, code) if successor is None else (self._send(successor, now), SHED)

    def _send(self, call: SimCall, now: float) -> SimCall | None:
        """Route `call` to its worker; returns it when it was shed instead."""
        device = self._gateway.route(call, self._bodies, now)
        if device is None:
            return call
        device.enqueue(call, now)
        if device.running is None:
            self._dispatch(device, now)
        return None


def _snapshot(devices: Mapping[str, SimDevice], gateway: _Gateway) -> Snapshot:
    placed = None
    if gateway.packer is not None:
        found: dict[str, list[str]] = {}
        for model, placement in gateway.packer.assignment.items():
            for url in placement.urls:
                found.setdefault(url, []).append(model)
        placed = {w: sorted(ms) for w, ms in sorted(found.items())}
    return Snapshot(
        [dict(device.counters) for device in devices.values()],
        {"gateway": 0.0, "workers": 0.0, "generator": 0.0},
        (0.0, 0.0),
        placed,
    )
