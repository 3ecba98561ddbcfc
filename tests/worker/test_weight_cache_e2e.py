"""The LRU weight cache and CompactMemory on a live worker (issue 3, acceptance 2).

Three equal 100 MiB models and a 250 MiB budget: two fit. Round-robin traffic
over the three is LRU's worst case, so every request finds its model evicted
and must pay the load (40 ms) before its batch runs. We check that from the
client's side (each answer comes exactly one load plus one launch after its
call), from ModelControlStatus (residency before each call) and from the
worker's metrics (loads and evictions counted, load time kept out of compute).
CompactMemory then frees everything and reloads exactly the model it names.

Runs on memory streams with the autojump clock (`tests.worker.client`): loads
and launches take their exact simulated time on the Trio clock and no wall
time. The metrics are the worker's /metrics exposition, read from its registry.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw.worker._worker import WorkerConfig
from tests.helpers import catalogue_from_yaml, infer_request
from tests.worker.client import WorkerClient, open_memory_worker, scrape, scrape_models

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
        "metrics_port": -1,
        "catalogue": CATALOGUE,
        "weight_cache_bytes": 250 * MIB,
    }
    settings.update(overrides)
    return WorkerConfig(**settings)  # type: ignore[arg-type]


async def _infer_timed(client: WorkerClient, model: str) -> float:
    """One call on an idle device; how long it took on the Trio clock."""
    request = infer_request(model, {"x": np.zeros((1, 4), np.float32)})
    started = trio.current_time()
    await client.infer(request)
    return trio.current_time() - started


async def test_round_robin_over_a_too_small_cache_pays_every_load(
    autojump_clock: MockClock,
) -> None:
    async with open_memory_worker(_config()) as client:
        status = await client.control_status()
        assert status.weight_cache_max_bytes == 250 * MIB
        assert not any(m.device_resident for m in status.models)
        assert all(m.host_resident for m in status.models)

        rounds = 3
        for _ in range(rounds):
            for model in ("m0", "m1", "m2"):
                assert model not in await client.resident()
                elapsed = await _infer_timed(client, model)
                assert elapsed == pytest.approx(LOAD_SECONDS + LAUNCH_SECONDS)
                resident = await client.resident()
                assert model in resident and len(resident) <= 2

        calls = 3 * rounds
        metrics = scrape(client.worker)
        assert metrics["worker_weight_loads_total"] == calls
        assert metrics["worker_weight_evicts_total"] == calls - 2  # the first two fit
        assert metrics["worker_weight_load_seconds_total"] == pytest.approx(calls * LOAD_SECONDS)
        assert metrics["worker_weight_cache_resident_bytes"] == 200 * MIB
        assert metrics["worker_weight_cache_max_bytes"] == 250 * MIB
        assert metrics["worker_weight_cache_pinned_bytes"] == 0
        assert metrics["worker_models_resident"] == 2
        # Load time is device time but not compute.
        for model in ("m0", "m1", "m2"):
            entry = await client.model_status(model)
            assert entry.total_compute_seconds == pytest.approx(rounds * LAUNCH_SECONDS)

        started = trio.current_time()
        reloaded, resident_bytes = await client.compact("m1", "nope")
        assert trio.current_time() - started == pytest.approx(LOAD_SECONDS)  # m1's reload
        assert (reloaded, resident_bytes) == (1, 100 * MIB)
        assert await client.resident() == {"m1"}
        metrics = scrape(client.worker)
        assert metrics["worker_weight_compactions_total"] == 1
        assert metrics["worker_weight_loads_total"] == calls + 1
        # Compacting again with nothing named leaves nothing on the device.
        assert await client.compact() == (0, 0)
        assert await client.resident() == set()


async def test_a_resident_model_pays_no_load(autojump_clock: MockClock) -> None:
    async with open_memory_worker(_config()) as client:
        elapsed = [await _infer_timed(client, "m0") for _ in range(3)]
        assert client.device.memory.counters.loads == 1
        # Only the first call waits for the load.
        assert elapsed == pytest.approx(
            [LOAD_SECONDS + LAUNCH_SECONDS, LAUNCH_SECONDS, LAUNCH_SECONDS]
        )


async def test_pinned_models_stay_and_skip_the_budget(autojump_clock: MockClock) -> None:
    async with open_memory_worker(_config(weight_cache_bytes=100 * MIB, pinned={"m0"})) as client:
        device = client.device
        order = ("m1", "m2", "m0", "m1", "m0", "m2")
        elapsed: list[float] = []
        for model in order:
            elapsed.append(await _infer_timed(client, model))
            assert "m0" in await client.resident()
        # m1 and m2 evict each other in the one slot; m0 never loads at all.
        assert device.memory.counters.loads == 4
        assert device.memory.counters.evicts == 3
        loaded = LOAD_SECONDS + LAUNCH_SECONDS
        assert elapsed == pytest.approx(
            [LAUNCH_SECONDS if model == "m0" else loaded for model in order]
        )
        entry = await client.model_status("m0")
        assert entry.residency == 3  # PINNED_DEVICE
        resident = scrape_models(client.worker, "worker_model_resident")
        pinned = scrape_models(client.worker, "worker_model_pinned")
        assert resident == {"m0": 1, "m1": 0, "m2": 1, "by_bandwidth": 0}
        assert pinned == {"m0": 1, "m1": 0, "m2": 0, "by_bandwidth": 0}
        metrics = scrape(client.worker)
        assert metrics["worker_weight_cache_pinned_bytes"] == 100 * MIB
        assert metrics["worker_resident_weight_bytes"] == 200 * MIB
        # CompactMemory frees the on-demand weights and leaves the pin in place.
        assert await client.compact() == (0, 0)
        assert await client.resident() == {"m0"}
        assert await client.compact("m0") == (0, 0)


async def test_load_time_follows_bandwidth_and_time_scale(autojump_clock: MockClock) -> None:
    bandwidth = 1000 * MIB  # 100 MiB in 0.1 s, times the 0.5 time scale
    config = _config(load_bandwidth=bandwidth, time_scale=0.5)
    async with open_memory_worker(config) as client:
        elapsed = await _infer_timed(client, "by_bandwidth")
        counters = client.device.memory.counters
        assert counters.load_seconds == pytest.approx(0.05)
        # The load, then the launch, both at the 0.5 time scale.
        assert elapsed == pytest.approx(0.05 + 0.5 * LAUNCH_SECONDS)


async def test_without_a_cache_everything_stays_on_the_device(autojump_clock: MockClock) -> None:
    async with open_memory_worker(_config(weight_cache_bytes=0)) as client:
        elapsed = await _infer_timed(client, "m0")
        assert elapsed == pytest.approx(LAUNCH_SECONDS)  # nothing to load
        status = await client.control_status()
        assert status.weight_cache_max_bytes == 0
        assert all(m.device_resident and m.residency == 3 for m in status.models)
        assert await client.compact("m0") == (0, 0)
        metrics = scrape(client.worker)
        assert "worker_weight_loads_total" not in metrics  # only with a cache
        assert metrics["worker_models_resident"] == 4
        assert metrics["worker_resident_weight_bytes"] == 400 * MIB
        assert client.device.memory.counters.loads == 0
