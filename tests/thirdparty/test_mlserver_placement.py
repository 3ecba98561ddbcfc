"""lpt_packing placing models on MLServer workers by loading and unloading them.

MLServer has no ReactantServer control plane but Triton's repository extension:
RepositoryIndex lists every model its repository folder has (unloaded ones
UNAVAILABLE), and RepositoryModelLoad / Unload work. Two MLServer workers serve
`simple` and `twin` (both Triton's `simple` contract); handed to the gateway
(`repository.models`), each is loaded on the one worker its placement names and
unloaded from the other. Then the operator widens `simple` to both workers, with
calls coming all the while through Triton's stock client, and none fails.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import tritonclient.grpc as triton

from rsgw import open_gateway
from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._methods import Method
from rsgw.config._config import GatewayConfig, ListenConfig, SchedulingConfig, SchedulingMode
from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.gateway._running import RunningGateway
from rsgw.scheduling.calls._routing import is_ready_state
from tests.helpers import in_thread, unary_call
from tests.thirdparty.servers import ServerProcess, available, missing, start_server
from tests.thirdparty.test_third_party_workers import infer

MODELS = ("simple", "twin")


@pytest.fixture
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    if not available("mlserver"):
        pytest.skip(missing("mlserver"))
    workdir = tmp_path_factory.mktemp("placed")
    servers = [start_server("mlserver", list(MODELS), workdir / "first")]
    try:
        servers.append(start_server("mlserver", list(MODELS), workdir / "second"))
        yield servers
    finally:
        for server in servers:
            server.stop()


def states(server: ServerProcess) -> dict[str, str]:
    """The worker's own RepositoryIndex, asked directly: model -> state (MLServer
    spells them `State.READY`, `State.UNAVAILABLE`)."""
    reply = unary_call(
        server.target,
        Method.REPOSITORY_INDEX.path,
        pb.RepositoryIndexRequest(ready=False).SerializeToString(),
    )
    return {m.name: m.state for m in pb.RepositoryIndexResponse.FromString(reply).models}


def holders(servers: list[ServerProcess], model: str) -> list[int]:
    return [i for i, s in enumerate(servers) if is_ready_state(states(s)[model])]


async def settled(gateway: RunningGateway, posted: int) -> None:
    """Wait until the placement numbered `posted` is carried out."""
    assert gateway._packing is not None
    await gateway._packing.placer.wait_carried(posted)


async def test_models_are_loaded_only_where_placed_and_moves_fail_no_call(
    workers: list[ServerProcess],
) -> None:
    config = GatewayConfig(
        endpoints=tuple(s.target for s in workers),
        worker_names=("first", "second"),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
        health_interval_seconds=0.5,
        scheduling=SchedulingConfig(mode=SchedulingMode.LPT_PACKING),
        repository=RepositoryConfig(models=MODELS, weight_bytes={"simple": 10, "twin": 10}),
    )
    async with open_gateway(config) as gateway:
        await settled(gateway, 1)
        placed = gateway.statistics().placement
        for model in MODELS:
            where = await in_thread(lambda m=model: holders(workers, m))  # type: ignore[misc]
            assert [workers[i].target for i in where] == list(placed[model]), model
        target = f"127.0.0.1:{gateway.grpc_port}"
        done = threading.Event()
        answered = [0]
        failed: list[BaseException] = []

        def caller() -> None:
            client = triton.InferenceServerClient(target)
            seed = 0
            try:
                while not done.is_set():
                    for model in MODELS:
                        infer(client, model, seed)
                        answered[0] += 1
                    seed += 1
            except BaseException as exc:  # reported by the test, not lost in the thread
                failed.append(exc)
            finally:
                client.close()

        def widen() -> None:
            request = cpb.SetModelPlacementRequest(name="simple", replicas=2)
            unary_call(target, Method.SET_MODEL_PLACEMENT.path, request.SerializeToString())
            repack = cpb.RepackRequest(wait_seconds=30).SerializeToString()
            reply = unary_call(target, Method.REPACK.path, repack, timeout=60)
            assert cpb.RepackResponse.FromString(reply).completed

        thread = threading.Thread(target=caller)
        thread.start()
        try:
            await in_thread(widen)  # served once the loads are done
            assert await in_thread(lambda: holders(workers, "simple")) == [0, 1]
        finally:
            done.set()
            await in_thread(thread.join)
        assert not failed, failed
        assert answered[0] > 0
