"""lpt_packing end to end: preconditions, repacks, compaction, drift, metrics (issue 8).

These run on memory streams with the autojump clock (`open_fleet(memory=True)`,
`tests.memory.MemoryNetwork`): what they test is the packing shell (its startup
checks, its repack loop, its compactions, its metrics), and neither the socket
nor the client changes any of it. The prober's rounds, the startup retry second
and the simulated compute keep their Trio-clock durations, so budgets accrue and
rounds pass as on a real fleet, only without wall time. The scripted failures
are the network's: a worker that is not listening yet is a refused connect, a
peer that accepts and never answers is a memory listener that reads nothing,
a dead worker is its `aclose()`. The metrics are read from the gateway's own
registry (`GatewayMetrics.render()`, the text its /metrics starts with); the
merged scrape over HTTP is tested in test_gateway_metrics.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from functools import partial

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw.base._errors import GatewayWedged, RsgwError, StartupError
from rsgw.base._methods import Method
from rsgw.config._config import GatewayConfig, ListenConfig
from rsgw.gateway._gateway import serve_gateway
from rsgw.gateway._running import RunningGateway
from rsgw.gateway.placement._packing import Packing
from rsgw.gateway.placement._preconditions import RETRY_INTERVAL
from rsgw.scheduling.knobs._knobs import CompactionMode, SchedulingMode
from rsgw.scheduling.knobs._settings import ModelOverride, SchedulingConfig
from rsgw.scheduling.placement._reports import DRIFT_WARNING
from rsgw.worker._worker import RunningWorker, WorkerConfig
from rsgw.worker.device._batching import Discipline
from rsgw.worker.models._specs import Catalogue
from tests.gateway.fleet import Fleet, leaf, open_fleet, start_worker
from tests.helpers import catalogue_from_yaml, infer_request, wait_until_async
from tests.memory import MemoryNetwork

MODELS = """
models:
""" + "".join(
    f"""
  - name: {name}
    max_batch_size: 8
    launch_ms: 4
    item_ms: 0.5
    weight_bytes: 1000
    load_ms: 1
    inputs: [{{name: x, datatype: FP32, shape: [-1, 4]}}]
    outputs: [{{name: y, datatype: FP32, shape: [-1, 4]}}]
