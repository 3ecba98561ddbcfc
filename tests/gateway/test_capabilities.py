"""What the gateway learns each worker implements, and how it acts on it.

rsgw's own worker implements every optional part of the API, so every capability is
learned present; the real servers that lack some (MLServer, KServe's ModelServer)
are in tests/thirdparty.
"""

from __future__ import annotations

from trio.testing import MockClock

from rsgw._methods import Method
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.scheduling._capabilities import Capability
from tests.gateway.fleet import open_fleet

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
