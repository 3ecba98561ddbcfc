"""The gateway's /metrics, /healthz, /readyz; bounded labels; the other fan-outs.

Two kinds of test. Those that read the admin HTTP server (the merged exposition a
Prometheus scrape gets, a worker's metrics endpoint that is down, the health
endpoints) stay on loopback TCP with the real clock: the HTTP server, the
gateway's scrapes of the workers' admin ports and the merge are what they test,
and memory fleets run no admin server on the workers. The rest run on memory
streams with the autojump clock (`open_fleet(memory=True)`), with rsgw's own
client: label cardinality is a property of the registries, read here directly
(the gateway's, merged with the workers' as /metrics merges them), and the
fan-out and UNIMPLEMENTED answers do not depend on the socket or the client.
"""

from __future__ import annotations

import sys
import uuid
from functools import partial

import httpx
import pytest
import trio
import tritonclient.utils.shared_memory as shm
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._config import MetricsConfig
from rsgw.gateway._admin_routes import scrape_budget
from rsgw.runtime._exposition import merge_expositions
from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import check_simple, infer_request, simple_inputs


async def scrape(fleet: Fleet, headers: dict[str, str] | None = None) -> str:
    async with httpx.AsyncClient() as client:
        response = await client.get(
            f"http://127.0.0.1:{fleet.gateway.admin_port}/metrics", headers=headers
        )
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
    # Real: the merge of the gateway's text with the workers' HTTP scrapes, over HTTP.
    async with open_fleet(2, health_interval_seconds=60) as fleet:
        for seed in range(4):
            await trio.to_thread.run_sync(check_simple, fleet.target, seed)
        text = await scrape(fleet)
        lines = text.splitlines()
        types = [line.split()[2] for line in lines if line.startswith("# TYPE")]
        helps = [line.split()[2] for line in lines if line.startswith("# HELP")]
        assert len(types) == len(set(types)) and len(helps) == len(set(helps))
        series = 'gateway_requests_total{model="simple",protocol="grpc",rpc="ModelInfer",'
        assert series + 'status="OK"} 4.0' in lines
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
    # Real: a worker admin port that stops answering a real HTTP scrape.
    async with open_fleet(2, health_interval_seconds=60) as fleet:
        fleet.workers[1].kill()
        text = await scrape(fleet)
        assert 'gateway_worker_metrics_up{worker="worker1"} 0.0' in text.splitlines()
        assert 'worker="worker1"' not in "".join(
            line for line in text.splitlines() if line.startswith("worker_")
        )


def registries(fleet: Fleet) -> str:
    """The gateway's registry merged with every worker's, as /metrics merges their texts."""
    texts = [fleet.gateway._service.metrics.render().decode()]
    texts += [w.service.metrics.render().decode() for w in fleet.workers]
    return merge_expositions(texts)


async def test_random_names_add_no_label_values(autojump_clock: MockClock) -> None:
    async with open_fleet(2, memory=True, health_interval_seconds=60) as fleet:
        await fleet.infer(infer_request("simple", simple_inputs(0)))
        before = label_values(registries(fleet))
        channel = fleet.channel()
        for i in range(1000):
            body = infer_request(f"m-{uuid.uuid4().hex}", simple_inputs(i))
            with pytest.raises(GrpcError) as unknown:
                await channel.unary(Method.MODEL_INFER.wire, body.SerializeToString())
            assert unknown.value.code is StatusCode.NOT_FOUND
            region = pb.SystemSharedMemoryRegisterRequest(
                name=f"r-{uuid.uuid4().hex}", key=f"/k-{uuid.uuid4().hex}", byte_size=64
            )
            with pytest.raises(GrpcError) as missing:
                await channel.unary(Method.SHM_REGISTER.wire, region.SerializeToString())
            assert missing.value.code is StatusCode.INVALID_ARGUMENT  # every worker: no such key
        after = label_values(registries(fleet))
        new = {labels for name, labels in after - before}
        models = {dict(labels)["model"] for labels in new if "model" in dict(labels)}
        assert models <= {"_unknown_", ""}, models
        grown = {s for s in after - before if s[0].startswith("gateway_")}
        assert len(grown) <= 30  # a few new (rpc, status, worker) series, not thousands


async def test_healthz_and_readyz_and_404() -> None:
    # Real: the admin HTTP server's routes, as an HTTP client sees them.
    async with open_fleet(1, health_interval_seconds=60) as fleet:
        base = f"http://127.0.0.1:{fleet.gateway.admin_port}"
        async with httpx.AsyncClient() as client:
            assert (await client.get(base + "/healthz")).text == "ok"
            assert (await client.get(base + "/readyz")).status_code == 200
            assert (await client.get(base + "/metrics?x=1")).status_code == 200
            assert (await client.get(base + "/nope")).status_code == 404