"""
    for name in ("alpha", "beta", "gamma")
)
NAMES = ("alpha", "beta", "gamma")
#: Workers keep a weight cache (room for every model), so CompactMemory does work.
CACHED = {"weight_cache_bytes": 1 << 20}


def catalogue(*, extra: bool = False) -> Catalogue:
    text = MODELS
    if extra:
        text += (
            MODELS.split("models:\n", 1)[1]
            .replace("name: alpha", "name: delta", 1)
            .split("\n  - name: beta")[0]
        )
    return catalogue_from_yaml(text, with_builtin=False)


def lpt(**knobs: object) -> SchedulingConfig:
    settings: dict[str, object] = {
        "mode": SchedulingMode.LPT_PACKING,
        "first_rebalance_compute_seconds": 0.02,
        "rebalance_compute_seconds": 1000.0,
        "compaction_mode": CompactionMode.EAGER,
        "compaction_interval": 1,
    }
    settings.update(knobs)
    return SchedulingConfig(**settings)  # type: ignore[arg-type]


def body(model: str, rows: int = 1) -> bytes:
    return infer_request(model, {"x": np.ones((rows, 4), dtype=np.float32)}).SerializeToString()


async def send(fleet: Fleet, models: tuple[str, ...], each: int, concurrency: int = 1) -> list[str]:
    """`each` requests per model, from `concurrency` clients (a connection each); the failures."""
    failures: list[str] = []
    plan = [m for m in models for _ in range(each)]

    async def client(share: list[str]) -> None:
        channel = fleet.channel()
        for model in share:
            try:
                await channel.unary(Method.MODEL_INFER.wire, body(model), deadline=deadline())
            except RsgwError as exc:
                failures.append(f"{model}: {exc.code.name} {exc.message}")

    async with trio.open_nursery() as nursery:
        for i in range(concurrency):
            nursery.start_soon(client, plan[i::concurrency])
    return failures


def deadline(seconds: float = 30.0) -> float:
    """A client deadline `seconds` from now on the Trio clock."""
    return trio.current_time() + seconds


def packing(fleet: Fleet) -> Packing:
    assert fleet.gateway._packing is not None
    return fleet.gateway._packing


def repacks(fleet: Fleet, trigger: str) -> float:
    value = packing(fleet)._repacks.labels(trigger)._value.get()
    return float(value)


def served(fleet: Fleet, model: str) -> list[int]:
    return [
        c.requests_served if (c := w.service.device.counters.get(model)) else 0
        for w in fleet.workers
    ]


def compactions(fleet: Fleet) -> list[int]:
    return [w.service.device.memory.counters.compactions for w in fleet.workers]


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="rsgw")
    yield caplog


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == text]


# -- preconditions ---------------------------------------------------------------------


async def test_a_fair_worker_fails_startup_naming_it(autojump_clock: MockClock) -> None:
    with pytest.raises(BaseExceptionGroup) as caught:
        async with open_fleet(
            3,
            memory=True,
            catalogues=[catalogue()] * 3,
            worker_overrides=[{}, {"discipline": Discipline.FAIR}, {}],
            scheduling=lpt(),
        ):
            pass
    error = leaf(caught.value)
    assert isinstance(error, StartupError)
    assert "FIFO or EDF" in str(error) and "worker1" in str(error) and "'fair'" in str(error)


async def test_a_different_model_set_fails_startup_naming_the_worker(
    autojump_clock: MockClock,
) -> None:
    with pytest.raises(BaseExceptionGroup) as caught:
        async with open_fleet(
            2, memory=True, catalogues=[catalogue(), catalogue(extra=True)], scheduling=lpt()
        ):
            pass
    error = leaf(caught.value)
    assert isinstance(error, StartupError)
    message = str(error)
    assert "all models on all workers" in message and "worker1" in message
    assert "delta" in message


async def free_port(network: MemoryNetwork) -> int:
    """A port on `network` that nobody listens on (listened on, then closed)."""
    listener, port = network.listen("127.0.0.1", 0)
    await listener.aclose()
    return port


def with_late_worker(worker: RunningWorker, port: int, wait: float) -> GatewayConfig:
    """A gateway over `worker` and a second endpoint where nothing listens yet."""
    return GatewayConfig(
        endpoints=(f"127.0.0.1:{worker.grpc_port}", f"127.0.0.1:{port}"),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
        health_interval_seconds=0.2,
        startup_wait_seconds=wait,
        scheduling=lpt(),
    )


def lone_worker(port: int = 0, name: str = "worker0") -> WorkerConfig:
    return WorkerConfig(name=name, port=port, metrics_port=-1, catalogue=catalogue())


async def test_without_a_wait_a_missing_worker_fails_startup(autojump_clock: MockClock) -> None:
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        worker: RunningWorker = await nursery.start(start_worker, lone_worker(), network)
        port = await free_port(network)
        with pytest.raises(BaseExceptionGroup) as caught:
            await serve_gateway(with_late_worker(worker, port, 0.0), network=network)
        error = leaf(caught.value)
        assert isinstance(error, StartupError)
        assert f"[127.0.0.1:{port}] not answering" in str(error)
        assert trio.current_time() < RETRY_INTERVAL  # one round of polls, no retry wait
        nursery.cancel_scope.cancel()


async def test_a_late_worker_is_waited_for_then_the_gateway_serves(
    records: pytest.LogCaptureFixture, autojump_clock: MockClock
) -> None:
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        early: RunningWorker = await nursery.start(start_worker, lone_worker(), network)
        port = await free_port(network)
        started: list[RunningGateway] = []

        async def gateway() -> None:
            config = with_late_worker(early, port, 60.0)
            started.append(await nursery.start(partial(serve_gateway, network=network), config))

        nursery.start_soon(gateway)
        waiting = "lpt_packing: waiting for all workers before serving"
        await wait_until_async(lambda: bool(messages(records, waiting)), 10)
        await trio.sleep(5 * RETRY_INTERVAL)  # five more rounds of polls find no late worker
        assert not started
        late_at = trio.current_time()
        await nursery.start(start_worker, lone_worker(port, "late"), network)
        await wait_until_async(lambda: bool(started), 15)
        # A missing worker is polled again every second, so it delays serving by a second.
        assert trio.current_time() - late_at <= RETRY_INTERVAL + 0.1
        fleet = Fleet([early], started[0], nursery, network)
        assert await send(fleet, NAMES, 2) == []
        nursery.cancel_scope.cancel()


async def test_a_fleet_whose_every_startup_poll_hangs_is_wedged(autojump_clock: MockClock) -> None:
    """A listener that accepts and then says nothing: every ModelControlStatus poll hits
    its watchdog, so after `wedge_exit_rounds` rounds startup gives up (the supervisor
    restarts the gateway with a fresh client stack) instead of waiting forever."""

    async def silent(stream: trio.abc.Stream) -> None:
        async with stream:
            await trio.sleep_forever()

    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        listener, port = network.listen("127.0.0.1", 0)
        nursery.start_soon(trio.serve_listeners, silent, [listener])
        config = GatewayConfig(
            endpoints=(f"127.0.0.1:{port}",),
            listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
            startup_wait_seconds=math.inf,
            probe_timeout_seconds=0.2,
            wedge_exit_rounds=2,
            scheduling=lpt(),
        )
        with trio.fail_after(20), pytest.raises(BaseExceptionGroup) as caught:
            await serve_gateway(config, network=network)
        assert isinstance(leaf(caught.value), GatewayWedged)
        # Two watchdogs and the retry wait between them, not the 20 s bound.
        assert trio.current_time() == pytest.approx(2 * 0.2 + RETRY_INTERVAL)
        assert network.connects[f"127.0.0.1:{port}"] >= 1
        nursery.cancel_scope.cancel()


# -- repacks and compaction ---------------------------------------------------------------


async def rounds_pass(fleet: Fleet, count: int) -> None:
    prober = fleet.gateway._service.prober
    target = prober.rounds + count
    await wait_until_async(lambda: prober.rounds >= target, 10)


async def drive_until_compute_repack(fleet: Fleet, mix: tuple[str, ...] = NAMES) -> None:
    """Traffic in rounds (each model of `mix` 6 times) until a compute repack lands."""
    with trio.fail_after(30):
        while repacks(fleet, "compute") < 1:
            failures = await send(fleet, mix, 6, 3)
            assert failures == []
            await rounds_pass(fleet, 2)


@pytest.mark.parametrize("mode", [CompactionMode.EAGER, CompactionMode.OFF])
async def test_idle_fleet_never_repacks_then_traffic_repacks_and_compacts(
    mode: CompactionMode, records: pytest.LogCaptureFixture, autojump_clock: MockClock
) -> None:
    knobs = lpt(
        compaction_mode=mode,
        ema_halflife_compute_seconds=0.01,  # demand figures adopt the first samples
        models={"gamma": ModelOverride(replicas=2)},
    )
    async with open_fleet(
        3, memory=True, catalogues=[catalogue()] * 3, worker_overrides=CACHED, scheduling=knobs
    ) as fleet:
        packer = packing(fleet).packer
        assert repacks(fleet, "startup") == 1
        rounds = fleet.gateway.statistics().probe_rounds
        await wait_until_async(lambda: fleet.gateway.statistics().probe_rounds >= rounds + 5, 10)
        assert repacks(fleet, "compute") == 0  # idle: nothing accrues
        assert compactions(fleet) == [0, 0, 0]

        # gamma (two replicas) and alpha hot, beta warm: the startup placement put
        # alpha beside one of gamma's replicas, and parting them lightens the busiest
        # worker by far more than PLAN_GAIN_FLOOR, so the placement changes.
        await drive_until_compute_repack(fleet, ("gamma",) * 6 + ("alpha",) * 4 + ("beta",))
        report = packer.last_report
        assert report is not None and report.trigger == "compute"
        sizes = {m: len(p) for m, p in packer.assignment.items()}
        assert sizes == {"alpha": 1, "beta": 1, "gamma": 2}
        lines = messages(records, "lpt_packing: repack")
        assert [vars(r)["trigger"] for r in lines] == ["startup", "compute"]
        assert {"models", "moved", "held_by_hysteresis", "max_improvement"} <= vars(
            lines[-1]
        ).keys()

        changed = sorted(report.changed_workers)
        assert changed
        if mode is CompactionMode.EAGER:
            await wait_until_async(lambda: sum(compactions(fleet)) == len(changed), 10)
            urls = list(fleet.gateway.config.endpoints)
            assert [compactions(fleet)[urls.index(u)] for u in changed] == [1] * len(changed)
        # The next repack waits for the full budget, not the first one.
        rounds = fleet.gateway.statistics().probe_rounds
        assert await send(fleet, NAMES, 4, 3) == []
        await wait_until_async(lambda: fleet.gateway.statistics().probe_rounds >= rounds + 3, 10)
        tick = packer.last_tick
        assert tick is not None and tick.threshold == 1000.0
        assert repacks(fleet, "compute") == 1
        if mode is CompactionMode.OFF:
            assert compactions(fleet) == [0, 0, 0]
        else:
            assert sum(compactions(fleet)) == len(changed)


async def test_eager_compaction_reaches_each_changed_worker_once(
    autojump_clock: MockClock,
) -> None:
    """Force a placement change with the operator handshake and count compactions."""
    knobs = lpt(first_rebalance_compute_seconds=1000.0)
    async with open_fleet(
        3, memory=True, catalogues=[catalogue()] * 3, worker_overrides=CACHED, scheduling=knobs
    ) as fleet:
        shell = packing(fleet)
        before = dict(shell.packer.assignment)
        shell.scheduler.knobs = lpt(first_rebalance_compute_seconds=1000.0, default_replicas="all")
        outcome = await shell.request_repack(20)
        assert outcome.completed and outcome.sequence == 1
        after = shell.packer.assignment
        assert all(len(p) == 3 for p in after.values()) and before != after
        report = shell.packer.last_report
        assert report is not None and report.trigger == "operator"
        changed = sorted(report.changed_workers)
        assert changed
        await wait_until_async(lambda: sum(compactions(fleet)) == len(changed), 10)
        urls = list(fleet.gateway.config.endpoints)
        assert all(compactions(fleet)[urls.index(u)] == 1 for u in changed)


# -- drift and lost workers ------------------------------------------------------------


async def restart_without(fleet: Fleet, index: int, dropped: str) -> RunningWorker:
    """Restart worker `index` on its port, serving every model but `dropped`."""
    old = fleet.workers[index]
    await old.aclose()
    kept = "models:\n" + "".join(
        "\n  - name:" + chunk
        for chunk in MODELS.split("\n  - name:")[1:]
        if not chunk.startswith(f" {dropped}\n")
    )
    config = WorkerConfig(
        name=old.config.name,
        gpu=old.config.gpu,
        metrics_port=-1,
        catalogue=catalogue_from_yaml(kept, with_builtin=False),
    )
    return await fleet.restart_worker(index, config)


async def test_a_model_missing_from_one_worker_routes_over_the_others_with_a_warning(
    records: pytest.LogCaptureFixture, autojump_clock: MockClock
) -> None:
    knobs = lpt(first_rebalance_compute_seconds=1000.0, default_replicas="all")
    async with open_fleet(3, memory=True, catalogues=[catalogue()] * 3, scheduling=knobs) as fleet:
        shell = packing(fleet)
        urls = fleet.gateway.config.endpoints
        assert shell.packer.assignment["gamma"].urls == tuple(sorted(urls))
        await restart_without(fleet, 2, "gamma")
        await wait_until_async(
            lambda: fleet.gateway.statistics().models.get("gamma") == urls[:2], 10
        )
        outcome = await shell.request_repack(20)
        assert outcome.completed
        assert shell.packer.assignment["gamma"].urls == tuple(sorted(urls[:2]))
        assert shell.packer.assignment["alpha"].urls == tuple(sorted(urls))
        drift = messages(records, DRIFT_WARNING)
        assert [vars(r)["model"] for r in drift] == ["gamma"]
        assert vars(drift[0])["ready"] == 3
        assert await send(fleet, ("gamma",), 12, 3) == []
        counts = served(fleet, "gamma")
        assert counts[0] > 0 and counts[1] > 0 and counts[0] + counts[1] == 12


async def test_a_worker_that_stops_answering_loses_its_placement_and_traffic_fails_over(
    autojump_clock: MockClock,
) -> None:
    knobs = lpt(first_rebalance_compute_seconds=1000.0, default_replicas="all")
    async with open_fleet(3, memory=True, catalogues=[catalogue()] * 3, scheduling=knobs) as fleet:
        shell = packing(fleet)
        lost = fleet.gateway.config.endpoints[1]
        assert all(lost in p.urls for p in shell.packer.assignment.values())
        fleet.workers[1].kill()
        # Before any repack: the placement still names the lost worker, and no request fails.
        assert await send(fleet, NAMES, 6, 3) == []
        await wait_until_async(lambda: lost not in fleet.gateway.statistics().ready, 10)
        outcome = await shell.request_repack(20)
        assert outcome.completed
        assert all(lost not in p.urls for p in shell.packer.assignment.values())
        assert all(len(p) == 2 for p in shell.packer.assignment.values())
        assert await send(fleet, NAMES, 6, 3) == []


# -- metrics ------------------------------------------------------------------------------

LPT_FAMILIES = {
    "gateway_model_replicas": ("model",),
    "gateway_placement_weight": ("model", "worker"),
    "gateway_replica_outstanding": ("model", "worker"),
    "gateway_replica_routed_total": ("model", "worker"),
    "gateway_model_fill_quantum": ("model",),
    "gateway_repacks_total": ("trigger",),
    "gateway_model_utilization": ("model",),
    "gateway_worker_inflight_work": ("worker", "basis"),
}


def samples(text: str, family: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line.startswith(family + "{"):
            labels, value = line.rsplit(" ", 1)
            found[labels[len(family) :]] = float(value)
    return found


def exposition(fleet: Fleet) -> str:
    """The gateway's own registry as its /metrics renders it (before the workers' series)."""
    return fleet.gateway._service.metrics.render().decode()


async def test_every_lpt_metric_appears_with_its_labels_during_traffic(
    autojump_clock: MockClock,
) -> None:
    knobs = lpt(models={"gamma": ModelOverride(replicas=2)})
    async with open_fleet(3, memory=True, catalogues=[catalogue()] * 3, scheduling=knobs) as fleet:
        await drive_until_compute_repack(fleet)
        done = trio.Event()
        failures: list[str] = []

        async def traffic() -> None:
            failures.extend(await send(fleet, NAMES, 20, 4))
            done.set()

        seen_work = False
        text = ""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(traffic)
            while not done.is_set():
                text = exposition(fleet)
                seen_work = seen_work or any(
                    v > 0 for v in samples(text, "gateway_worker_inflight_work").values()
                )
                await trio.sleep(0.01)
        assert failures == []
        for family, labels in LPT_FAMILIES.items():
            found = samples(text, family)
            assert found, family
            for key in found:
                # prometheus_client writes labels in name order (docs/decisions.md).
                names = [part.split("=")[0] for part in key.strip("{}").split(",")]
                assert names == sorted(labels), (family, key)
        assert seen_work
        assert samples(text, "gateway_model_replicas") == {
            '{model="alpha"}': 1.0,
            '{model="beta"}': 1.0,
            '{model="gamma"}': 2.0,
        }
        assert samples(text, "gateway_repacks_total") == {
            '{trigger="startup"}': 1.0,
            '{trigger="compute"}': 1.0,
            '{trigger="operator"}': 0.0,
        }
        assert samples(text, "gateway_model_fill_quantum") == {
            f'{{model="{m}"}}': 8.0 for m in NAMES
        }
        work = samples(text, "gateway_worker_inflight_work")
        assert all(k.startswith('{basis="compute"') for k in work)
        routed = samples(text, "gateway_replica_routed_total")
        assert {k.split(",")[0] for k in routed} == {f'{{model="{m}"' for m in NAMES}
