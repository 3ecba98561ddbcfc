"""Two gateways in front of the same four simulated workers, one lpt_packing placement,
coordinated through a real etcd (issue 39's first acceptance)."""

from __future__ import annotations

import functools

import httpx
import numpy as np
import pytest
import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._config import CoordinationConfig
from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.coordination._etcd import Etcd
from rsgw.coordination._records import Keys
from rsgw.gateway._running import RunningGateway
from rsgw.grpc._client import Channel
from rsgw.runtime._net import TCP
from rsgw.scheduling.knobs._knobs import SchedulingMode
from rsgw.scheduling.knobs._settings import SchedulingConfig
from rsgw.worker._worker import WorkerApi, WorkerConfig
from rsgw.worker.models._catalogue import parse_catalogue
from tests.etcd import EtcdProcess
from tests.gateway.fleet import (
    Fleet,
    gateway_config,
    open_fleet,
    repository_states,
    start_gateway,
    start_worker,
)
from tests.helpers import infer_request, simple_inputs, simple_model

KNOBS = SchedulingConfig(
    mode=SchedulingMode.LPT_PACKING,
    # Only the startup and the operators' repacks: what each counts is then exact.
    first_rebalance_compute_seconds=1000.0,
    rebalance_compute_seconds=1000.0,
)


def coordination(etcd: EtcdProcess, member: str) -> CoordinationConfig:
    return CoordinationConfig(etcd_endpoints=(etcd.endpoint,), lease_ttl_seconds=3, member=member)


class Gateways:
    """The fleet's gateway and a second one, and a control client for each."""

    def __init__(self, fleet: Fleet, second: RunningGateway) -> None:
        self.fleet = fleet
        self.gateways = [fleet.gateway, second]
        self.channels = [Channel(f"127.0.0.1:{g.grpc_port}", fleet.nursery) for g in self.gateways]

    async def status(self, index: int) -> cpb.GetSchedulingStatusResponse:
        reply = await self.channels[index].unary(
            Method.GET_SCHEDULING_STATUS.wire, cpb.GetSchedulingStatusRequest().SerializeToString()
        )
        return cpb.GetSchedulingStatusResponse.FromString(reply)

    async def both(self) -> list[cpb.GetSchedulingStatusResponse]:
        return [await self.status(0), await self.status(1)]

    async def settled(self) -> list[cpb.GetSchedulingStatusResponse]:
        """Wait until one places, the other follows, both at the same epoch and placement."""
        seen: list[cpb.GetSchedulingStatusResponse] = []

        async def agree() -> bool:
            seen[:] = await self.both()
            return one_placement(seen)

        with trio.fail_after(20):
            while not await agree():  # noqa: ASYNC110 (the gateways' answers: nothing to wait on)
                await trio.sleep(0.05)
        return seen

    def follower(self, statuses: list[cpb.GetSchedulingStatusResponse]) -> int:
        return [s.coordination.state for s in statuses].index("follower")

    async def call(self, index: int, method: Method, request: object) -> bytes:
        return await self.channels[index].unary(method.wire, request.SerializeToString())  # type: ignore[attr-defined]


def one_placement(statuses: list[cpb.GetSchedulingStatusResponse]) -> bool:
    """One gateway places, the other follows, both at one epoch (> 0) and one placement."""
    states = sorted(s.coordination.state for s in statuses)
    epochs = {s.coordination.epoch for s in statuses}
    placed = [placements(s) for s in statuses]
    return (
        states == ["follower", "placer"]
        and len(epochs) == 1
        and 0 not in epochs
        and (placed[0] == placed[1])
    )


def placements(status: cpb.GetSchedulingStatusResponse) -> dict[str, tuple[str, ...]]:
    return {m.name: tuple(sorted(r.worker for r in m.replicas)) for m in status.models if m.placed}


async def two_gateways(
    fleet: Fleet, etcd: EtcdProcess, repository: RepositoryConfig | None = None
) -> Gateways:
    """A second gateway, gw-b, beside the fleet's own (gw-a), both coordinated, with the
    fleet's `repository` block."""
    config = gateway_config(
        fleet.workers,
        scheduling=KNOBS,
        coordination=coordination(etcd, "gw-b"),
        repository=repository or RepositoryConfig(),
    )
    second = await fleet.nursery.start(functools.partial(start_gateway, config, TCP))
    return Gateways(fleet, second)


