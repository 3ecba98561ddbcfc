"""A fleet in virtual time behind the gateway's own scheduling cores.

Discrete events, in time order: a call arrives (from the scenario's schedule), a
device finishes a batch (or a control command), a held batch comes due, a client gives
up at its deadline, the prober ticks, the cold path's timers fire. What decides is the
production code, called as the gateway calls it (`_gateway.SimGateway`): the scheduler
of the mode, the `Ledger` that admits calls, deadline-aware admission, the prober's
tracker and the packer; on the workers' side `rsgw.simulate._device` (the worker's
queues, weight cache and costs). The gateway's settings come from the same gateway.yml
bench/fleet writes, parsed by the gateway's own parser.

What is simplified, and why it matters little for the figures: the network and the
gateway's CPU cost nothing (bench/fleet's gateway used a fifth of a core); while the
inbound cap is full, calls the rule admits wait in one FIFO (the real gateway reads
up to twice its cap and leaves the rest in its clients' HTTP/2 streams: here every
call is read); a replica is never down; compaction
frees weights at once rather than between batches.

With an eviction mode (`--eviction`, issue 49's long tail: more models than the GPUs
hold) the workers start with nothing loaded and the gateway loads on demand, evicting
by value (`lpt_packing`) or least recently used (`lru_baseline`), through `_cold`;
the gateway starts `STARTUP_LEAD_S` before the first call, and the calls get
bench/fleet's longer deadline (`call_deadline`).

Deterministic: the same scenario, mode, load and seed give the same figures.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from rsgw.config._config import parse_config
from rsgw.scheduling.calls._routing import RoutingTable
from rsgw.simulate import _offered
from rsgw.simulate import _scenario as sc
from rsgw.simulate._cold import REFUSED
from rsgw.simulate._device import Command, SimCall, SimDevice
from rsgw.simulate._gateway import ADMITTED, SHED, SimGateway
from rsgw.simulate._gateway import packer_knobs as packer_knobs
from rsgw.simulate._results import OK, Outcome, RunResult, Schedule, Snapshot, summarise
from rsgw.simulate._tenants import tenant_rows
from rsgw.worker.device._batching import Discipline
from rsgw.worker.models._catalogue import parse_catalogue

MODES = ("round_robin", "least_outstanding", "lpt_packing")
#: `--eviction` -> the mode label of its runs (bench/fleet's): rsgw's residency by value
#: is lpt_packing's, the LRU baseline is what ModelMesh and Seldon Core do.
EVICTION_MODES = {"value": "lpt_packing", "lru": "lru_baseline"}
LATE = "DEADLINE_EXCEEDED"

# Event kinds, in the order simultaneous events are handled.
_DONE, _WAKE, _TICK, _ARRIVE, _GIVE_UP, _CALL = range(6)


#: Under --eviction, seconds from the gateway's start-up placement to the first call:
#: bench/fleet sends once the gateway is ready and its gRPC channel is connected, which
#: its gateway logs put at 0.3 to 0.6 s after the start-up repack (the on-demand loads
#: of a run land that much later than the simulated ones when both start at 0).
STARTUP_LEAD_S = 0.4


def gateway_yaml(
    mode: str,
    workers: Sequence[str],
    settings: sc.RunSettings,
    admission_cap: int | None,
    repository: Mapping[str, Any] | None = None,
    tenancy: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The gateway.yml of a simulated run (bench/fleet writes the same for real ones;
    `tenancy`, the scenario's block, is the simulator's alone)."""
    config: dict[str, Any] = {
        "endpoints": list(workers),
        "listen": {"grpc": "127.0.0.1:0", "metrics": "127.0.0.1:0", "http": "127.0.0.1:0"},
        "scheduling": settings.gateway_scheduling(mode),
    }
    if admission_cap is not None:
        config["grpc"] = {"max_concurrent_requests_per_worker": admission_cap}
        config["worker_client"] = {"max_concurrent_streams": admission_cap}
    if repository is not None:
        config["repository"] = dict(repository)
    if tenancy:
        config["tenancy"] = dict(tenancy)
    return config


