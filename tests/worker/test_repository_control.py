"""Triton's explicit model control and CUDA shared memory on the simulated worker.

RepositoryModelUnload takes a model away until RepositoryModelLoad brings it
back: listed UNAVAILABLE ("unloaded"), not ready, UNAVAILABLE to every call
naming it (in Triton's words), its queued requests failed, its weights freed. The
worker has no CUDA: registering a CUDA region is refused with a reason, status
and unregister answer as for a server with none registered.

Memory streams and the autojump clock (`tests.worker.client`).
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import ConfigError, GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.worker._worker import WorkerConfig
from rsgw.worker.device._memory import DeviceMemory
from tests.helpers import catalogue_from_yaml, infer_request, output_array, wait_until_async
from tests.worker.client import WorkerClient, grpc_error, open_memory_worker
from tests.worker.test_residency_e2e import SLOW

GONE = "Request for unknown model: 'simple' has no available versions"


async def _load(client: WorkerClient, model: str, **parameters: str) -> None:
    request = pb.RepositoryModelLoadRequest(model_name=model)
    for key, value in parameters.items():
        request.parameters[key].string_param = value
    await client.call(Method.REPOSITORY_MODEL_LOAD, request, pb.RepositoryModelLoadResponse)


async def _unload(client: WorkerClient, model: str) -> None:
    request = pb.RepositoryModelUnloadRequest(model_name=model)
    await client.call(Method.REPOSITORY_MODEL_UNLOAD, request, pb.RepositoryModelUnloadResponse)


async def _index_row(client: WorkerClient, model: str) -> pb.RepositoryIndexResponse.ModelIndex:
    response = await client.call(
        Method.REPOSITORY_INDEX, pb.RepositoryIndexRequest(), pb.RepositoryIndexResponse
    )
    return next(row for row in response.models if row.name == model)


def _config(**overrides: object) -> WorkerConfig:
    return WorkerConfig(port=0, metrics_port=-1, **overrides)  # type: ignore[arg-type]


async def test_unload_then_load(autojump_clock: MockClock) -> None:
    async with open_memory_worker(_config()) as client:
        await client.check_simple()
        await _unload(client, "simple")
        await _unload(client, "simple")  # idempotent, as Triton's is

        row = await _index_row(client, "simple")
        assert (row.state, row.reason, row.version) == ("UNAVAILABLE", "unloaded", "1")
        assert "simple" not in await client.ready_names()
        assert not await client.model_ready("simple")
        assert await grpc_error(client.check_simple()) == (StatusCode.UNAVAILABLE, GONE)
        assert await grpc_error(client.model_metadata("simple")) == (StatusCode.UNAVAILABLE, GONE)
        config = client.call(
            Method.MODEL_CONFIG, pb.ModelConfigRequest(name="simple"), pb.ModelConfigResponse
        )
        assert await grpc_error(config) == (StatusCode.UNAVAILABLE, GONE)
        stats = await client.call(
            Method.MODEL_STATISTICS, pb.ModelStatisticsRequest(), pb.ModelStatisticsResponse
        )
        assert "simple" not in {s.name for s in stats.model_stats}
        assert "simple" not in await client.statuses()
        assert "simple" not in client.device.memory.cache.resident_models()

        await _load(client, "simple")
        await _load(client, "simple")
        row = await _index_row(client, "simple")
        assert (row.state, row.reason) == ("READY", "")
        await client.check_simple()


async def test_a_load_puts_the_weights_on_the_device_before_it_answers(
    autojump_clock: MockClock,
) -> None:
    # As Triton's load returns once the model can serve: the first call after it pays
    # no weight load (a worker with a weight cache, self-managed).
    async with open_memory_worker(_config(weight_cache_bytes=10**9)) as client:
        memory = client.device.memory
        await _unload(client, "simple")
        assert "simple" not in memory.cache.resident_models()
        loads = memory.counters.loads
        await _load(client, "simple")
        assert "simple" in memory.cache.resident_models()
        assert memory.counters.loads == loads + 1
        await client.check_simple()
        assert memory.counters.loads == loads + 1


async def test_unload_fails_the_queued_requests(autojump_clock: MockClock) -> None:
    """Queued behind a running batch, they fail UNAVAILABLE; the running batch completes."""
    async with open_memory_worker(_config(catalogue=SLOW)) as client:
        device = client.device
        outcomes: list[StatusCode] = []

        async def run_slow() -> None:
            try:
                await client.infer(infer_request("slow", {"x": np.zeros((1, 2), np.int32)}))
                outcomes.append(StatusCode.OK)
            except GrpcError as exc:
                outcomes.append(exc.code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_slow)
            await wait_until_async(
                lambda: client.worker.service.inflight == 1 and device.queue_depth("slow") == 0,
                what="the first batch to start",
            )
            nursery.start_soon(run_slow)
            await wait_until_async(lambda: device.queue_depth("slow") == 1, what="queued")
            await _unload(client, "slow")
        assert sorted(outcomes) == [StatusCode.OK, StatusCode.UNAVAILABLE]
        assert device.counters["slow"].requests_served == 1


async def test_load_and_unload_errors(autojump_clock: MockClock) -> None:
    async with open_memory_worker(_config()) as client:
        assert await grpc_error(_load(client, "nope")) == (
            StatusCode.NOT_FOUND,
            "failed to load 'nope', no such model in the repository",
        )
        assert await grpc_error(_unload(client, "nope")) == (
            StatusCode.NOT_FOUND,
            "failed to unload 'nope', no such model in the repository",
        )
        # An internal sub-model of a meta is not a model a client can name.
        assert (await grpc_error(_unload(client, "search_embedder")))[0] == StatusCode.NOT_FOUND


async def _max_batch_size(client: WorkerClient, model: str) -> int:
    request = pb.ModelConfigRequest(name=model)
    response = await client.call(Method.MODEL_CONFIG, request, pb.ModelConfigResponse)
    return response.config.max_batch_size


async def test_load_with_a_config_override(autojump_clock: MockClock) -> None:
    async with open_memory_worker(_config()) as client:
        await _load(client, "simple", config='{"max_batch_size":"16"}')
        assert await _max_batch_size(client, "simple") == 16
        rows = np.arange(12 * 16, dtype=np.int32).reshape(12, 16)
        response = await client.infer(infer_request("simple", {"INPUT0": rows, "INPUT1": rows}))
        assert output_array(response, "OUTPUT0").shape == (12, 16)  # over the old max of 8
        await _load(client, "simple", config="{}")  # an empty override: as configured
        assert await _max_batch_size(client, "simple") == 8
        await _load(client, "simple", config='{"max_batch_size": 4, "name": "simple"}')
        assert await _max_batch_size(client, "simple") == 4
        await _load(client, "simple")  # no override: the catalogue's again
        assert await _max_batch_size(client, "simple") == 8
        for config, why in [
            ('"parameters": {"config": {{"max_batch_size": "16"}}}', "not valid JSON"),
            ("[1]", "must be a JSON object"),
            ('{"instance_group": []}', "may override max_batch_size only"),
            ('{"max_batch_size": -1}', "must be an integer >= 0"),
        ]:
            code, message = await grpc_error(_load(client, "simple", config=config))
            assert code is StatusCode.INVALID_ARGUMENT
            assert message.startswith("failed to load 'simple'") and why in message
        assert await _max_batch_size(client, "simple") == 8  # a failed load changes nothing
        code, message = await grpc_error(
            _load(client, "densenet_onnx", config='{"max_batch_size": 2}')
        )
        assert "no leading batch dimension" in message


async def test_model_files_are_refused_as_triton_refuses_an_unreadable_repository(
    autojump_clock: MockClock,
) -> None:
    async with open_memory_worker(_config()) as client:
        request = pb.RepositoryModelLoadRequest(model_name="simple")
        request.parameters["config"].string_param = "{}"
        request.parameters["file:" + "A" * 256].bytes_param = b"a"
        code, message = await grpc_error(
            client.call(Method.REPOSITORY_MODEL_LOAD, request, pb.RepositoryModelLoadResponse)
        )
        assert code is StatusCode.INTERNAL
        assert "failed to poll from model repository" in message
        assert await client.model_ready("simple")  # still serving


TWO_METAS = catalogue_from_yaml(
    textwrap.dedent(
        """\
        models:
          - {name: first, kind: meta, submodels: [shared, own],
             inputs: [{name: x, datatype: INT32, shape: [-1, 2]}],
             outputs: [{name: y, datatype: INT32, shape: [-1, 2]}]}
          - {name: second, kind: meta, submodels: [shared],
             inputs: [{name: x, datatype: INT32, shape: [-1, 2]}],
             outputs: [{name: y, datatype: INT32, shape: [-1, 2]}]}
          - {name: shared, weight_bytes: 1000,
             inputs: [{name: x, datatype: INT32, shape: [-1, 2]}],
             outputs: [{name: y, datatype: INT32, shape: [-1, 2]}]}
          - {name: own, weight_bytes: 1000,
             inputs: [{name: x, datatype: INT32, shape: [-1, 2]}],
             outputs: [{name: y, datatype: INT32, shape: [-1, 2]}]}
        """
    ),
    with_builtin=False,
)


async def test_a_meta_unload_frees_only_what_no_loaded_model_uses(
    autojump_clock: MockClock,
) -> None:
    async with open_memory_worker(_config(catalogue=TWO_METAS)) as client:
        cache = client.device.memory.cache
        assert set(cache.resident_models()) == {"shared", "own"}
        await _unload(client, "first")
        assert set(cache.resident_models()) == {"shared"}  # `second` still uses it
        await _unload(client, "second")
        assert set(cache.resident_models()) == set()
        await _load(client, "first")
        assert set(cache.resident_models()) == {"shared", "own"}
        assert await client.ready_names() == ["first"]


async def test_cuda_shared_memory_on_a_worker_without_cuda(autojump_clock: MockClock) -> None:
    async with open_memory_worker(_config()) as client:
        register = pb.CudaSharedMemoryRegisterRequest(name="r", raw_handle=b"x", byte_size=8)
        code, message = await grpc_error(
            client.call(Method.CUDA_SHM_REGISTER, register, pb.CudaSharedMemoryRegisterResponse)
        )
        assert code == StatusCode.FAILED_PRECONDITION
        assert "has no CUDA; use system shared memory" in message
        status = await client.call(
            Method.CUDA_SHM_STATUS,
            pb.CudaSharedMemoryStatusRequest(),
            pb.CudaSharedMemoryStatusResponse,
        )
        assert not status.regions
        named = client.call(
            Method.CUDA_SHM_STATUS,
            pb.CudaSharedMemoryStatusRequest(name="r"),
            pb.CudaSharedMemoryStatusResponse,
        )
        assert (await grpc_error(named))[0] == StatusCode.NOT_FOUND
        await client.call(
            Method.CUDA_SHM_UNREGISTER,
            pb.CudaSharedMemoryUnregisterRequest(),
            pb.CudaSharedMemoryUnregisterResponse,
        )


GPU_MODELS = textwrap.dedent(
    """
    models:
      - name: big_a
        inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
        outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
        max_batch_size: 8
        weight_bytes: 400
      - name: big_b
        inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
        outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
        max_batch_size: 8
        weight_bytes: 400
      - name: small
        inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
        outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
        max_batch_size: 8
        weight_bytes: 100
    """
)


async def test_explicit_control_and_a_gpu_memory_that_a_load_cannot_pass(
    autojump_clock: MockClock,
) -> None:
    """`--model-control-mode explicit --load-model big_a --gpu-memory-bytes 600`: only
    big_a is loaded at start; small fits beside it; big_b does not, and its load fails
    INTERNAL as Triton's does when CUDA runs out of memory, leaving it unloaded; once
    big_a is unloaded, big_b loads (issue 49: overcommit shows up, it never passes)."""
    config = _config(
        catalogue=catalogue_from_yaml(GPU_MODELS, with_builtin=False),
        loaded_at_start=frozenset({"big_a"}),
        gpu_memory_bytes=600,
    )
    async with open_memory_worker(config) as client:
        assert await client.model_ready("big_a")
        row = await _index_row(client, "big_b")
        assert (row.state, row.reason) == ("UNAVAILABLE", "unloaded")
        await _load(client, "small")
        code, message = await grpc_error(_load(client, "big_b"))
        assert code is StatusCode.INTERNAL
        assert message == (
            "failed to load 'big_b' version 1: Internal: out of memory: its weights need 400 "
            "bytes of GPU memory and 100 of 600 are free (500 in use by the loaded models)"
        )
        assert not await client.model_ready("big_b")
        await _unload(client, "big_a")
        await _load(client, "big_b")
        assert await client.model_ready("big_b")
        assert client.device.memory.loaded_bytes() == 500


def test_models_loaded_at_start_past_the_gpu_memory_are_a_config_error() -> None:
    catalogue = catalogue_from_yaml(GPU_MODELS, with_builtin=False)
    with pytest.raises(ConfigError, match="take 900 bytes of weights, more than the GPU memory"):
        DeviceMemory(catalogue, gpu_memory_bytes=600)
    with pytest.raises(ConfigError, match="--load-model nope: no such model"):
        DeviceMemory(catalogue, loaded_at_start={"nope"})
