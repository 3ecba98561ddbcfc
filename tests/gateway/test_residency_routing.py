"""Pinning on an externally-managed worker flips the gateway's routing (issue 5, item 8)."""

from __future__ import annotations

import grpc
import pytest
import trio

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.worker._weights import ResidencyMode
from tests.gateway.fleet import open_fleet
from tests.helpers import check_simple, wait_until_async
from tests.worker.control import set_residency


async def test_pin_and_unpin_flip_routing_on_the_next_probe_round() -> None:
    async with open_fleet(
        2,
        worker_overrides={"residency_mode": ResidencyMode.EXTERNALLY_MANAGED},
        health_interval_seconds=0.2,
    ) as fleet:
        prober = fleet.gateway._service.prober
        assert prober.table.replicas("simple") == ()
        with pytest.raises(grpc.RpcError) as caught:
            await trio.to_thread.run_sync(check_simple, fleet.target, 0)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND

        worker1 = f"127.0.0.1:{fleet.workers[1].grpc_port}"
        await trio.to_thread.run_sync(set_residency, worker1, "simple", cpb.PINNED_DEVICE)
        await wait_until_async(
            lambda: prober.table.replicas("simple") == (worker1,), what="pin to show up"
        )
        for seed in range(4):
            await trio.to_thread.run_sync(check_simple, fleet.target, seed)
        assert fleet.workers[1].service.device.counters["simple"].requests_served == 4

        await trio.to_thread.run_sync(set_residency, worker1, "simple", cpb.UNPINNED)
        await wait_until_async(lambda: prober.table.replicas("simple") == (), what="unpin")