async def test_one_places_both_route_by_it_and_demand_and_changes_are_shared(
    etcd: EtcdProcess,
) -> None:
    async with open_fleet(4, scheduling=KNOBS, coordination=coordination(etcd, "gw-a")) as fleet:
        gateways = await two_gateways(fleet, etcd)
        statuses = await gateways.settled()
        assert {s.coordination.placer for s in statuses} == {"gw-a"}  # it was there first
        with trio.fail_after(10):  # each gateway reads the members once a second
            while sorted((await gateways.status(0)).coordination.members) != ["gw-a", "gw-b"]:  # noqa: ASYNC110
                await trio.sleep(0.1)
        follower = gateways.follower(statuses)
        placer = 1 - follower
        # The packer takes the first compute the workers report as its baseline (the
        # original's rule): spend some on another model through the placer first.
        warm = infer_request("custom_identity_int32", {"INPUT0": np.ones((1, 4), np.int32)})
        with trio.fail_after(10):
            while not (await gateways.status(placer)).repack.compute_accumulated_seconds:
                await gateways.channels[placer].unary(
                    Method.MODEL_INFER.wire, warm.SerializeToString()
                )
                await trio.sleep(0.05)

        # Traffic sent to the follower alone is the placer's demand.
        request = infer_request("simple", simple_inputs(1)).SerializeToString()
        for _ in range(40):
            await gateways.channels[follower].unary(Method.MODEL_INFER.wire, request)
        reply = cpb.RepackResponse.FromString(
            await gateways.call(follower, Method.REPACK, cpb.RepackRequest(wait_seconds=20))
        )
        assert reply.completed, reply
        rates = {m.name: m.arrival_rate for m in (await gateways.status(placer)).models}
        assert rates["simple"] > 0, rates

        # A placement change made on the follower takes effect on both.
        await gateways.call(
            follower,
            Method.SET_MODEL_PLACEMENT,
            cpb.SetModelPlacementRequest(name="simple", replicas=3),
        )
        reply = cpb.RepackResponse.FromString(
            await gateways.call(follower, Method.REPACK, cpb.RepackRequest(wait_seconds=20))
        )
        assert reply.completed, reply
        statuses = await gateways.settled()
        for status in statuses:
            assert len(placements(status)["simple"]) == 3
            simple = next(m for m in status.models if m.name == "simple")
            assert simple.configured_replicas == 3
        assert statuses[0].coordination.epoch == statuses[1].coordination.epoch


async def test_without_coordination_nothing_changes() -> None:
    async with open_fleet(2, scheduling=KNOBS) as fleet:
        channel = fleet.channel()
        reply = await channel.unary(
            Method.GET_SCHEDULING_STATUS.wire, cpb.GetSchedulingStatusRequest().SerializeToString()
        )
        status = cpb.GetSchedulingStatusResponse.FromString(reply)
        assert not status.HasField("coordination")
        assert fleet.gateway.coordinator is None


async def test_a_worker_added_or_removed_on_one_gateway_joins_or_leaves_both(
    etcd: EtcdProcess,
) -> None:
    async with open_fleet(2, scheduling=KNOBS, coordination=coordination(etcd, "gw-a")) as fleet:
        gateways = await two_gateways(fleet, etcd)
        await gateways.settled()
        extra = await fleet.nursery.start(
            start_worker,
            WorkerConfig(name="worker9", gpu="9", port=0, metrics_port=0),
            TCP,
        )
        address = f"127.0.0.1:{extra.grpc_port}"

        async def addresses(index: int) -> set[str]:
            return {m.address for m in (await gateways.status(index)).members}

        # A removal refused here is not shared: the others never see it.
        client = Etcd([etcd.endpoint], fleet.nursery)
        changes = Keys(fleet.gateway.config.coordination.cluster).changes
        before, _ = await client.get_prefix(changes)
        with pytest.raises(GrpcError) as refused:
            await gateways.call(0, Method.REMOVE_WORKER, cpb.RemoveWorkerRequest(worker="nobody"))
        assert refused.value.code == StatusCode.NOT_FOUND
        assert (await client.get_prefix(changes))[0] == before
        await client.aclose()

        await gateways.call(1, Method.ADD_WORKER, cpb.AddWorkerRequest(address=address))
        with trio.fail_after(10):
            while address not in await addresses(0):  # noqa: ASYNC110 (its answers)
                await trio.sleep(0.05)
        assert address in await addresses(1)
        # Removed on the other by its label there; the first gateway names it by address.
        label = next(m.worker for m in (await gateways.status(0)).members if m.address == address)
        await gateways.call(0, Method.REMOVE_WORKER, cpb.RemoveWorkerRequest(worker=label))
        with trio.fail_after(10):
            while address in await addresses(1):  # noqa: ASYNC110 (its answers)
                await trio.sleep(0.05)
        assert address not in await addresses(0)


