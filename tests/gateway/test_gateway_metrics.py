"""The gateway's /metrics, /healthz, /readyz; bounded labels; the other fan-outs."""

from __future__ import annotations

import uuid

import grpc
import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import MODEL_INFER, check_simple, infer_request, simple_inputs

SHM_REGISTER = "/inference.GRPCInferenceService/SystemSharedMemoryRegister"


async def scrape(fleet: Fleet) -> str:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{fleet.gateway.admin_port}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response.text


def label_values(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le")))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_merge_gateway_and_worker_series() -> None:
    async with open_fleet(2, health_interval_seconds=60) as fleet:
        for seed in range(4):
            await trio.to_thread.run_sync(check_simple, fleet.target, seed)
        text = await scrape(fleet)
        lines = text.splitlines()
        types = [line.split()[2] for line in lines if line.startswith("# TYPE")]
        helps = [line.split()[2] for line in lines if line.startswith("# HELP")]
        assert len(types) == len(set(types)) and len(helps) == len(set(helps))
        assert 'gateway_requests_total{model="simple",rpc="ModelInfer",status="OK"} 4.0' in lines
        assert 'gateway_worker_ready{worker="worker0"} 1.0' in lines
        assert 'gateway_worker_metrics_up{worker="worker1"} 1.0' in lines
        size = len(fleet.gateway.status().models)
        assert f"gateway_routing_table_size {size:.1f}" in lines
        assert any(
            line.startswith(
                'gateway_worker_latency_seconds_count{rpc="ModelInfer",worker="worker1"}'
            )
            for line in lines
        )
        dispatch = [line for line in lines if line.startswith("worker_dispatch_total{")]
        assert any('worker="worker0"' in line and 'gpu="0"' in line for line in dispatch)
        assert any('worker="worker1"' in line and 'gpu="1"' in line for line in dispatch)
        assert "_created" not in text


async def test_a_dead_worker_metrics_endpoint_is_down_not_an_error() -> None:
    async with open_fleet(2, health_interval_seconds=60) as fleet:
        await fleet.workers[1].aclose()
        text = await scrape(fleet)
        assert 'gateway_worker_metrics_up{worker="worker1"} 0.0' in text.splitlines()
        assert 'worker="worker1"' not in "".join(
            line for line in text.splitlines() if line.startswith("worker_")
        )


async def test_random_names_add_no_label_values() -> None:
    async with open_fleet(2, health_interval_seconds=60) as fleet:
        await trio.to_thread.run_sync(check_simple, fleet.target, 0)
        before = label_values(await scrape(fleet))

        def storm() -> None:
            with grpc.insecure_channel(fleet.target) as channel:
                infer = channel.unary_unary(MODEL_INFER)
                register = channel.unary_unary(SHM_REGISTER)
                for i in range(1000):
                    body = infer_request(f"m-{uuid.uuid4().hex}", simple_inputs(i))
                    try:
                        infer(body.SerializeToString(), timeout=10)
                    except grpc.RpcError as exc:
                        assert exc.code() == grpc.StatusCode.NOT_FOUND
                    region = pb.SystemSharedMemoryRegisterRequest(
                        name=f"r-{uuid.uuid4().hex}", key=f"/k-{uuid.uuid4().hex}", byte_size=64
                    )
                    try:
                        register(region.SerializeToString(), timeout=10)
                    except grpc.RpcError as exc:
                        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION

        await trio.to_thread.run_sync(storm)
        after = label_values(await scrape(fleet))
        new = {labels for name, labels in after - before}
        models = {dict(labels)["model"] for labels in new if "model" in dict(labels)}
        assert models <= {"_unknown_", ""}, models
        grown = {s for s in after - before if s[0].startswith("gateway_")}
        assert len(grown) <= 30  # a few new (rpc, status, worker) series, not thousands


async def test_healthz_and_readyz_and_404() -> None:
    async with open_fleet(1, health_interval_seconds=60) as fleet:
        base = f"http://127.0.0.1:{fleet.gateway.admin_port}"
        async with httpx.AsyncClient() as client:
            assert (await client.get(base + "/healthz")).text == "ok"
            assert (await client.get(base + "/readyz")).status_code == 200
            assert (await client.get(base + "/metrics?x=1")).status_code == 200
            assert (await client.get(base + "/nope")).status_code == 404


async def test_is_same_ipc_namespace_and_compact_memory_fan_out() -> None:
    async with open_fleet(2, health_interval_seconds=60) as fleet:

        def calls() -> tuple[bool, bool, int]:
            with grpc.insecure_channel(fleet.target) as channel:
                ipc = channel.unary_unary(
                    "/inference.GRPCInferenceService/IsSameIPCNamespace",
                    request_serializer=pb.IsSameIPCNamespaceRequest.SerializeToString,
                    response_deserializer=pb.IsSameIPCNamespaceResponse.FromString,
                )
                compact = channel.unary_unary(
                    "/reactant_control.ControlService/CompactMemory",
                    request_serializer=cpb.CompactMemoryRequest.SerializeToString,
                    response_deserializer=cpb.CompactMemoryResponse.FromString,
                )
                missing = ipc(pb.IsSameIPCNamespaceRequest(name="rsgw_no_such_region")).same
                import tritonclient.utils.shared_memory as shm

                key = f"/rsgw_ipc_{uuid.uuid4().hex[:8]}"
                handle = shm.create_shared_memory_region("ipc", key, 64)
                try:
                    present = ipc(pb.IsSameIPCNamespaceRequest(name=key.lstrip("/"))).same
                finally:
                    shm.destroy_shared_memory_region(handle)
                reloaded = compact(cpb.CompactMemoryRequest()).reloaded_models
            return missing, present, reloaded

        missing, present, reloaded = await trio.to_thread.run_sync(calls)
        assert missing is False
        assert present is True
        assert reloaded == 0


async def test_other_rpcs_are_unimplemented_at_the_gateway() -> None:
    async with open_fleet(1, health_interval_seconds=60) as fleet:

        def server_ready() -> grpc.StatusCode:
            with grpc.insecure_channel(fleet.target) as channel:
                try:
                    channel.unary_unary("/inference.GRPCInferenceService/ServerReady")(b"")
                except grpc.RpcError as exc:
                    return exc.code()
            return grpc.StatusCode.OK

        assert await trio.to_thread.run_sync(server_ready) == grpc.StatusCode.UNIMPLEMENTED
