"""Shared memory through the gateway with tritonclient (issue 5, item 4)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from functools import partial

import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import check_simple, wait_until_async

BYTES = 64  # one [1,16] INT32 tensor


@pytest.fixture
def regions() -> Iterator[dict[str, tuple[str, object]]]:
    """An input region (both inputs) and an output region, cleaned up afterwards."""
    token = uuid.uuid4().hex[:8]
    made = {
        "in": (
            f"/rsgw_in_{token}",
            shm.create_shared_memory_region(f"in_{token}", f"/rsgw_in_{token}", 2 * BYTES),
        ),
        "out": (
            f"/rsgw_out_{token}",
            shm.create_shared_memory_region(f"out_{token}", f"/rsgw_out_{token}", 2 * BYTES),
        ),
    }
    yield made
    for _, handle in made.values():
        shm.destroy_shared_memory_region(handle)


def worker_regions(fleet: Fleet, count: int | None = None) -> list[set[str]]:
    """Each worker's own SystemSharedMemoryStatus, asked of the worker directly."""
    found = []
    for worker in fleet.workers[:count]:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{worker.grpc_port}")
        found.append(set(client.get_system_shared_memory_status().regions))
        client.close()
    return found


def infer_through_shm(target: str, regions: dict[str, tuple[str, object]], seed: int) -> None:
    client = grpcclient.InferenceServerClient(target)
    rng = np.random.default_rng(seed)
    a = rng.integers(-100, 100, size=(1, 16), dtype=np.int32)
    b = rng.integers(-100, 100, size=(1, 16), dtype=np.int32)
    in_handle, out_handle = regions["in"][1], regions["out"][1]
    shm.set_shared_memory_region(in_handle, [a, b])
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory("input_region", BYTES, 0)
    inputs[1].set_shared_memory("input_region", BYTES, BYTES)
    outputs = [
        grpcclient.InferRequestedOutput("OUTPUT0"),
        grpcclient.InferRequestedOutput("OUTPUT1"),
    ]
    outputs[0].set_shared_memory("output_region", BYTES, 0)
    outputs[1].set_shared_memory("output_region", BYTES, BYTES)
    client.infer("simple", inputs, outputs=outputs)
    total = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=0)
    diff = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=BYTES)
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(diff, a - b)
    client.close()


async def test_register_everywhere_infer_everywhere_unregister_all(
    regions: dict[str, tuple[str, object]],
) -> None:
    async with open_fleet(3, health_interval_seconds=60) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)
        await trio.to_thread.run_sync(
            lambda: client.register_system_shared_memory(
                "input_region", regions["in"][0], 2 * BYTES
            )
        )
        await trio.to_thread.run_sync(
            lambda: client.register_system_shared_memory(
                "output_region", regions["out"][0], 2 * BYTES
            )
        )
        registered = await trio.to_thread.run_sync(worker_regions, fleet)
        assert registered == [{"input_region", "output_region"}] * 3
        for seed in range(6):  # round robin: every worker serves two of them
            await trio.to_thread.run_sync(infer_through_shm, fleet.target, regions, seed)
        assert [w.service.device.counters["simple"].requests_served for w in fleet.workers] == [
            2,
            2,
            2,
        ]
        await trio.to_thread.run_sync(client.unregister_system_shared_memory)
        assert await trio.to_thread.run_sync(worker_regions, fleet) == [set(), set(), set()]
        client.close()


async def test_a_worker_down_at_register_time_gets_the_regions_when_back(
    regions: dict[str, tuple[str, object]],
) -> None:
    """Registered on the live workers; the dead one gets them before its first call."""
    async with open_fleet(3, health_interval_seconds=0.2) as fleet:
        fleet.workers[2].kill()
        client = grpcclient.InferenceServerClient(fleet.target)
        for name, region in (("input_region", "in"), ("output_region", "out")):
            key = regions[region][0]
            await trio.to_thread.run_sync(
                partial(client.register_system_shared_memory, name, key, 2 * BYTES)
            )
        assert (
            await trio.to_thread.run_sync(worker_regions, fleet, 2)
            == [{"input_region", "output_region"}] * 2
        )
        await fleet.restart_worker(2)
        url = fleet.worker_url(2)
        await wait_until_async(lambda: url in fleet.gateway.statistics().ready, what="back")
        for seed in range(6):  # round robin: the restarted worker serves its share
            await trio.to_thread.run_sync(infer_through_shm, fleet.target, regions, seed)
        assert fleet.workers[2].service.device.counters["simple"].requests_served >= 1
        assert (
            await trio.to_thread.run_sync(worker_regions, fleet)
            == [{"input_region", "output_region"}] * 3
        )
        # A worker that restarts after the registration gets them again too.
        fleet.workers[0].kill()
        await fleet.restart_worker(0)
        await wait_until_async(
            lambda: fleet.worker_url(0) in fleet.gateway.statistics().ready, what="back"
        )
        for seed in range(6, 12):
            await trio.to_thread.run_sync(infer_through_shm, fleet.target, regions, seed)
        assert fleet.workers[0].service.device.counters["simple"].requests_served >= 1
        # Unregistered through the gateway: a worker that restarts now gets none.
        await trio.to_thread.run_sync(client.unregister_system_shared_memory)
        fleet.workers[1].kill()
        await fleet.restart_worker(1)
        await wait_until_async(
            lambda: fleet.worker_url(1) in fleet.gateway.statistics().ready, what="back"
        )
        await trio.to_thread.run_sync(infer_through_plain, fleet.target)
        assert await trio.to_thread.run_sync(worker_regions, fleet) == [set(), set(), set()]
        client.close()


def infer_through_plain(target: str) -> None:
    """Calls that reach every worker (round robin), with no shared memory at all."""
    for seed in range(6):
        check_simple(target, seed)


async def test_register_with_every_worker_down_fails(
    regions: dict[str, tuple[str, object]],
) -> None:
    async with open_fleet(2, health_interval_seconds=60) as fleet:
        for worker in fleet.workers:
            worker.kill()
        client = grpcclient.InferenceServerClient(fleet.target)
        with pytest.raises(InferenceServerException) as caught:
            await trio.to_thread.run_sync(
                lambda: client.register_system_shared_memory(
                    "input_region", regions["in"][0], 2 * BYTES
                )
            )
        assert "FAILED_PRECONDITION" in str(caught.value.status())
        assert "failed on 2 of 2 workers" in caught.value.message()
        client.close()


async def test_register_a_missing_key_fails_everywhere() -> None:
    async with open_fleet(2, health_interval_seconds=60) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)
        with pytest.raises(InferenceServerException) as caught:
            await trio.to_thread.run_sync(
                lambda: client.register_system_shared_memory("r", "/rsgw_no_such_key", 64)
            )
        # Every worker refused the same way: the client's fault, passed on as such.
        assert "INVALID_ARGUMENT" in str(caught.value.status())
        assert "failed on 2 of 2 workers (worker0: unable to open" in caught.value.message()
        assert await trio.to_thread.run_sync(worker_regions, fleet) == [set(), set()]
        client.close()
