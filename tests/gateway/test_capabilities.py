"""What the gateway learns each worker implements, and how it acts on it.

rsgw's own worker implements every optional part of the API, so every capability is
learned present; answering as Triton (`--api triton`) it lacks ReactantServer's
control plane and IsSameIPCNamespace; the real servers that lack more (MLServer,
KServe's ModelServer) are in tests/thirdparty.
"""

from __future__ import annotations

import pytest
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._config import SchedulingConfig, SchedulingMode
from rsgw.config._fleet_blocks import DiscoveryConfig
from rsgw.gateway.placement._preconditions import NO_CONTROL_PLANE
from rsgw.scheduling.fleet._capabilities import Capability
from rsgw.worker._worker import WorkerApi
from tests.gateway.fleet import open_fleet
from tests.helpers import infer_request, simple_inputs

EVERY = tuple(str(c) for c in Capability)


async def test_every_capability_of_rsgws_worker_is_learned_at_start(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(2, memory=True) as fleet:
        status = fleet.gateway.statistics()
        assert status.capabilities == {fleet.worker_url(i): EVERY for i in range(2)}
        reply = await fleet.channel().unary(
            Method.GET_SCHEDULING_STATUS.wire,
            cpb.GetSchedulingStatusRequest().SerializeToString(),
        )
        members = cpb.GetSchedulingStatusResponse.FromString(reply).members
        assert [tuple(m.capabilities) for m in members] == [EVERY, EVERY]
        rendered = fleet.gateway._service.metrics.render().decode()
        assert 'gateway_worker_capability{capability="streaming",worker="worker0"} 1.0' in rendered


async def test_a_restarted_worker_is_probed_again(autojump_clock: MockClock) -> None:
    async with open_fleet(1, memory=True, health_interval_seconds=1.0) as fleet:
        url = fleet.worker_url(0)
        prober = fleet.gateway._service.prober
        first = prober.capabilities._probed[url]
        fleet.gateway._service.pool.channels[url].reset("as if the worker restarted")
        await prober.next_round()
        await prober.next_round()
        assert prober.capabilities._probed[url] > first
        assert fleet.gateway.statistics().capabilities[url] == EVERY


async def test_a_worker_answering_as_triton_lacks_the_control_plane_and_ipc(
    autojump_clock: MockClock,
) -> None:
    lacking = {"control_plane", "ipc_namespace"}
    async with open_fleet(
        2, memory=True, worker_overrides=[{"api": WorkerApi.TRITON}, {}]
    ) as fleet:
        status = fleet.gateway.statistics()
        assert set(status.capabilities[fleet.worker_url(0)]) == set(EVERY) - lacking
        assert status.capabilities[fleet.worker_url(1)] == EVERY
        client = fleet.channel()
        # IsSameIPCNamespace: a worker that cannot say counts as false, and is not asked.
        request = pb.IsSameIPCNamespaceRequest(name="x").SerializeToString()
        reply = await client.unary(Method.IPC_NAMESPACE.wire, request)
        assert not pb.IsSameIPCNamespaceResponse.FromString(reply).same
        # CompactMemory goes to the worker that has it only.
        reply = await client.unary(
            Method.COMPACT_MEMORY.wire, cpb.CompactMemoryRequest().SerializeToString()
        )
        assert cpb.CompactMemoryResponse.FromString(reply).reloaded_models == 0


async def test_what_no_worker_implements_is_unimplemented_in_its_words(
    autojump_clock: MockClock,
) -> None:
    triton = {"api": WorkerApi.TRITON}
    async with open_fleet(2, memory=True, worker_overrides=triton) as fleet:
        with pytest.raises(GrpcError) as failed:
            await fleet.channel().unary(
                Method.COMPACT_MEMORY.wire, cpb.CompactMemoryRequest().SerializeToString()
            )
        assert failed.value.code is StatusCode.UNIMPLEMENTED
        assert failed.value.message.startswith("no worker implements CompactMemory (unknown")


async def test_lpt_packing_over_workers_without_a_control_plane_serves_and_says_so(
    autojump_clock: MockClock,
) -> None:
    triton = {"api": WorkerApi.TRITON}
    async with open_fleet(
        2,
        memory=True,
        worker_overrides=triton,
        scheduling=SchedulingConfig(mode=SchedulingMode.LPT_PACKING),
    ) as fleet:
        for seed in range(6):
            await fleet.infer(infer_request("simple", simple_inputs(seed)))
        reply = await fleet.channel().unary(
            Method.GET_SCHEDULING_STATUS.wire,
            cpb.GetSchedulingStatusRequest().SerializeToString(),
        )
        status = cpb.GetSchedulingStatusResponse.FromString(reply)
        assert f"{NO_CONTROL_PLANE}: worker0, worker1" in status.warnings
        assert not fleet.gateway.statistics().placement  # nothing placed: routed where it is


async def test_work_counters_come_from_the_best_source_each_worker_has(
    autojump_clock: MockClock,
) -> None:
    # least_outstanding on compute reads work counters: ReactantServer's control plane,
    # else Triton's statistics, else what the gateway measures of its calls.
    apis = [{"api": WorkerApi.REACTANT}, {"api": WorkerApi.TRITON}, {"api": WorkerApi.KSERVE}]
    async with open_fleet(
        3,
        memory=True,
        worker_overrides=apis,
        scheduling=SchedulingConfig(mode=SchedulingMode.LEAST_OUTSTANDING),
        discovery=DiscoveryConfig(models=("simple",)),  # the KServe-like one lists none
    ) as fleet:
        for seed in range(12):
            await fleet.infer(infer_request("simple", simple_inputs(seed)))
        prober = fleet.gateway._service.prober
        await prober.next_round()
        await prober.next_round()
        reply = await fleet.channel().unary(
            Method.GET_SCHEDULING_STATUS.wire,
            cpb.GetSchedulingStatusRequest().SerializeToString(),
        )
        members = cpb.GetSchedulingStatusResponse.FromString(reply).members
        assert [m.counters for m in members] == ["control_plane", "statistics", "gateway"]
        measured = fleet.gateway._service.infer.measured
        assert measured is not None
        assert measured.counters(fleet.worker_url(2)).models["simple"].requests_served > 0
