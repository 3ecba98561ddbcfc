"""The LRU weight cache and CompactMemory on a live worker (issue 3, acceptance 2).

Three equal 100 MiB models and a 250 MiB budget: two fit. Round-robin traffic
over the three is LRU's worst case, so every request finds its model evicted
and must pay the load (40 ms) before its batch runs. We check that from the
client's side (no answer comes sooner than the load), from ModelControlStatus
(residency before each call) and from /metrics (loads and evictions counted,
load time kept out of compute). CompactMemory then frees everything and reloads
exactly the model it names.
"""

from __future__ import annotations

import textwrap
import time
from functools import partial

import numpy as np
import pytest

from rsgw.worker._worker import RunningWorker, WorkerConfig, open_worker
from tests.helpers import (
    catalogue_from_yaml,
    in_thread,
    infer_request,
    model_control_status,
    model_infer,
    model_status,
)
from tests.worker.control import compact, scrape, scrape_models

MIB = 1 << 20
LOAD_SECONDS = 0.040
LAUNCH_SECONDS = 0.002


def _model(name: str, extra: str = "") -> str:
    return textwrap.dedent(
        f"""\
          - name: {name}
            inputs: [{{name: x, datatype: FP32, shape: [-1, 4]}}]
            outputs: [{{name: y, datatype: FP32, shape: [-1, 4]}}]
            max_batch_size: 8
            launch_ms: {LAUNCH_SECONDS * 1000}
            item_ms: 0
            weight_bytes: {100 * MIB}
        """
    ) + (f"  {extra}\n" if extra else "")


CATALOGUE = catalogue_from_yaml(
    "models:\n"
    + "".join(_model(f"m{i}", f"load_ms: {LOAD_SECONDS * 1000}") for i in range(3))
    + _model("by_bandwidth"),  # no load_ms: weight_bytes / load_bandwidth
    with_builtin=False,
)


def _config(**overrides: object) -> WorkerConfig:
    settings: dict[str, object] = {
        "port": 0,
        "metrics_port": 0,
        "catalogue": CATALOGUE,
        "weight_cache_bytes": 250 * MIB,
    }
    settings.update(overrides)
    return WorkerConfig(**settings)  # type: ignore[arg-type]


def _infer_timed(target: str, model: str) -> float:
    request = infer_request(model, {"x": np.zeros((1, 4), np.float32)})
    started = time.monotonic()
    model_infer(target, request)
    return time.monotonic() - started


def _resident(target: str) -> set[str]:
    return {m.name for m in model_control_status(target).models if m.device_resident}


def _target(worker: RunningWorker) -> str:
    return f"127.0.0.1:{worker.grpc_port}"


async def test_round_robin_over_a_too_small_cache_pays_every_load() -> None:
    async with open_worker(_config()) as worker:
        target = _target(worker)
        assert worker.metrics_port is not None
        status = await in_thread(partial(model_control_status, target))
        assert status.weight_cache_max_bytes == 250 * MIB
        assert not any(m.device_resident for m in status.models)
        assert all(m.host_resident for m in status.models)

        rounds = 3
        for _ in range(rounds):
            for model in ("m0", "m1", "m2"):
                assert model not in await in_thread(partial(_resident, target))
                elapsed = await in_thread(partial(_infer_timed, target, model))
                assert elapsed >= LOAD_SECONDS + LAUNCH_SECONDS
                resident = await in_thread(partial(_resident, target))
                assert model in resident and len(resident) <= 2

        calls = 3 * rounds
        metrics = await in_thread(partial(scrape, worker.metrics_port))
        assert metrics["worker_weight_loads_total"] == calls
        assert metrics["worker_weight_evicts_total"] == calls - 2  # the first two fit
        assert metrics["worker_weight_load_seconds_total"] == pytest.approx(calls * LOAD_SECONDS)
        assert metrics["worker_weight_cache_resident_bytes"] == 200 * MIB
        assert metrics["worker_weight_cache_max_bytes"] == 250 * MIB
        assert metrics["worker_weight_cache_pinned_bytes"] == 0
        assert metrics["worker_models_resident"] == 2
        # Load time is device time but not compute.
        for model in ("m0", "m1", "m2"):
            entry = await in_thread(partial(model_status, target, model))
            assert entry.total_compute_seconds == pytest.approx(rounds * LAUNCH_SECONDS)

        reloaded, resident_bytes = await in_thread(partial(compact, target, "m1", "nope"))
        assert (reloaded, resident_bytes) == (1, 100 * MIB)
        assert await in_thread(partial(_resident, target)) == {"m1"}
        metrics = await in_thread(partial(scrape, worker.metrics_port))
        assert metrics["worker_weight_compactions_total"] == 1
        assert metrics["worker_weight_loads_total"] == calls + 1
        # Compacting again with nothing named leaves nothing on the device.
        assert await in_thread(partial(compact, target)) == (0, 0)
        assert await in_thread(partial(_resident, target)) == set()


