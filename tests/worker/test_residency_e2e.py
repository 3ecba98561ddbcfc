"""Externally managed residency and the control RPCs' contracts (issue 3, acceptance 3).

On an externally managed worker only pinned models are servable: a model is
absent from RepositoryIndex(ready=true) until SetModelResidency pins it, and
gone again once it is unpinned; inference on it fails with FAILED_PRECONDITION
until then. Control commands run between batches, never during one: an unpin
asked while a batch runs answers only after that batch, and requests that
queued behind it fail instead of running without weights.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from functools import partial

import grpc
import numpy as np
import pytest
import trio

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.worker._weights import ResidencyMode
from rsgw.worker._worker import RunningWorker, WorkerConfig, open_worker
from tests.helpers import (
    catalogue_from_yaml,
    check_simple,
    in_thread,
    infer_request,
    model_infer,
    model_status,
    wait_until_async,
)
from tests.worker.control import (
    compact,
    model_ready,
    repository_index,
    rpc_error,
    set_residency,
    set_weight,
)

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


def _target(worker: RunningWorker) -> str:
    return f"127.0.0.1:{worker.grpc_port}"


def _ready_names(target: str) -> list[str]:
    return [name for name, _ in repository_index(target, ready=True)]


async def test_only_pinned_models_are_ready() -> None:
    async with open_worker(_external()) as worker:
        target = _target(worker)
        assert await in_thread(partial(_ready_names, target)) == []
        listed = await in_thread(partial(repository_index, target, ready=False))
        assert "simple" in dict(listed)
        assert {state for _, state in listed} == {"UNAVAILABLE"}
        assert not await in_thread(partial(model_ready, target, "simple"))
        code, details = await in_thread(partial(rpc_error, partial(check_simple, target)))
        assert (code, details) == (grpc.StatusCode.FAILED_PRECONDITION, NOT_RESIDENT)
        entry = await in_thread(partial(model_status, target, "simple"))
        assert (entry.residency, entry.device_resident, entry.host_resident) == (
            UNPINNED,
            False,
            False,
        )

        # Pinning pays the load (1 MiB at 8 GiB/s: about 0.1 ms) and flips readiness.
        assert await in_thread(partial(set_residency, target, "simple", PINNED_DEVICE)) == (
            PINNED_DEVICE
        )
        assert await in_thread(partial(_ready_names, target)) == ["simple"]
        assert await in_thread(partial(model_ready, target, "simple"))
        await in_thread(partial(check_simple, target))
        entry = await in_thread(partial(model_status, target, "simple"))
        assert (entry.residency, entry.device_resident, entry.host_resident) == (
            PINNED_DEVICE,
            True,
            True,
        )
        assert worker.service.device.memory.counters.loads == 1

        # Unpinning to the host floor, then dropping the host copy too.
        assert await in_thread(partial(set_residency, target, "simple", PINNED_SYSTEM)) == (
            PINNED_SYSTEM
        )
        assert await in_thread(partial(_ready_names, target)) == []
        entry = await in_thread(partial(model_status, target, "simple"))
        assert (entry.residency, entry.device_resident, entry.host_resident) == (
            PINNED_SYSTEM,
            False,
            True,
        )
        assert await in_thread(partial(set_residency, target, "simple", UNPINNED)) == UNPINNED
        code, _ = await in_thread(partial(rpc_error, partial(check_simple, target)))
        assert code == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_meta_is_ready_once_all_its_submodels_are_pinned() -> None:
    async with open_worker(_external()) as worker:
        target = _target(worker)
        device = worker.service.device
        device.memory.cache.pin("search_embedder")  # half pinned is not ready
        assert "search_pipeline" not in await in_thread(partial(_ready_names, target))
        entry = await in_thread(partial(model_status, target, "search_pipeline"))
        assert (entry.residency, entry.device_resident) == (UNPINNED, False)

        pinned = await in_thread(partial(set_residency, target, "search_pipeline", PINNED_DEVICE))
        assert pinned == PINNED_DEVICE
        assert await in_thread(partial(_ready_names, target)) == ["search_pipeline"]
        request = infer_request("search_pipeline", {"query_ids": np.zeros((2, 32), np.int64)})
        response = await in_thread(partial(model_infer, target, request))
        assert [list(o.shape) for o in response.outputs] == [[2, 10]]
        assert await in_thread(partial(set_residency, target, "search_pipeline", UNPINNED)) == (
            UNPINNED
        )
        assert not device.memory.cache.is_resident("search_scorer")


async def test_pins_given_at_start_are_ready_at_once() -> None:
    async with open_worker(_external(pinned=frozenset({"simple"}))) as worker:
        assert await in_thread(partial(_ready_names, _target(worker))) == ["simple"]


async def test_unpinning_waits_for_the_running_batch_and_fails_the_queued() -> None:
    config = _external(catalogue=SLOW, pinned=frozenset({"slow", "simple"}))
    async with open_worker(config) as worker:
        target = _target(worker)
        device = worker.service.device
        slow = infer_request("slow", {"x": np.zeros((1, 2), np.int32)})
        outcomes: dict[str, object] = {}

        async def run(name: str, fn: Callable[[], object]) -> None:
            try:
                outcomes[name] = await in_thread(fn)
            except grpc.RpcError as exc:
                outcomes[name] = exc.code()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "slow", partial(model_infer, target, slow))
            await wait_until_async(
                lambda: worker.service.inflight == 1 and device.queue_depth("slow") == 0,
                what="the slow batch to start",
            )
            nursery.start_soon(run, "simple", partial(check_simple, target))
            await wait_until_async(lambda: device.queue_depth("simple") == 1, what="queued")
            unpinned = await in_thread(partial(set_residency, target, "simple", UNPINNED))
            # The command ran between batches: after the slow one finished.
            assert device.counters["slow"].dispatch_count == 1
        assert unpinned == UNPINNED
        assert outcomes["simple"] == grpc.StatusCode.FAILED_PRECONDITION
        assert device.counters["simple"].dispatch_count == 0


async def test_residency_errors() -> None:
    async with open_worker(WorkerConfig(port=0, metrics_port=-1)) as worker:
        target = _target(worker)
        code, details = await in_thread(
            partial(rpc_error, partial(set_residency, target, "simple", PINNED_DEVICE))
        )
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "self_managed" in details
    async with open_worker(_external()) as worker:
        target = _target(worker)
        for model, residency, expected in [
            ("nope", PINNED_DEVICE, grpc.StatusCode.NOT_FOUND),
            ("search_embedder", PINNED_DEVICE, grpc.StatusCode.NOT_FOUND),  # internal
            ("simple", cpb.RESIDENCY_UNSPECIFIED, grpc.StatusCode.INVALID_ARGUMENT),
        ]:
            code, details = await in_thread(
                partial(rpc_error, partial(set_residency, target, model, residency))
            )
            assert code == expected, details
        assert "RESIDENCY_UNSPECIFIED" in details


async def test_set_model_policy_sets_the_fair_weight() -> None:
    async with open_worker(WorkerConfig(port=0, metrics_port=-1)) as worker:
        target = _target(worker)
        assert (await in_thread(partial(model_status, target, "simple"))).weight == 1.0
        await in_thread(partial(set_weight, target, "simple", 2.5))
        assert (await in_thread(partial(model_status, target, "simple"))).weight == 2.5
        await in_thread(partial(set_weight, target, "simple", 9.0, has_weight=False))
        assert (await in_thread(partial(model_status, target, "simple"))).weight == 2.5
        # A meta's weight is its sub-calls' weight.
        await in_thread(partial(set_weight, target, "search_pipeline", 4.0))
        assert worker.service.device.weight("search_scorer") == 4.0
        for model, weight, expected in [
            ("nope", 1.0, grpc.StatusCode.NOT_FOUND),
            ("search_scorer", 1.0, grpc.StatusCode.NOT_FOUND),
            ("simple", 0.0, grpc.StatusCode.INVALID_ARGUMENT),
            ("simple", -2.0, grpc.StatusCode.INVALID_ARGUMENT),
        ]:
            code, _ = await in_thread(
                partial(rpc_error, partial(set_weight, target, model, weight))
            )
            assert code == expected
        assert (await in_thread(partial(model_status, target, "simple"))).weight == 2.5


async def test_compact_memory_on_an_externally_managed_worker_reloads_nothing() -> None:
    async with open_worker(_external(pinned=frozenset({"simple"}))) as worker:
        target = _target(worker)
        assert await in_thread(partial(compact, target, "simple_int8", "simple")) == (0, 0)
        assert await in_thread(partial(_ready_names, target)) == ["simple"]
        assert worker.service.device.memory.counters.compactions == 1


@pytest.mark.parametrize("model", ["search_embedder", "search_scorer"])
async def test_internal_submodels_are_invisible(model: str) -> None:
    async with open_worker(WorkerConfig(port=0, metrics_port=-1)) as worker:
        target = _target(worker)
        assert not await in_thread(partial(model_ready, target, model))
        names = [n for n, _ in await in_thread(partial(repository_index, target, ready=False))]
        assert model not in names and "search_pipeline" in names
        request = infer_request(model, {"x": np.zeros((1, 2), np.int32)})
        code, details = await in_thread(partial(rpc_error, partial(model_infer, target, request)))
        assert (code, details) == (grpc.StatusCode.NOT_FOUND, f"unknown model: {model}")
