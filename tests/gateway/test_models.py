"""The gateway's server and model RPCs beyond ModelInfer, against real workers.

Most tests run the fleet on memory streams with the autojump clock and call the gateway
with rsgw's own channel; the last one calls every RPC with `tritonclient` over loopback
TCP, as a Triton user would.
"""

from __future__ import annotations

import pytest
import trio
import tritonclient.grpc as grpcclient
from trio.testing import MockClock
from tritonclient.utils import InferenceServerException

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._config import ServerMetadataConfig
from rsgw.scheduling.calls._merge import merge_indexes, merge_statistics
from rsgw.worker.models._catalogue import builtin_catalogue
from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import catalogue_from_yaml, in_thread, infer_request, simple_inputs

ONLY_OTHER = catalogue_from_yaml(
    """
models:
  - name: other
    compute: add_sub
    max_batch_size: 8
    inputs:
      - {name: INPUT0, datatype: INT32, shape: [-1, 16]}
      - {name: INPUT1, datatype: INT32, shape: [-1, 16]}
    outputs:
      - {name: OUTPUT0, datatype: INT32, shape: [-1, 16]}
      - {name: OUTPUT1, datatype: INT32, shape: [-1, 16]}
""",
    with_builtin=False,
)


async def call(fleet: Fleet, method: Method, request: object) -> bytes:
    assert hasattr(request, "SerializeToString")
    return await fleet.channel().unary(method.wire, request.SerializeToString())


async def error_of(fleet: Fleet, method: Method, request: object) -> GrpcError:
    with pytest.raises(GrpcError) as caught:
        await call(fleet, method, request)
    return caught.value


async def test_server_live_ready_and_metadata(autojump_clock: MockClock) -> None:
    async with open_fleet(2, memory=True, health_interval_seconds=0.5) as fleet:
        live = pb.ServerLiveResponse.FromString(
            await call(fleet, Method.SERVER_LIVE, pb.ServerLiveRequest())
        )
        assert live.live
        ready = pb.ServerReadyResponse.FromString(
            await call(fleet, Method.SERVER_READY, pb.ServerReadyRequest())
        )
        assert ready.ready
        metadata = pb.ServerMetadataResponse.FromString(
            await call(fleet, Method.SERVER_METADATA, pb.ServerMetadataRequest())
        )
        assert metadata.name == "triton"
        assert "model_repository" in metadata.extensions
        for worker in fleet.workers:
            worker.kill()
        await trio.sleep(2)  # a few probe rounds on the mock clock
        ready = pb.ServerReadyResponse.FromString(
            await call(fleet, Method.SERVER_READY, pb.ServerReadyRequest())
        )
        assert not ready.ready  # the rule of /readyz
        live = pb.ServerLiveResponse.FromString(
            await call(fleet, Method.SERVER_LIVE, pb.ServerLiveRequest())
        )
        assert live.live  # the gateway itself still serves


async def test_model_rpcs_are_routed_by_name(autojump_clock: MockClock) -> None:
    async with open_fleet(2, memory=True, catalogues=[ONLY_OTHER, ONLY_OTHER]) as fleet:
        ready = pb.ModelReadyResponse.FromString(
            await call(fleet, Method.MODEL_READY, pb.ModelReadyRequest(name="other"))
        )
        assert ready.ready
        metadata = pb.ModelMetadataResponse.FromString(
            await call(fleet, Method.MODEL_METADATA, pb.ModelMetadataRequest(name="other"))
        )
        assert [t.name for t in metadata.inputs] == ["INPUT0", "INPUT1"]
        config = pb.ModelConfigResponse.FromString(
            await call(fleet, Method.MODEL_CONFIG, pb.ModelConfigRequest(name="other"))
        ).config
        assert (config.name, config.max_batch_size) == ("other", 8)
        assert [list(t.dims) for t in config.input] == [[16], [16]]
        assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU
        # A model no worker serves: Triton's NOT_FOUND, and ModelReady is plain false.
        error = await error_of(fleet, Method.MODEL_METADATA, pb.ModelMetadataRequest(name="nope"))
        assert (error.code, error.message) == (
            StatusCode.NOT_FOUND,
            "Request for unknown model: 'nope' is not found",
        )
        ready = pb.ModelReadyResponse.FromString(
            await call(fleet, Method.MODEL_READY, pb.ModelReadyRequest(name="nope"))
        )
        assert not ready.ready


