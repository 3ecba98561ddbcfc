"""Externally managed residency and the control RPCs' contracts (issue 3, acceptance 3).

On an externally managed worker only pinned models are servable: a model is
absent from RepositoryIndex(ready=true) until SetModelResidency pins it, and
gone again once it is unpinned; inference on it fails with FAILED_PRECONDITION
until then. Control commands run between batches, never during one: an unpin
asked while a batch runs answers only after that batch, and requests that
queued behind it fail instead of running without weights.

Runs on memory streams with the autojump clock (`tests.worker.client`): loads
and batches take their exact simulated time on the Trio clock and no wall time.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.worker._worker import WorkerConfig
from rsgw.worker.device._memory import DEFAULT_LOAD_BANDWIDTH
from rsgw.worker.device._weights import ResidencyMode
from tests.helpers import catalogue_from_yaml, infer_request, wait_until_async
from tests.worker.client import grpc_error, open_memory_worker

UNPINNED, PINNED_SYSTEM, PINNED_DEVICE = cpb.UNPINNED, cpb.PINNED_SYSTEM, cpb.PINNED_DEVICE
NOT_RESIDENT = (
    "model 'simple' is not resident on the device; the control plane must pin it before inference"
)

SLOW = catalogue_from_yaml(
    textwrap.dedent(
        """\
        models:
          - name: slow
            inputs: [{name: x, datatype: INT32, shape: [-1, 2]}]
            outputs: [{name: y, datatype: INT32, shape: [-1, 2]}]
            max_batch_size: 4
            launch_ms: 300
            weight_bytes: 1000
        """
    )
)


def _external(**overrides: object) -> WorkerConfig:
    settings: dict[str, object] = {
        "port": 0,
        "metrics_port": -1,
        "residency_mode": ResidencyMode.EXTERNALLY_MANAGED,
        "weight_cache_bytes": 1 << 30,
    }
    settings.update(overrides)
    return WorkerConfig(**settings)  # type: ignore[arg-type]


async def test_only_pinned_models_are_ready(autojump_clock: MockClock) -> None:
    async with open_memory_worker(_external()) as client:
        assert await client.ready_names() == []
        listed = await client.repository_index(ready=False)
        assert "simple" in dict(listed)
        assert {state for _, state in listed} == {"UNAVAILABLE"}
        assert not await client.model_ready("simple")
        code, details = await grpc_error(client.check_simple())
        assert (code, details) == (StatusCode.FAILED_PRECONDITION, NOT_RESIDENT)
        entry = await client.model_status("simple")
        assert (entry.residency, entry.device_resident, entry.host_resident) == (
            UNPINNED,
            False,
            False,
        )

        # Pinning pays the load (1 MiB at 8 GiB/s: about 0.1 ms) and flips readiness.
        started = trio.current_time()
        assert await client.set_residency("simple", PINNED_DEVICE) == PINNED_DEVICE
        elapsed = trio.current_time() - started
        assert elapsed == pytest.approx(entry.weight_nbytes / DEFAULT_LOAD_BANDWIDTH)
        assert await client.ready_names() == ["simple"]
        assert await client.model_ready("simple")
        await client.check_simple()
        entry = await client.model_status("simple")
        assert (entry.residency, entry.device_resident, entry.host_resident) == (
            PINNED_DEVICE,
            True,
            True,
        )
        assert client.device.memory.counters.loads == 1

        # Unpinning to the host floor, then dropping the host copy too.
        assert await client.set_residency("simple", PINNED_SYSTEM) == PINNED_SYSTEM
        assert await client.ready_names() == []
        entry = await client.model_status("simple")
        assert (entry.residency, entry.device_resident, entry.host_resident) == (
            PINNED_SYSTEM,
            False,
            True,
        )
        assert await client.set_residency("simple", UNPINNED) == UNPINNED
        code, _ = await grpc_error(client.check_simple())
        assert code == StatusCode.FAILED_PRECONDITION


async def test_a_meta_is_ready_once_all_its_submodels_are_pinned(
    autojump_clock: MockClock,
) -> None:
    async with open_memory_worker(_external()) as client:
        device = client.device
        device.memory.cache.pin("search_embedder")  # half pinned is not ready
        assert "search_pipeline" not in await client.ready_names()
        entry = await client.model_status("search_pipeline")
        assert (entry.residency, entry.device_resident) == (UNPINNED, False)

        pinned = await client.set_residency("search_pipeline", PINNED_DEVICE)
        assert pinned == PINNED_DEVICE
        assert await client.ready_names() == ["search_pipeline"]
        request = infer_request("search_pipeline", {"query_ids": np.zeros((2, 32), np.int64)})
        response = await client.infer(request)
        assert [list(o.shape) for o in response.outputs] == [[2, 10]]
        assert await client.set_residency("search_pipeline", UNPINNED) == UNPINNED
        assert not device.memory.cache.is_resident("search_scorer")


async def test_pins_given_at_start_are_ready_at_once(autojump_clock: MockClock) -> None:
    async with open_memory_worker(_external(pinned=frozenset({"simple"}))) as client:
        assert await client.ready_names() == ["simple"]


async def test_unpinning_waits_for_the_running_batch_and_fails_the_queued(
    autojump_clock: MockClock,
) -> None:
    config = _external(catalogue=SLOW, pinned=frozenset({"slow", "simple"}))
    async with open_memory_worker(config) as client:
        worker = client.worker
        device = client.device
        slow = infer_request("slow", {"x": np.zeros((1, 2), np.int32)})
        spec = SLOW.get("slow")
        assert spec is not None
        outcomes: dict[str, object] = {}
        started = trio.current_time()

        async def run_slow() -> None:
            outcomes["slow"] = await client.infer(slow)

        async def run_simple() -> None:
            try:
                await client.check_simple()
                outcomes["simple"] = StatusCode.OK
            except GrpcError as exc:
                outcomes["simple"] = exc.code

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_slow)
            await wait_until_async(
                lambda: worker.service.inflight == 1 and device.queue_depth("slow") == 0,
                what="the slow batch to start",
            )
            nursery.start_soon(run_simple)
            await wait_until_async(lambda: device.queue_depth("simple") == 1, what="queued")
            unpinned = await client.set_residency("simple", UNPINNED)
            # The command ran between batches: after the slow one finished, and
            # it answered as soon as that batch ended.
            assert device.counters["slow"].dispatch_count == 1
            assert trio.current_time() - started == pytest.approx(spec.execution_seconds(1))
        assert unpinned == UNPINNED
        assert outcomes["simple"] == StatusCode.FAILED_PRECONDITION
        assert device.counters["simple"].dispatch_count == 0


async def test_residency_errors(autojump_clock: MockClock) -> None:
    async with open_memory_worker(WorkerConfig(port=0, metrics_port=-1)) as client:
        code, details = await grpc_error(client.set_residency("simple", PINNED_DEVICE))
        assert code == StatusCode.FAILED_PRECONDITION
        assert "self_managed" in details
    async with open_memory_worker(_external()) as client:
        for model, residency, expected in [
            ("nope", PINNED_DEVICE, StatusCode.NOT_FOUND),
            ("search_embedder", PINNED_DEVICE, StatusCode.NOT_FOUND),  # internal
            ("simple", cpb.RESIDENCY_UNSPECIFIED, StatusCode.INVALID_ARGUMENT),
        ]:
            code, details = await grpc_error(client.set_residency(model, residency))
            assert code == expected, details
        assert "RESIDENCY_UNSPECIFIED" in details


async def test_set_model_policy_sets_the_fair_weight(autojump_clock: MockClock) -> None:
    async with open_memory_worker(WorkerConfig(port=0, metrics_port=-1)) as client:
        assert (await client.model_status("simple")).weight == 1.0
        await client.set_policy("simple", 2.5)
        assert (await client.model_status("simple")).weight == 2.5
        await client.set_policy("simple", 9.0, has_weight=False)
        assert (await client.model_status("simple")).weight == 2.5
        # A meta's weight is its sub-calls' weight.
        await client.set_policy("search_pipeline", 4.0)
        assert client.device.weight("search_scorer") == 4.0
        for model, weight, expected in [
            ("nope", 1.0, StatusCode.NOT_FOUND),
            ("search_scorer", 1.0, StatusCode.NOT_FOUND),
            ("simple", 0.0, StatusCode.INVALID_ARGUMENT),
            ("simple", -2.0, StatusCode.INVALID_ARGUMENT),
        ]:
            code, _ = await grpc_error(client.set_policy(model, weight))
            assert code == expected
        assert (await client.model_status("simple")).weight == 2.5


async def test_compact_memory_on_an_externally_managed_worker_reloads_nothing(
    autojump_clock: MockClock,
) -> None:
    async with open_memory_worker(_external(pinned=frozenset({"simple"}))) as client:
        assert await client.compact("simple_int8", "simple") == (0, 0)
        assert await client.ready_names() == ["simple"]
        assert client.device.memory.counters.compactions == 1


@pytest.mark.parametrize("model", ["search_embedder", "search_scorer"])
async def test_internal_submodels_are_invisible(model: str, autojump_clock: MockClock) -> None:
    async with open_memory_worker(WorkerConfig(port=0, metrics_port=-1)) as client:
        assert not await client.model_ready(model)
        names = [n for n, _ in await client.repository_index(ready=False)]
        assert model not in names and "search_pipeline" in names
        request = infer_request(model, {"x": np.zeros((1, 2), np.int32)})
        code, details = await grpc_error(client.infer(request))
        assert (code, details) == (
            StatusCode.NOT_FOUND,
            f"Request for unknown model: '{model}' is not found",
        )