async def test_workers_placed_by_load_and_unload_are_moved_by_the_placer_only(
    etcd: EtcdProcess,
) -> None:
    """Triton-like workers (repository extension, no control plane): each handed model is
    loaded only where the shared placement puts it; calls through the follower succeed;
    a wider placement asked of the follower is loaded by the placer and used by both."""
    handed = RepositoryConfig(models=("simple",))
    async with open_fleet(
        4,
        worker_overrides={"api": WorkerApi.TRITON},
        scheduling=KNOBS,
        repository=handed,
        coordination=coordination(etcd, "gw-a"),
    ) as fleet:
        gateways = await two_gateways(fleet, etcd, handed)
        statuses = await gateways.settled()
        follower = gateways.follower(statuses)

        async def loaded() -> list[str]:
            urls = []
            for index in range(len(fleet.workers)):
                channel = Channel(fleet.worker_url(index), fleet.nursery)
                reply = await channel.unary(
                    Method.REPOSITORY_INDEX.wire,
                    pb.RepositoryIndexRequest(ready=True).SerializeToString(),
                )
                await channel.aclose()
                names = {m.name for m in pb.RepositoryIndexResponse.FromString(reply).models}
                if "simple" in names:
                    urls.append(fleet.worker_url(index))
            return sorted(urls)

        with trio.fail_after(30):  # the placer's startup move is carried out
            while len(await loaded()) != 1:  # noqa: ASYNC110 (the workers' answers)
                await trio.sleep(0.1)
        assert await loaded() == list(placements(statuses[follower])["simple"])
        request = infer_request("simple", simple_inputs(5)).SerializeToString()
        for _ in range(10):
            await gateways.channels[follower].unary(Method.MODEL_INFER.wire, request)

        await gateways.call(
            follower,
            Method.SET_MODEL_PLACEMENT,
            cpb.SetModelPlacementRequest(name="simple", replicas=3),
        )
        await gateways.call(follower, Method.REPACK, cpb.RepackRequest(wait_seconds=20))
        with trio.fail_after(30):
            while len(await loaded()) != 3:  # noqa: ASYNC110 (the workers' answers)
                await trio.sleep(0.1)
        statuses = await gateways.settled()
        assert len(placements(statuses[follower])["simple"]) == 3
        for index in (0, 1):
            for _ in range(10):
                await gateways.channels[index].unary(Method.MODEL_INFER.wire, request)
        # Only the placer loaded and unloaded.
        actions = [await placement_actions(g) for g in gateways.gateways]
        assert actions[follower] == {"load": 0.0, "unload": 0.0}
        assert actions[1 - follower]["load"] > 0


async def placement_actions(gateway: RunningGateway) -> dict[str, float]:
    """`gateway_placement_actions_total` by action, from the gateway's /metrics."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{gateway.admin_port}/metrics")).text
    found = {}
    for line in text.splitlines():
        if line.startswith("gateway_placement_actions_total{"):
            action = line.split('action="', 1)[1].split('"', 1)[0]
            found[action] = float(line.rsplit(" ", 1)[1])
    return found


async def test_a_cold_model_called_through_the_follower_is_loaded_once_by_the_placer(
    etcd: EtcdProcess,
) -> None:
    """Issue 49: three handed models, room for one on each of two workers: one is cold.
    Eight calls for it through the follower load it once, on one worker, by the placer."""
    models = ("m0", "m1", "m2")
    handed = RepositoryConfig(
        models=models,
        default_weight_bytes=100,
        worker_budget_bytes=100,
        min_residency_seconds=0.0,
    )
    catalogue = parse_catalogue({"models": [simple_model(name=m) for m in models]}, source="t")
    async with open_fleet(
        2,
        catalogues=[catalogue, catalogue],
        worker_overrides={"api": WorkerApi.TRITON, "loaded_at_start": frozenset()},
        scheduling=KNOBS,
        repository=handed,
        coordination=coordination(etcd, "gw-a"),
    ) as fleet:
        gateways = await two_gateways(fleet, etcd, handed)
        statuses = await gateways.settled()
        follower = gateways.follower(statuses)

        async def holders(model: str) -> list[int]:
            return [
                index
                for index in range(2)
                if (await repository_states(fleet, index)).get(model) == "READY"
            ]

        with trio.fail_after(30):  # the start-up placement: one model on each worker
            while len([m for m in models if await holders(m)]) != 2:  # noqa: ASYNC110
                await trio.sleep(0.1)
        (cold,) = [m for m in models if not await holders(m)]
        request = infer_request(cold, simple_inputs(3)).SerializeToString()
        call = functools.partial(gateways.channels[follower].unary, Method.MODEL_INFER.wire)
        async with trio.open_nursery() as calls:
            for _ in range(8):
                calls.start_soon(call, request)
        assert len(await holders(cold)) == 1
        loads = [await residency_loads(g) for g in gateways.gateways]
        assert loads[follower] == 0
        assert loads[1 - follower] == 1


async def residency_loads(gateway: RunningGateway) -> float:
    """`gateway_residency_changes_total{action="load",reason="demand"}` of `gateway`."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{gateway.admin_port}/metrics")).text
    prefix = 'gateway_residency_changes_total{action="load",reason="demand"}'
    lines = text.splitlines()
    return next(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))
