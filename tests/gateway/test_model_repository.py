"""Triton's explicit model control and CUDA shared memory through the gateway.

With tritonclient against a real fleet on loopback: load and unload fan out to
the workers that should hold the model (all or nothing for a load, undone where
it succeeded if any worker failed; any worker for an unload), and the call
answers only once the gateway's routing agrees. CUDA shared memory fans out like
system shared memory; simulated workers have no CUDA, so a register is refused
everywhere with their reason.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from rsgw.worker.models._catalogue import builtin_catalogue
from tests.gateway.fleet import open_fleet
from tests.helpers import catalogue_from_yaml

EXTRA = catalogue_from_yaml(
    textwrap.dedent(
        """\
        models:
          - name: extra
            inputs: [{name: x, datatype: INT32, shape: [-1, 2]}]
            outputs: [{name: y, datatype: INT32, shape: [-1, 2]}]
            max_batch_size: 4
        """
    )
)


def _infer_simple(client: grpcclient.InferenceServerClient) -> None:
    inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[0], 2 * np.arange(16))


async def test_unload_and_load_through_the_gateway() -> None:
    async with open_fleet(3, health_interval_seconds=60) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)

        def scenario() -> None:
            _infer_simple(client)
            client.unload_model("simple")
            # Answered once routing agrees: gone at once, no waiting for a probe round.
            assert not client.is_model_ready("simple")
            index = {
                m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]
            }
            assert (index["simple"]["state"], index["simple"]["reason"]) == (
                "UNAVAILABLE",
                "unloaded",
            )
            with pytest.raises(InferenceServerException) as caught:
                _infer_simple(client)
            # Known to the fleet, served by no worker now: UNAVAILABLE, as Triton says.
            assert "StatusCode.UNAVAILABLE" in str(caught.value.status())
            assert "'simple'" in str(caught.value.message())
            client.load_model("simple")
            assert client.is_model_ready("simple")
            _infer_simple(client)

        await trio.to_thread.run_sync(scenario)
        for worker in fleet.workers:
            assert not worker.service.device.memory.unloaded
        client.close()


async def test_a_load_that_fails_somewhere_is_undone_everywhere() -> None:
    # worker2 has no `extra`: a load succeeds on worker0 and worker1, fails on worker2.
    catalogues = [EXTRA, EXTRA, builtin_catalogue()]
    async with open_fleet(3, catalogues=catalogues, health_interval_seconds=60) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)
        await trio.to_thread.run_sync(client.unload_model, "extra")  # worker2's NOT_FOUND is fine
        with pytest.raises(InferenceServerException) as caught:
            await trio.to_thread.run_sync(client.load_model, "extra")
        assert "FAILED_PRECONDITION" in str(caught.value.status())
        assert caught.value.message() == (
            "RepositoryModelLoad failed on 1 of 3 workers "
            "(worker2: failed to load 'extra', no such model in the repository)"
        )
        # Undone: still unloaded on the workers where the load had succeeded.
        assert [w.service.device.memory.unloaded for w in fleet.workers] == [
            {"extra"},
            {"extra"},
            set(),
        ]
        assert not await trio.to_thread.run_sync(client.is_model_ready, "extra")
        client.close()


async def test_unknown_models_are_not_found_everywhere() -> None:
    async with open_fleet(2, health_interval_seconds=60) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)
        for action in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as caught:
                await trio.to_thread.run_sync(action, "nope")
            assert "NOT_FOUND" in str(caught.value.status())
            assert "no such model in the repository" in caught.value.message()
        client.close()


async def test_cuda_shared_memory_through_the_gateway() -> None:
    async with open_fleet(2, health_interval_seconds=60) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)
        status = await trio.to_thread.run_sync(
            lambda: client.get_cuda_shared_memory_status(as_json=True)
        )
        assert status == {}
        with pytest.raises(InferenceServerException) as caught:
            await trio.to_thread.run_sync(
                lambda: client.register_cuda_shared_memory("r", b"aGFuZGxl", 0, 64)
            )
        assert "FAILED_PRECONDITION" in str(caught.value.status())
        assert "failed on 2 of 2 workers" in caught.value.message()
        assert "has no CUDA; use system shared memory" in caught.value.message()
        await trio.to_thread.run_sync(client.unregister_cuda_shared_memory)
        client.close()