async def test_statistics_are_summed_over_three_workers(autojump_clock: MockClock) -> None:
    async with open_fleet(3, memory=True) as fleet:
        for seed in range(6):  # round robin: two on each worker
            await fleet.infer(infer_request("simple", simple_inputs(seed)))
        request = pb.ModelStatisticsRequest(name="simple")
        one = pb.ModelStatisticsResponse.FromString(
            await call(fleet, Method.MODEL_STATISTICS, request)
        )
        (named,) = one.model_stats
        assert named.inference_count == 6  # every replica's share, summed
        every = pb.ModelStatisticsResponse.FromString(
            await call(fleet, Method.MODEL_STATISTICS, pb.ModelStatisticsRequest())
        )
        (simple,) = [s for s in every.model_stats if s.name == "simple"]
        assert simple.inference_count == 6
        assert simple.execution_count == 6
        assert simple.inference_stats.success.count == 6
        assert simple.inference_stats.compute_infer.count == 6
        assert sum(b.compute_infer.count for b in simple.batch_stats) == 6
        per_worker = [w.service.device.counters["simple"].requests_served for w in fleet.workers]
        assert per_worker == [2, 2, 2]
        # The same merge the gateway used, on the workers' own answers.
        assert len({s.name for s in every.model_stats}) == len(every.model_stats)


async def test_repository_index_is_the_union_and_survives_a_worker_down(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(2, memory=True, catalogues=[ONLY_OTHER, builtin_catalogue()]) as fleet:
        index = pb.RepositoryIndexResponse.FromString(
            await call(fleet, Method.REPOSITORY_INDEX, pb.RepositoryIndexRequest())
        )
        names = [m.name for m in index.models]
        assert names == sorted(names)
        assert "other" in names and "simple" in names
        assert all(m.state == "READY" for m in index.models)
        fleet.workers[1].kill()
        index = pb.RepositoryIndexResponse.FromString(
            await call(fleet, Method.REPOSITORY_INDEX, pb.RepositoryIndexRequest())
        )
        assert [m.name for m in index.models] == ["other"]


def test_merges_are_what_the_docs_say() -> None:
    a = pb.ModelStatisticsResponse()
    s = a.model_stats.add(name="m", version="1", inference_count=2, last_inference=5)
    s.inference_stats.success.count = 2
    s.inference_stats.success.ns = 10
    s.batch_stats.add(batch_size=1).compute_infer.count = 2
    b = pb.ModelStatisticsResponse()
    t = b.model_stats.add(name="m", version="1", inference_count=3, last_inference=9)
    t.inference_stats.success.count = 3
    t.inference_stats.success.ns = 5
    t.batch_stats.add(batch_size=4).compute_infer.count = 1
    t.batch_stats.add(batch_size=1).compute_infer.count = 1
    (merged,) = merge_statistics([a, b]).model_stats
    assert (merged.inference_count, merged.last_inference) == (5, 9)
    assert (merged.inference_stats.success.count, merged.inference_stats.success.ns) == (5, 15)
    assert [(x.batch_size, x.compute_infer.count) for x in merged.batch_stats] == [(1, 3), (4, 1)]
    assert merge_statistics([a]) == a
    ready = pb.RepositoryIndexResponse()
    ready.models.add(name="m", version="1", state="UNAVAILABLE", reason="unloaded")
    other = pb.RepositoryIndexResponse()
    other.models.add(name="m", version="1", state="READY")
    assert [r.state for r in merge_indexes([ready, other]).models] == ["READY"]
    assert merge_indexes([ready]).models[0].reason == "unloaded"
    mlserver = pb.RepositoryIndexResponse()
    mlserver.models.add(name="m", version="1", state="State.READY")
    assert [r.state for r in merge_indexes([ready, mlserver]).models] == ["READY"]


async def test_server_metadata_override(autojump_clock: MockClock) -> None:
    identity = ServerMetadataConfig(name="node-7", version="2026.12")
    async with open_fleet(2, memory=True, server_metadata=identity) as fleet:
        metadata = pb.ServerMetadataResponse.FromString(
            await call(fleet, Method.SERVER_METADATA, pb.ServerMetadataRequest())
        )
        assert (metadata.name, metadata.version) == ("node-7", "2026.12")
        assert "model_repository" in metadata.extensions  # still the workers' extensions


async def test_tritonclient_sees_a_triton_server() -> None:
    async with open_fleet(2) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)
        try:
            assert await in_thread(client.is_server_live)
            assert await in_thread(client.is_server_ready)
            assert (await in_thread(client.get_server_metadata)).name == "triton"
            assert await in_thread(lambda: client.is_model_ready("simple"))
            metadata = await in_thread(lambda: client.get_model_metadata("simple"))
            assert metadata.name == "simple"
            config = await in_thread(lambda: client.get_model_config("simple"))
            assert config.config.name == "simple"
            stats = await in_thread(lambda: client.get_inference_statistics("simple"))
            assert stats.model_stats[0].name == "simple"
            index = await in_thread(client.get_model_repository_index)
            assert "simple" in {m.name for m in index.models}
            status = await in_thread(client.get_system_shared_memory_status)
            assert dict(status.regions) == {}
            with pytest.raises(InferenceServerException, match="unknown model: 'nope'"):
                await in_thread(lambda: client.get_model_metadata("nope"))
        finally:
            client.close()
