"""lpt_packing placing models by loading and unloading them (Triton's repository extension).

Workers answering as stock Triton (`rsgw worker --api triton`) have no ReactantServer
control plane; the models handed to the gateway (`repository.models`) are loaded only
where their placement puts them and unloaded elsewhere, and the others are left alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import trio
from trio.testing import MockClock

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._methods import Method
from rsgw.config._config import SchedulingConfig, SchedulingMode
from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.worker._worker import WorkerApi
from tests.gateway.fleet import Fleet, open_fleet, repository_states
from tests.helpers import infer_request, output_array, simple_inputs

HANDED = ("simple", "simple_int8")
TRITON = {"api": WorkerApi.TRITON}
LPT = SchedulingConfig(mode=SchedulingMode.LPT_PACKING)


async def states(fleet: Fleet, index: int) -> dict[str, str]:
    return await repository_states(fleet, index)


async def holders(fleet: Fleet, model: str) -> list[int]:
    return [i for i in range(len(fleet.workers)) if (await states(fleet, i))[model] == "READY"]


async def settled(fleet: Fleet, posted: int) -> None:
    """Wait (on the mock clock) until the placement numbered `posted` is carried out."""
    packing = fleet.gateway._packing
    assert packing is not None
    with trio.fail_after(120):
        await packing.placer.wait_carried(posted)


@asynccontextmanager
async def placed_fleet() -> AsyncIterator[Fleet]:
    """Four Triton-like workers under lpt_packing, `HANDED` placed; after the first move."""
    async with open_fleet(
        4,
        memory=True,
        worker_overrides=TRITON,
        scheduling=LPT,
        repository=RepositoryConfig(models=HANDED),
    ) as fleet:
        await settled(fleet, 1)
        yield fleet


async def test_a_model_placed_on_one_of_four_workers_is_loaded_there_only(
    autojump_clock: MockClock,
) -> None:
    async with placed_fleet() as fleet:
        for model in HANDED:
            assert len(await holders(fleet, model)) == 1, model
            placed = fleet.gateway.statistics().placement[model]
            assert [fleet.worker_url(i) for i in await holders(fleet, model)] == list(placed)
        # A model not handed to the gateway is left loaded everywhere.
        assert await holders(fleet, "simple_string") == [0, 1, 2, 3]
        # Calls go to the holder and succeed.
        for seed in range(8):
            inputs = simple_inputs(seed)
            response = await fleet.infer(infer_request("simple", inputs))
            total = output_array(response, "OUTPUT0")
            np.testing.assert_array_equal(total, inputs["INPUT0"] + inputs["INPUT1"])
        status = cpb.GetSchedulingStatusResponse.FromString(
            await fleet.channel().unary(
                Method.GET_SCHEDULING_STATUS.wire,
                cpb.GetSchedulingStatusRequest().SerializeToString(),
            )
        )
        assert not [w for w in status.warnings if "not placed" in w]


async def test_no_model_is_touched_unless_handed_to_the_gateway(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(3, memory=True, worker_overrides=TRITON, scheduling=LPT) as fleet:
        prober = fleet.gateway._service.prober
        await prober.next_round()
        await prober.next_round()
        for model in ("simple", "simple_int8"):
            assert await holders(fleet, model) == [0, 1, 2]


async def test_moves_under_load_fail_no_call(autojump_clock: MockClock) -> None:
    # The operator widens `simple` to three replicas, then narrows it to one, each with
    # a repack, while calls keep coming: loads land before routing uses them, and a
    # worker is drained of its calls before the model is unloaded there.
    async with placed_fleet() as fleet:
        client = fleet.channel()
        answered = 0
        done = trio.Event()

        async def caller(seed: int) -> None:
            nonlocal answered
            while not done.is_set():
                inputs = simple_inputs(seed)
                response = await fleet.infer(infer_request("simple", inputs))
                total = output_array(response, "OUTPUT0")
                np.testing.assert_array_equal(total, inputs["INPUT0"] + inputs["INPUT1"])
                answered += 1

        async def place(replicas: int) -> None:
            request = cpb.SetModelPlacementRequest(name="simple", replicas=replicas)
            await client.unary(Method.SET_MODEL_PLACEMENT.wire, request.SerializeToString())
            reply = await client.unary(
                Method.REPACK.wire, cpb.RepackRequest(wait_seconds=30).SerializeToString()
            )
            # Served once the loads and unloads are done.
            assert cpb.RepackResponse.FromString(reply).completed

        async with trio.open_nursery() as nursery:
            for seed in range(8):
                nursery.start_soon(caller, seed)
            await place(3)
            assert len(await holders(fleet, "simple")) == 3
            await place(1)
            assert len(await holders(fleet, "simple")) == 1
            done.set()
        assert answered > 0
        # Both models started on all four workers and end on one each: six more unloads
        # than loads (none of a model already loaded), every one of them carried out.
        metrics = fleet.gateway._service.metrics
        loads = metrics.placement_actions.labels("load")._value.get()
        unloads = metrics.placement_actions.labels("unload")._value.get()
        assert loads >= 2
        assert unloads - loads == 6
        for stage in ("load", "unload", "compaction"):
            assert metrics.repack_failures.labels(stage)._value.get() == 0, stage
