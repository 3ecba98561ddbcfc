"""The gateway end to end: tritonclient -> gateway -> simulated workers, real sockets."""

from __future__ import annotations

import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from rsgw.worker.models._catalogue import builtin_catalogue, parse_catalogue
from tests.gateway.fleet import open_fleet
from tests.helpers import simple_model


def infer_simple(target: str, model: str = "simple", seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32)
    client = grpcclient.InferenceServerClient(target)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    client.close()


def served_counts(fleet_workers: list, model: str) -> list[int]:  # type: ignore[type-arg]
    return [w.service.device.counters[model].requests_served for w in fleet_workers]


async def test_simple_round_robin_over_three_workers() -> None:
    async with open_fleet(3, health_interval_seconds=60) as fleet:
        for i in range(30):
            await trio.to_thread.run_sync(infer_simple, fleet.target, "simple", i)
        counts = served_counts(fleet.workers, "simple")
        assert sum(counts) == 30
        assert max(counts) - min(counts) <= 1


async def test_model_on_one_worker_always_goes_there() -> None:
    only = parse_catalogue(
        {
            "models": [
                simple_model(name="solo"),
            ]
        },
        source="test",
    )
    catalogues = [builtin_catalogue(), only, builtin_catalogue()]
    async with open_fleet(3, catalogues=catalogues, health_interval_seconds=60) as fleet:
        for i in range(6):
            await trio.to_thread.run_sync(infer_simple, fleet.target, "solo", i)
        assert fleet.workers[1].service.device.counters["solo"].requests_served == 6


async def test_unknown_model_is_not_found_naming_it() -> None:
    async with open_fleet(2) as fleet:

        def call() -> None:
            infer_simple(fleet.target, "no_such_model")

        with pytest.raises(InferenceServerException) as caught:
            await trio.to_thread.run_sync(call)
        assert "StatusCode.NOT_FOUND" in str(caught.value.status())
        assert caught.value.message() == "Request for unknown model: 'no_such_model' is not found"