def repository_yaml(scenario: sc.Scenario, eviction: str, time_scale: float) -> dict[str, Any]:
    """gateway.yml's `repository` under `--eviction` (bench/fleet's `start_fleet` writes
    the same): every model handed, each worker's budget, the models' weights, the
    eviction, and a minimum residency of three mean loads (for LRU too: its youngest
    copies are its last to go anyway)."""
    load_s = scenario.load_ms * time_scale / 1000
    return {
        "models": list(scenario.names),
        "worker_budget_bytes": scenario.budget_bytes,
        "default_weight_bytes": scenario.weight_bytes,
        "weight_bytes": scenario.weights,
        "eviction": eviction,
        "min_residency_seconds": 3 * load_s,
    }


def eviction_of(mode: str) -> str:
    """The `--eviction` a mode label stands for (bench/fleet's `eviction_of`)."""
    return "lru" if mode == "lru_baseline" else "value"


def call_deadline(
    scenario: sc.Scenario, settings: sc.RunSettings, time_scale: float, eviction: str | None
) -> float:
    """Seconds a call gets; under `--eviction` at least ten mean loads, as bench/fleet
    gives it (a cold call waits for its load and those queued before it)."""
    deadline = settings.deadline(scenario, time_scale)
    if eviction is not None:
        deadline = max(deadline, 10 * scenario.load_ms * time_scale / 1000)
    return deadline


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
    eviction: str | None = None,
    watch: Callable[[float, SimGateway], None] | None = None,
) -> RunResult:
    """One simulated run: the figures bench/fleet would report for it.

    The calls are the scenario's Poisson arrivals at `fraction` of its capacity (as
    bench/fleet sends them for the same seed), or `schedule` (a trace) when given.
    `eviction` ("value" or "lru"): the models are loaded on demand (`_cold`), and `mode`
    is only the runs' label (lpt_packing schedules). `watch` is called after every
    event (tests check invariants through it).
    """
    ts = load.time_scale
    total = settings.warmup_s + settings.measure_s
    if schedule is None:
        schedule = sc.poisson_schedule(scenario, load.offered(fraction), total, seed)
    devices = _devices(scenario, ts, explicit=eviction is not None)
    repository = None if eviction is None else repository_yaml(scenario, eviction, ts)
    scheduling = mode if eviction is None else "lpt_packing"
    yml = gateway_yaml(
        scheduling, list(devices), settings, admission_cap, repository, scenario.tenancy
    )
    gateway = SimGateway(parse_config(yml, {}), devices)
    deadline = call_deadline(scenario, settings, ts, eviction)
    rows = schedule.rows or [1] * len(schedule.times)
    calls = [
        SimCall(i, scenario.names[m], t, t + deadline, r)
        for i, (t, m, r) in enumerate(zip(schedule.times, schedule.models, rows, strict=True))
    ]
    senders = schedule.tenants
    if senders is None:
        senders = sc.tenant_draws(scenario, len(calls), seed)
    for call, sender in zip(calls, senders or (), strict=False):
        call.tenant = scenario.traffic[sender].tenant
        call.priority = scenario.traffic[sender].priority
    outcome = Outcome(schedule, [0.0] * len(calls), [math.nan] * len(calls), [""] * len(calls))
    events = _Events(gateway, devices, calls, outcome, watch)
    gateway.attach(events)
    for call in calls:
        events.at(call.sent, _ARRIVE, call)
        events.at(call.deadline, _GIVE_UP, call)
    # The gateway starts before the first call: under --eviction its start-up
    # placement's loads are device time the first calls meet.
    started = 0.0 if eviction is None else -STARTUP_LEAD_S
    gateway.tick(started, startup=True)
    tick = started + settings.health_interval_s
    while tick < total + deadline:
        events.at(tick, _TICK, None)
        tick += settings.health_interval_s
    for name, when in {"start": settings.warmup_s, "end": total}.items():
        events.at(when, _TICK, name)
    events.run()
    for i, call in enumerate(calls):
        outcome.codes[i] = call.code or LATE
        outcome.done[i] = call.done
    result = summarise(
        (scenario.name, mode, fraction, rep, seed),
        scenario.slo_ms * ts,
        outcome,
        settings.warmup_s,
        settings.measure_s,
        gateway.repacks,
    )
    if senders is not None:
        slo_s = scenario.slo_ms * ts / 1000
        result.tenants = tenant_rows(calls, slo_s, settings.warmup_s, settings.measure_s)
    return result


