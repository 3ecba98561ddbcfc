"""Coordinated gateways when things fail: the placer dies, etcd stops (issue 39's third
acceptance), against a real etcd and four simulated workers."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import trio

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import RsgwError
from rsgw.base._methods import Method
from rsgw.config._config import GatewayConfig
from rsgw.gateway._running import RunningGateway
from rsgw.grpc._client import Channel
from rsgw.runtime._net import TCP
from tests.coordination.test_two_gateways import KNOBS, coordination, one_placement, placements
from tests.etcd import EtcdProcess
from tests.gateway.fleet import Fleet, gateway_config, open_fleet, start_gateway
from tests.helpers import infer_request, simple_inputs, wait_until_async

TTL = 3

Started = tuple[RunningGateway, trio.CancelScope]


async def run_gateway(
    config: GatewayConfig,
    *,
    task_status: trio.TaskStatus[
        tuple[RunningGateway, trio.CancelScope]
    ] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A gateway that the test can end abruptly (as SIGKILL would: nothing said to etcd)."""
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            gateway = await nursery.start(functools.partial(start_gateway, config, TCP))
            task_status.started((gateway, scope))
            await trio.sleep_forever()


class Pair:
    def __init__(self, fleet: Fleet, etcd: EtcdProcess) -> None:
        self.fleet = fleet
        self.etcd = etcd
        self.gateways: list[RunningGateway] = []
        self.scopes: list[trio.CancelScope] = []
        self.channels: list[Channel] = []
        self.failures: list[str] = []
        self.answered = [0, 0]

    async def start(self) -> None:
        for name in ("gw-a", "gw-b"):
            config = gateway_config(
                self.fleet.workers,
                scheduling=KNOBS,
                coordination=dataclasses.replace(
                    coordination(self.etcd, name), lease_ttl_seconds=TTL
                ),
            )
            gateway, scope = await self.fleet.nursery.start(run_gateway, config)
            self.gateways.append(gateway)
            self.scopes.append(scope)
            self.channels.append(Channel(f"127.0.0.1:{gateway.grpc_port}", self.fleet.nursery))

    async def status(self, index: int) -> cpb.GetSchedulingStatusResponse:
        reply = await self.channels[index].unary(
            Method.GET_SCHEDULING_STATUS.wire,
            cpb.GetSchedulingStatusRequest().SerializeToString(),
            deadline=trio.current_time() + 5,
        )
        return cpb.GetSchedulingStatusResponse.FromString(reply)

    async def settled(self) -> list[cpb.GetSchedulingStatusResponse]:
        """One placer and one follower at the same epoch and placement."""
        with trio.fail_after(30):
            while True:
                seen = [await self.status(0), await self.status(1)]
                if one_placement(seen):
                    return seen
                await trio.sleep(0.05)

    async def until(
        self, index: int, holds: Callable[[cpb.GetSchedulingStatusResponse], bool], seconds: float
    ) -> cpb.GetSchedulingStatusResponse:
        """Gateway `index`'s status once `holds` is true of it (fail after `seconds`)."""
        with trio.fail_after(seconds):
            while not holds(status := await self.status(index)):  # noqa: ASYNC110 (its answers)
                await trio.sleep(0.05)
        return status

    async def load(self, index: int) -> None:
        """Calls to gateway `index` one after another until cancelled; failures kept."""
        request = infer_request("simple", simple_inputs(index)).SerializeToString()
        while True:
            try:
                await self.channels[index].unary(
                    Method.MODEL_INFER.wire, request, deadline=trio.current_time() + 10
                )
                self.answered[index] += 1
            except RsgwError as exc:
                self.failures.append(f"gateway {index}: {exc}")
            await trio.sleep(0.01)


async def test_when_the_placer_dies_the_other_places_from_its_placement(
    etcd: EtcdProcess,
) -> None:
    async with open_fleet(4) as fleet:  # the fleet's own gateway plays no part
        pair = Pair(fleet, etcd)
        await pair.start()
        before = await pair.settled()
        placer = [s.coordination.state for s in before].index("placer")
        survivor = 1 - placer
        async with trio.open_nursery() as load:
            load.start_soon(pair.load, survivor)
            await wait_until_async(lambda: pair.answered[survivor] >= 20, 10)
            pair.scopes[placer].cancel()  # dies without a word to etcd
            died = trio.current_time()
            await pair.until(survivor, lambda s: s.coordination.state == "placer", TTL + 5)
            took = trio.current_time() - died
            answered = pair.answered[survivor]
            # and it goes on serving as the placer
            await wait_until_async(lambda: pair.answered[survivor] >= answered + 20, 10)
            load.cancel_scope.cancel()
        # About one lease TTL; five of them is the margin for a busy two-core runner.
        assert took <= 5 * TTL, took
        assert pair.failures == []
        after = await pair.status(survivor)
        # No cold placement: the survivor places from the placement it followed.
        assert placements(after) == placements(before[survivor])
        assert after.coordination.epoch == before[survivor].coordination.epoch
        reply = cpb.RepackResponse.FromString(
            await pair.channels[survivor].unary(
                Method.REPACK.wire, cpb.RepackRequest(wait_seconds=20).SerializeToString()
            )
        )
        assert reply.completed
        epoch = after.coordination.epoch  # its repack is published (a moment after)
        await pair.until(survivor, lambda s: s.coordination.epoch > epoch, 10)


async def test_while_etcd_is_stopped_routing_goes_on_and_nothing_repacks(
    etcd: EtcdProcess,
) -> None:
    async with open_fleet(4) as fleet:
        pair = Pair(fleet, etcd)
        await pair.start()
        before = await pair.settled()
        repacks = [s.repack.repack_count for s in before]
        async with trio.open_nursery() as load:
            load.start_soon(pair.load, 0)
            load.start_soon(pair.load, 1)
            etcd.pause()
            try:
                for i in (0, 1):  # both notice, within a keep-alive's timeout
                    await pair.until(i, lambda s: s.coordination.state == "disconnected", 20)
                answered = list(pair.answered)
                await trio.sleep(TTL * 2)  # past the leases' TTL, still stopped
                during = [await pair.status(0), await pair.status(1)]
                assert all(pair.answered[i] > answered[i] + 10 for i in (0, 1)), pair.answered
            finally:
                etcd.resume()
            after = await pair.settled()
            load.cancel_scope.cancel()
        assert pair.failures == []
        for i in (0, 1):
            assert during[i].repack.repack_count == repacks[i]
            assert placements(during[i]) == placements(before[i])
            assert (
                during[i].coordination.state == "disconnected" and during[i].coordination.last_error
            )
        assert placements(after[0]) == placements(before[0])