async def test_is_same_ipc_namespace_and_compact_memory_fan_out(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(2, memory=True, health_interval_seconds=60) as fleet:
        channel = fleet.channel()

        async def ipc(name: str) -> bool:
            request = pb.IsSameIPCNamespaceRequest(name=name).SerializeToString()
            reply = await channel.unary(Method.IPC_NAMESPACE.wire, request)
            return pb.IsSameIPCNamespaceResponse.FromString(reply).same

        missing = await ipc("rsgw_no_such_region")
        # tritonclient's shm utility is synchronous (shm_open and mmap, no thread, no
        # wait), so it is safe under the autojump clock.
        key = f"/rsgw_ipc_{uuid.uuid4().hex[:8]}"
        handle = shm.create_shared_memory_region("ipc", key, 64)
        try:
            present = await ipc(key.lstrip("/"))
        finally:
            shm.destroy_shared_memory_region(handle)
        gone = await ipc(key.lstrip("/"))
        reply = await channel.unary(
            Method.COMPACT_MEMORY.wire, cpb.CompactMemoryRequest().SerializeToString()
        )
        reloaded = cpb.CompactMemoryResponse.FromString(reply).reloaded_models
        assert missing is False
        assert present is True
        assert gone is False
        assert reloaded == 0


async def test_unknown_methods_are_unimplemented_at_the_gateway(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(1, memory=True, health_interval_seconds=60) as fleet:
        for path in (b"/inference.GRPCInferenceService/NoSuchRpc", b"/made.Up/Path"):
            with pytest.raises(GrpcError) as caught:
                await fleet.channel().unary(path, b"")
            assert caught.value.code is StatusCode.UNIMPLEMENTED
        # Refusals are counted too, under a bounded label (paths are client-chosen).
        counter = fleet.gateway._service.metrics.requests
        assert counter.labels("_unknown_", "", "Unimplemented", "grpc").value == 2
        # A known method refused before its handler (a unary call with two messages).
        async with fleet.channel().stream(Method.MODEL_INFER.wire) as stream:
            await stream.send(b"")
            await stream.send(b"")
            stream.end()
            with pytest.raises(GrpcError):
                await stream.receive()
        assert counter.labels("ModelInfer", "", "Internal", "grpc").value == 1


async def test_worker_series_carry_the_gateways_name_for_the_worker() -> None:
    """Merged worker series get `worker` = the gateway's name for that endpoint (so they
    join gateway_worker_* on one label), the worker's own name kept as exported_worker,
    as Prometheus itself relabels a clashing target label."""
    async with open_fleet(2, health_interval_seconds=60, worker_names=("gpu-a", "gpu-b")) as fleet:
        await trio.to_thread.run_sync(check_simple, fleet.target, 0)
        text = await scrape(fleet)
        series = label_values(text)
        assert ("gateway_worker_ready", (("worker", "gpu-a"),)) in series
        dispatch = {labels for name, labels in series if name == "worker_dispatch_total"}
        assert (
            ("exported_worker", "worker0"),
            ("gpu", "0"),
            ("model", "simple"),
            ("worker", "gpu-a"),
        ) in dispatch
        assert all(("worker", "gpu-b") in labels for labels in dispatch if ("gpu", "1") in labels)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        (info,) = families["gateway_build_info"].samples
        assert info.labels["scheduling_mode"] == "round_robin" and info.value == 1
        assert "process_cpu_seconds" in families and "python_info" in families
        assert families["worker_queue_wait_seconds"].type == "summary"


@pytest.mark.parametrize(
    ("configured", "scraper", "within"),
    [
        (0.3, None, 1.0),  # the gateway's own timeout
        (30.0, "2", 2.0),  # Prometheus's, sooner: answered before the scraper gives up
    ],
)
async def test_a_hung_worker_metrics_endpoint_costs_one_scrape_timeout(
    configured: float, scraper: str | None, within: float
) -> None:
    """A metrics endpoint that accepts and never answers (a SIGSTOPped worker) is left out
    after `metrics.scrape_timeout_seconds`, or sooner when the scraper's own timeout
    (`X-Prometheus-Scrape-Timeout-Seconds`) less a margin is sooner, marked down; the
    gateway's series still come."""
    held: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        held.append(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        hung = []
        for _ in range(2):
            (listener,) = await nursery.start(partial(trio.serve_tcp, hold, 0, host="127.0.0.1"))
            hung.append(f"127.0.0.1:{listener.socket.getsockname()[1]}")
        async with open_fleet(
            2,
            health_interval_seconds=60,
            metrics_endpoints=tuple(hung),
            metrics=MetricsConfig(scrape_timeout_seconds=configured),
        ) as fleet:
            headers = {} if scraper is None else {"X-Prometheus-Scrape-Timeout-Seconds": scraper}
            started = trio.current_time()
            text = await scrape(fleet, headers)
            took = trio.current_time() - started
            lines = text.splitlines()
        nursery.cancel_scope.cancel()
    assert took < within, took  # both scrapes at once, each bounded
    assert 'gateway_worker_metrics_up{worker="worker0"} 0.0' in lines
    assert 'gateway_worker_metrics_up{worker="worker1"} 0.0' in lines
    assert any(line.startswith("gateway_worker_ready{") for line in lines)
    assert not any(line.startswith("worker_") for line in lines)


@given(
    configured=st.floats(0.001, 60),
    header=st.one_of(
        st.none(),
        st.floats(allow_nan=True, allow_infinity=True).map(lambda f: repr(f).encode()),
        st.binary(max_size=8),
    ),
)
def test_the_scrape_budget_is_never_later_than_either_deadline(
    configured: float, header: bytes | None
) -> None:
    budget = scrape_budget(configured, header)
    assert 0 < budget <= configured
    try:
        seconds = float(header) if header is not None else None
    except ValueError:
        seconds = None
    # A subnormal timeout (5e-324) has no smaller positive number below it: no room to
    # leave, and no scraper sends one.
    if seconds is not None and sys.float_info.min <= seconds < float("inf"):
        assert budget < seconds  # room for the gateway's own answer
        assert budget >= min(configured, seconds * 0.8) - 1e-9
