"""Pinning on an externally-managed worker flips the gateway's routing (issue 5, item 8).

Workers, gateway and client run on memory streams with the autojump clock: what
is tested is the prober picking up a worker's residency on its next round, not
the socket, so the probe interval costs no wall time. SetModelResidency goes to
the worker with rsgw's own channel, inference through the gateway with
`Fleet.infer`.
"""

from __future__ import annotations

import numpy as np
import pytest
from trio.testing import MockClock

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.worker.device._weights import ResidencyMode
from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import infer_request, output_array, simple_inputs, wait_until_async


async def check_simple(fleet: Fleet, seed: int) -> None:
    """`tests.helpers.check_simple` through the gateway with rsgw's own client."""
    inputs = simple_inputs(seed)
    response = await fleet.infer(infer_request("simple", inputs))
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    np.testing.assert_array_equal(output_array(response, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(response, "OUTPUT1"), a - b)


async def set_residency(channel: Channel, model: str, residency: cpb.Residency) -> int:
    """SetModelResidency on one worker; the residency it reports afterwards."""
    request = cpb.SetModelResidencyRequest(name=model, target=residency)
    reply = await channel.unary(Method.SET_MODEL_RESIDENCY.wire, request.SerializeToString())
    return int(cpb.SetModelResidencyResponse.FromString(reply).residency)


async def test_pin_and_unpin_flip_routing_on_the_next_probe_round(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(
        2,
        memory=True,
        worker_overrides={"residency_mode": ResidencyMode.EXTERNALLY_MANAGED},
        health_interval_seconds=0.2,
    ) as fleet:
        prober = fleet.gateway._service.prober
        assert prober.discovery.table.replicas("simple") == ()
        with pytest.raises(GrpcError) as caught:
            await check_simple(fleet, 0)
        assert caught.value.code is StatusCode.NOT_FOUND

        worker1 = fleet.worker_url(1)
        control = Channel(worker1, fleet.nursery, network=fleet.network)
        assert await set_residency(control, "simple", cpb.PINNED_DEVICE) == cpb.PINNED_DEVICE
        await wait_until_async(
            lambda: prober.discovery.table.replicas("simple") == (worker1,), what="pin to show up"
        )
        for seed in range(4):
            await check_simple(fleet, seed)
        assert fleet.workers[1].service.device.counters["simple"].requests_served == 4
        assert fleet.workers[0].service.device.counters["simple"].requests_served == 0

        assert await set_residency(control, "simple", cpb.UNPINNED) == cpb.UNPINNED
        await wait_until_async(
            lambda: prober.discovery.table.replicas("simple") == (), what="unpin"
        )