async def test_a_resident_model_pays_no_load() -> None:
    async with open_worker(_config()) as worker:
        target = _target(worker)
        for _ in range(3):
            await in_thread(partial(_infer_timed, target, "m0"))
        assert worker.service.device.memory.counters.loads == 1


async def test_pinned_models_stay_and_skip_the_budget() -> None:
    async with open_worker(_config(weight_cache_bytes=100 * MIB, pinned={"m0"})) as worker:
        target = _target(worker)
        device = worker.service.device
        for model in ("m1", "m2", "m0", "m1", "m0", "m2"):
            await in_thread(partial(_infer_timed, target, model))
            assert "m0" in await in_thread(partial(_resident, target))
        # m1 and m2 evict each other in the one slot; m0 never loads at all.
        assert device.memory.counters.loads == 4
        assert device.memory.counters.evicts == 3
        entry = await in_thread(partial(model_status, target, "m0"))
        assert entry.residency == 3  # PINNED_DEVICE
        assert worker.metrics_port is not None
        resident = await in_thread(
            partial(scrape_models, worker.metrics_port, "worker_model_resident")
        )
        pinned = await in_thread(partial(scrape_models, worker.metrics_port, "worker_model_pinned"))
        assert resident == {"m0": 1, "m1": 0, "m2": 1, "by_bandwidth": 0}
        assert pinned == {"m0": 1, "m1": 0, "m2": 0, "by_bandwidth": 0}
        metrics = await in_thread(partial(scrape, worker.metrics_port))
        assert metrics["worker_weight_cache_pinned_bytes"] == 100 * MIB
        assert metrics["worker_resident_weight_bytes"] == 200 * MIB
        # CompactMemory frees the on-demand weights and leaves the pin in place.
        assert await in_thread(partial(compact, target)) == (0, 0)
        assert await in_thread(partial(_resident, target)) == {"m0"}
        assert await in_thread(partial(compact, target, "m0")) == (0, 0)


async def test_load_time_follows_bandwidth_and_time_scale() -> None:
    bandwidth = 1000 * MIB  # 100 MiB in 0.1 s, times the 0.5 time scale
    config = _config(load_bandwidth=bandwidth, time_scale=0.5)
    async with open_worker(config) as worker:
        elapsed = await in_thread(partial(_infer_timed, _target(worker), "by_bandwidth"))
        counters = worker.service.device.memory.counters
        assert counters.load_seconds == pytest.approx(0.05)
        assert elapsed >= 0.05


async def test_without_a_cache_everything_stays_on_the_device() -> None:
    async with open_worker(_config(weight_cache_bytes=0)) as worker:
        target = _target(worker)
        assert worker.metrics_port is not None
        await in_thread(partial(_infer_timed, target, "m0"))
        status = await in_thread(partial(model_control_status, target))
        assert status.weight_cache_max_bytes == 0
        assert all(m.device_resident and m.residency == 3 for m in status.models)
        assert await in_thread(partial(compact, target, "m0")) == (0, 0)
        metrics = await in_thread(partial(scrape, worker.metrics_port))
        assert "worker_weight_loads_total" not in metrics  # only with a cache
        assert metrics["worker_models_resident"] == 4
        assert metrics["worker_resident_weight_bytes"] == 400 * MIB
        assert worker.service.device.memory.counters.loads == 0