def _devices(scenario: sc.Scenario, ts: float, *, explicit: bool) -> dict[str, SimDevice]:
    """One simulated device per worker of `scenario`, at the addresses bench/fleet uses
    (`explicit`: in explicit model control, nothing loaded, as under --eviction)."""
    catalogue = parse_catalogue(yaml.safe_load(scenario.catalogue_yaml()), source=scenario.name)
    specs = {m.name: m for m in catalogue.models}
    return {
        f"127.0.0.1:{9000 + k}": SimDevice(
            f"127.0.0.1:{9000 + k}",
            specs,
            Discipline(scenario.discipline),
            scenario.budget_bytes,
            ts,
            explicit=explicit,
        )
        for k in range(scenario.workers)
    }


class _Events:
    """A run's event queue and what each event does: arrivals, batches (and control
    commands) done, device wake-ups, calls giving up, the cold path's retries, prober
    ticks and the measurement's marks. It is the cold path's `Hooks`."""

    def __init__(
        self,
        gateway: SimGateway,
        devices: Mapping[str, SimDevice],
        calls: Sequence[SimCall],
        outcome: Outcome,
        watch: Callable[[float, SimGateway], None] | None = None,
    ) -> None:
        self._gateway = gateway
        self._devices = devices
        self._outcome = outcome
        self._watch = watch
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
            cold = gateway.cold
            if kind == _ARRIVE:
                admitted = gateway.admit(what, now)
                if admitted == ADMITTED:
                    self._end_refused(self._send(what, now), now)
                elif admitted == SHED:
                    self._end(what, SHED, now)
            elif kind == _DONE:
                done = what.finish()
                if done.command is not None and cold is not None:
                    cold.command_done(what.url, done.command, now)
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
                    elif cold is not None and cold.holds(what):  # waiting for a load
                        cold.give_up(what)
                    self._end(what, LATE, now)
            elif kind == _CALL:
                what(now)
            elif isinstance(what, str):
                self._outcome.marks[what] = _snapshot(devices, gateway)
                self._outcome.mark_times[what] = now
            else:
                gateway.tick(now)
            if self._watch is not None:
                self._watch(now, gateway)

    # -- the cold path's hooks -----------------------------------------------------------

    def command(self, url: str, command: Command) -> None:
        device = self._devices[url]
        device.control(command)
        if device.running is None:
            self._dispatch(device, command.asked)

    def serve(self, call: SimCall, now: float) -> None:
        self._end_refused(self._send(call, now), now)

    def refuse(self, call: SimCall, code: str, now: float) -> None:
        self._end(call, code, now)

    def call_at(self, when: float, action: Callable[[float], None]) -> None:
        self.at(when, _CALL, action)

    def loading(self, url: str, now: float) -> None:
        self._gateway.forecast.reset(url, now)

    def table(self, table: RoutingTable) -> None:
        self._gateway.table_swapped(table)

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
            refused = None if successor is None else self._send(successor, now)
            call, code = refused or (None, code)

    def _end_refused(self, refused: tuple[SimCall, str] | None, now: float) -> None:
        if refused is not None:
            self._end(*refused, now)

    def _send(self, call: SimCall, now: float) -> tuple[SimCall, str] | None:
        """Route `call` to its worker (or, its model loaded nowhere, hold it for a load);
        returns it with its status when it was shed or refused instead."""
        gateway = self._gateway
        cold = gateway.cold
        if cold is not None and not gateway.replicas.get(call.model):
            return None if cold.warm(call, now) else (call, REFUSED)
        device = gateway.route(call, self._bodies, now)
        if device is None:
            return call, SHED
        device.enqueue(call, now)
        if cold is not None:
            cold.sent(call)
        if device.running is None:
            self._dispatch(device, now)
        return None


def _snapshot(devices: Mapping[str, SimDevice], gateway: SimGateway) -> Snapshot:
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
        None if gateway.cold is None else float(gateway.cold.cold_starts),
    )
