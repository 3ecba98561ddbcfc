"""The gateway in front of KServe V2 servers nobody here wrote: MLServer and KServe.

Two workers of one kind, `simple` on both and `solo` on the first only, a gateway
in front of them in each scheduling mode, and Triton's stock client
(`tritonclient.grpc`) calling through it as it would call one server: correct
answers, the one-worker model on its worker, an unknown model NOT_FOUND, and what the
servers lack UNIMPLEMENTED in their words. Under lpt_packing with no model handed to
the gateway (`repository.models`; test_mlserver_placement.py hands some) neither server
is placed: the gateway serves their models where they are, and its status says so.
MLServer lists its models (RepositoryIndex, `State.READY`); KServe's ModelServer
does not, so the gateway asks it ModelReady (`simple` configured in
`discovery.models`, `solo` found on demand). Then one worker is killed under load
and no call of the replicated model fails.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from rsgw import open_gateway
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._methods import Method
from rsgw.config._config import GatewayConfig, ListenConfig, SchedulingConfig, SchedulingMode
from rsgw.config._fleet_blocks import DiscoveryConfig
from rsgw.gateway._running import RunningGateway
from rsgw.gateway.placement._preconditions import NO_CONTROL_PLANE
from tests.helpers import in_thread, unary_call, wait_until_async
from tests.thirdparty.servers import ServerProcess, available, missing, start_server

KINDS = ["mlserver", "kserve"]
MODES = list(SchedulingMode)


@pytest.fixture(scope="module", params=KINDS)
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    """Two servers of one kind: `simple` and `solo` on the first, `simple` on the second."""
    kind: str = request.param
    if not available(kind):
        pytest.skip(missing(kind))
    workdir = tmp_path_factory.mktemp(kind)
    servers = [start_server(kind, ["simple", "solo"], workdir / "first")]
    try:
        servers.append(start_server(kind, ["simple"], workdir / "second"))
        yield servers
    finally:
        for server in servers:
            server.stop()


def config_for(servers: list[ServerProcess], mode: SchedulingMode) -> GatewayConfig:
    return GatewayConfig(
        endpoints=tuple(s.target for s in servers),
        worker_names=("first", "second"),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
        health_interval_seconds=0.5,
        scheduling=dataclasses.replace(SchedulingConfig(), mode=mode),
        # KServe's ModelServer has no RepositoryIndex: `simple` is asked about by name.
        discovery=DiscoveryConfig(models=("simple",)),
    )


def infer(client: triton.InferenceServerClient, model: str, seed: int) -> None:
    """One call of Triton's `simple` contract, its answers checked."""
    a = np.arange(seed, seed + 16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [
        triton.InferInput("INPUT0", [1, 16], "INT32"),
        triton.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def failure(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as failed:
        call()
    return failed.value


@pytest.mark.parametrize("mode", MODES, ids=str)
async def test_stock_client_through_the_gateway(
    pair: list[ServerProcess], mode: SchedulingMode
) -> None:
    async with open_gateway(config_for(pair, mode)) as gateway:
        target = f"127.0.0.1:{gateway.grpc_port}"
        client = triton.InferenceServerClient(target)

        def calls() -> None:
            assert client.is_server_ready()
            assert client.is_model_ready("simple")
            assert client.get_model_metadata("simple").name == "simple"
            for seed in range(8):
                infer(client, "simple", seed)
            infer(client, "solo", 100)  # on the first worker only (KServe: found on demand)
            assert failure(lambda: infer(client, "nope", 0)).status() == "StatusCode.NOT_FOUND"
            for lacking in (client.get_model_config, client.get_inference_statistics):
                error = failure(functools.partial(lacking, "simple"))
                assert error.status() == "StatusCode.UNIMPLEMENTED", error
            index = {m.name: m.state for m in client.get_model_repository_index().models}
            assert index == {"simple": "READY", "solo": "READY"}

        await in_thread(calls)
        if mode is SchedulingMode.LPT_PACKING:  # nothing to place: it says so, and serves
            reply = await in_thread(
                lambda: unary_call(
                    target,
                    Method.GET_SCHEDULING_STATUS.path,
                    cpb.GetSchedulingStatusRequest().SerializeToString(),
                )
            )
            (warning,) = cpb.GetSchedulingStatusResponse.FromString(reply).warnings
            assert warning == f"{NO_CONTROL_PLANE}: first, second"
        status = gateway.statistics()
        assert status.models["solo"] == (pair[0].target,)
        assert status.models["simple"] == (pair[0].target, pair[1].target)
        for url in (pair[0].target, pair[1].target):
            assert "model_config" not in status.capabilities[url]
            assert "control_plane" not in status.capabilities[url]
        client.close()


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_killed_worker_fails_no_call_of_a_replicated_model(
    kind: str, mode: SchedulingMode, tmp_path: Path
) -> None:
    if not available(kind):
        pytest.skip(missing(kind))
    servers = [start_server(kind, ["simple"], tmp_path / f"w{i}") for i in range(2)]
    try:
        async with open_gateway(config_for(servers, mode)) as gateway:
            await load_while_killing(gateway, servers[1])
    finally:
        for server in servers:
            server.stop()


async def load_while_killing(gateway: RunningGateway, victim: ServerProcess) -> None:
    """Four clients call `simple` in a loop; the victim is killed once calls flow; every
    call must succeed."""
    target = f"127.0.0.1:{gateway.grpc_port}"
    stop = threading.Event()
    done = [0]
    errors: list[BaseException] = []

    def client_loop() -> None:
        client = triton.InferenceServerClient(target)
        seed = 0
        while not stop.is_set():
            try:
                infer(client, "simple", seed)
                done[0] += 1
            except BaseException as exc:  # any failure fails the test below
                errors.append(exc)
                return
            seed += 1
        client.close()

    threads = [threading.Thread(target=client_loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        await wait_until_async(lambda: done[0] >= 40 or bool(errors), 30, what="calls flowing")
        victim.kill()
        after = done[0]
        await wait_until_async(
            lambda: done[0] >= after + 80 or bool(errors), 60, what="calls after"
        )
    finally:
        stop.set()
        for thread in threads:
            await in_thread(thread.join)
    assert not errors, errors[:3]
    await wait_until_async(
        lambda: victim.target not in gateway.statistics().ready, 10, what="the victim unready"
    )
