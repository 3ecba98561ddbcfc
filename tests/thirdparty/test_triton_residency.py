"""More models than GPU memory in front of real Triton servers (issue 49, acceptance 1-3).

Two real Triton 2.51 servers (nvidia-pytriton's `tritonserver`, CPU, Python backend) in
explicit model control, sixteen handed models whose loads take 0.3 s, and budgets that
hold four on each. What each server holds is read from the server itself
(RepositoryIndex, READY) every half second, during start-up and during skewed traffic
from eight `tritonclient.grpc` callers: never more than four, and no call fails.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
import trio
import trio.lowlevel
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from rsgw import open_gateway
from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.config._config import GatewayConfig, ListenConfig, SchedulingConfig, SchedulingMode
from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.gateway._running import RunningGateway
from tests.helpers import Samples, early_evictions
from tests.thirdparty import triton

MODELS = tuple(f"m{i:02d}" for i in range(16))
WEIGHT = 100_000_000
BUDGET = 4 * WEIGHT
LOAD_SECONDS = 0.3
MIN_RESIDENCY = 3.0
#: The skewed traffic's length (the issue asks for a minute; the CI runs half).
TRAFFIC_SECONDS = 30.0
HOT = ("m03", "m07", "m11")
#: Two processes on two cores: the same unload and load vary by this much run to run.
NOISE = 0.25


@pytest.fixture(scope="module")
def tritons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[triton.TritonProcess]]:
    """Two real Tritons, nothing loaded, each with the sixteen models in its repository."""
    if not triton.available():
        pytest.skip(triton.MISSING)
    servers = []
    try:
        for index in range(2):
            workdir = tmp_path_factory.mktemp(f"triton{index}")
            models = [triton.TritonModel(m, load_seconds=LOAD_SECONDS) for m in MODELS]
            repository = triton.write_repository(workdir / "models", models)
            servers.append(triton.start_triton(repository, workdir, explicit=True))
        yield servers
    finally:
        for server in servers:
            server.stop()


def ready_on(server: triton.TritonProcess) -> set[str]:
    """What the server itself says is READY."""
    with grpc.insecure_channel(server.target) as channel:
        index = channel.unary_unary(
            "/inference.GRPCInferenceService/RepositoryIndex",
            request_serializer=pb.RepositoryIndexRequest.SerializeToString,
            response_deserializer=pb.RepositoryIndexResponse.FromString,
        )
        reply = index(pb.RepositoryIndexRequest(ready=False), timeout=10)
    return {m.name for m in reply.models if m.state == "READY"}


def unload_everything(servers: list[triton.TritonProcess]) -> None:
    for server in servers:
        client = grpcclient.InferenceServerClient(server.target)
        for model in ready_on(server):
            client.unload_model(model)
        client.close()


@asynccontextmanager
async def gateway_before(
    servers: list[triton.TritonProcess], tmp_path: Path
) -> AsyncIterator[RunningGateway]:
    await trio.to_thread.run_sync(unload_everything, servers)
    config = GatewayConfig(
        endpoints=tuple(s.target for s in servers),
        worker_names=("gpu0", "gpu1"),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
        scheduling=SchedulingConfig(mode=SchedulingMode.LPT_PACKING),
        repository=RepositoryConfig(
            models=MODELS,
            default_weight_bytes=WEIGHT,
            worker_budget_bytes=BUDGET,
            min_residency_seconds=MIN_RESIDENCY,
            drain_seconds=5.0,
        ),
        health_interval_seconds=0.5,
    )
    async with open_gateway(config) as gateway:
        yield gateway


class Sampler:
    """Every half second, what each server says it holds."""

    def __init__(self, servers: list[triton.TritonProcess]) -> None:
        self.servers = servers
        self.samples: Samples = []

    async def run(self) -> None:
        while True:
            held = [await trio.to_thread.run_sync(ready_on, s) for s in self.servers]
            self.samples.append((time.monotonic(), held))

            await trio.sleep(0.5)

    @property
    def most(self) -> int:
        return max((len(h) for _, held in self.samples for h in held), default=0)

    def evictions_within(self, seconds: float, placed: float) -> list[tuple[str, int, float]]:
        """Copies gone sooner than `seconds` after first seen, but for start-up's (seen
        by the first sample after `placed`, when its placement was carried out)."""
        start = min(at for at, _ in self.samples if at > placed)
        return early_evictions(self.samples, seconds, start, 0.6)

    async def sampled_after(self, moment: float) -> None:
        """Wait (on the samples, within 30 s) for a sample taken after `moment`."""
        with trio.fail_after(30):
            while not self.samples or self.samples[-1][0] <= moment:  # noqa: ASYNC110
                await trio.sleep(0.05)


def swap_directly(server: triton.TritonProcess, gone: str, new: str) -> float:
    """Seconds Triton itself takes to unload `gone` (until it is no longer READY or
    UNLOADING) and load `new` in its place; both unloaded again after."""
    client = grpcclient.InferenceServerClient(server.target)
    try:
        client.load_model(gone)
        started = time.monotonic()
        client.unload_model(gone)
        while gone in holding(server):
            time.sleep(0.01)
        client.load_model(new)
        took = time.monotonic() - started
        client.unload_model(new)
        while new in holding(server):
            time.sleep(0.01)
    finally:
        client.close()
    return took


def holding(server: triton.TritonProcess) -> set[str]:
    """The models the server holds memory for (READY, LOADING or UNLOADING)."""
    with grpc.insecure_channel(server.target) as channel:
        index = channel.unary_unary(
            "/inference.GRPCInferenceService/RepositoryIndex",
            request_serializer=pb.RepositoryIndexRequest.SerializeToString,
            response_deserializer=pb.RepositoryIndexResponse.FromString,
        )
        reply = index(pb.RepositoryIndexRequest(ready=False), timeout=10)
    return {m.name for m in reply.models if m.state in ("READY", "LOADING", "UNLOADING")}


def infer(target: str, model: str, seed: int, timeout: float = 60.0) -> None:
    """One ModelInfer through the gateway with tritonclient, its answer checked."""
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32) for _ in range(2))
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    client = grpcclient.InferenceServerClient(target)
    try:
        result = client.infer(model, inputs, client_timeout=timeout)
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


async def test_sixteen_models_on_two_tritons_that_hold_four_each(
    tritons: list[triton.TritonProcess], tmp_path: Path
) -> None:
    # What an unload and a load take asked of Triton directly (before the gateway runs).
    await trio.to_thread.run_sync(unload_everything, tritons)
    own = await trio.to_thread.run_sync(swap_directly, tritons[0], "m14", "m15")
    sampler = Sampler(tritons)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler.run)
        await sampler.sampled_after(time.monotonic())  # before the gateway starts
        async with gateway_before(tritons, tmp_path) as gateway:
            target = f"127.0.0.1:{gateway.grpc_port}"
            packing = gateway._packing
            assert packing is not None
            with trio.fail_after(120):
                await packing.placer.wait_carried(1)
            placed = time.monotonic()
            await sampler.sampled_after(placed)  # one of start-up's placement
            held = [await trio.to_thread.run_sync(ready_on, s) for s in tritons]
            assert [len(h) for h in held] == [4, 4]

            # Acceptance 2: a cold call is answered within its eviction and load, plus
            # 100 ms; eight simultaneous first calls for another load it once.
            cold = sorted(set(MODELS) - held[0] - held[1])
            call = functools.partial(infer, target)
            started = time.monotonic()
            await trio.to_thread.run_sync(call, cold[0], 1)
            waited = time.monotonic() - started
            assert waited < own + 0.1 + NOISE, (waited, own)
            async with trio.open_nursery() as burst:
                for seed in range(8):
                    burst.start_soon(trio.to_thread.run_sync, call, cold[1], seed)
            holders = [cold[1] in await trio.to_thread.run_sync(ready_on, s) for s in tritons]
            assert holders.count(True) == 1
            # A call whose deadline cannot cover the load is refused at once.
            started = time.monotonic()
            with pytest.raises(InferenceServerException) as caught:
                await trio.to_thread.run_sync(
                    functools.partial(infer, target, cold[2], 3, timeout=LOAD_SECONDS / 3)
                )
            assert "is not loaded on any worker; loading it takes about" in str(caught.value)

            # Acceptance 1 and 3: skewed traffic from eight callers.
            failures: list[BaseException] = []
            calls = 0

            def caller(index: int, stop: float) -> None:
                nonlocal calls
                rng = random.Random(index)
                tail = [m for m in MODELS if m not in HOT]
                while time.monotonic() < stop:
                    model = rng.choice(HOT) if rng.random() < 0.9 else rng.choice(tail)
                    try:
                        infer(target, model, rng.randrange(1 << 30))
                    except Exception as exc:  # counted, and shown if any
                        failures.append(exc)
                    calls += 1

            stop = time.monotonic() + TRAFFIC_SECONDS
            async with trio.open_nursery() as callers:
                for index in range(8):
                    callers.start_soon(trio.to_thread.run_sync, caller, index, stop)
            final = [await trio.to_thread.run_sync(ready_on, s) for s in tritons]
        nursery.cancel_scope.cancel()

    assert not failures, failures[:3]
    assert calls > 200
    assert sampler.most <= 4
    assert set(HOT) <= final[0] | final[1]
    assert sampler.evictions_within(MIN_RESIDENCY, placed) == []
