"""Embedding the gateway in a Trio application (issue 5, item 9).

`test_embed_serve_aclose_and_ports_refuse` runs worker and gateway on memory
streams with the autojump clock: it tests the embedding API (`nursery.start`,
the status snapshot, `aclose()` releasing the listeners), not the socket, and
`aclose()`'s grace and linger periods cost no wall time there. The admin HTTP
listener is always TCP, so its release is checked with a real (synchronous)
connect, which never waits on the Trio clock.

The other two stay on loopback TCP: `open_gateway` takes no network, so they
test what an embedding application really gets from it, real bound ports that
refuse once the block exits, and two gateways in one process each with its own
ports and metrics registry.
"""

from __future__ import annotations

import socket
from functools import partial

import numpy as np
import pytest
import trio
from trio.testing import MockClock

import rsgw
from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import WorkerUnavailable
from rsgw.base._methods import Method
from rsgw.gateway._gateway import open_gateway, serve_gateway
from rsgw.gateway._running import RunningGateway
from rsgw.grpc._client import Channel
from rsgw.worker._worker import RunningWorker, WorkerConfig, open_worker, serve_worker
from tests.gateway.fleet import gateway_config
from tests.helpers import check_simple, infer_request, output_array, simple_inputs
from tests.memory import MemoryNetwork


def refuses(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def check_simple_via(channel: Channel, seed: int) -> None:
    """`tests.helpers.check_simple` with rsgw's own client."""
    inputs = simple_inputs(seed)
    request = infer_request("simple", inputs).SerializeToString()
    response = pb.ModelInferResponse.FromString(
        await channel.unary(Method.MODEL_INFER.wire, request)
    )
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    np.testing.assert_array_equal(output_array(response, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(response, "OUTPUT1"), a - b)


async def test_embed_serve_aclose_and_ports_refuse(autojump_clock: MockClock) -> None:
    network = MemoryNetwork()
    async with trio.open_nursery() as outer:
        worker: RunningWorker = await outer.start(
            partial(serve_worker, network=network), WorkerConfig(port=0, metrics_port=-1)
        )
        config = gateway_config([worker], with_metrics=False)
        async with trio.open_nursery() as nursery:
            gateway: RunningGateway = await nursery.start(
                partial(serve_gateway, network=network), config
            )
            assert gateway.grpc_port > 0 and gateway.admin_port > 0
            target = f"127.0.0.1:{gateway.grpc_port}"
            await check_simple_via(Channel(target, outer, network=network), 5)
            status = gateway.status()
            assert status.ready == frozenset(config.endpoints)
            assert "simple" in status.models
            await gateway.aclose()
        with pytest.raises(ConnectionRefusedError):  # the gRPC listener is gone
            await network.connect(target)
        with pytest.raises(WorkerUnavailable):  # and a new client is refused, not left waiting
            await check_simple_via(Channel(target, outer, network=network), 5)
        assert refuses(gateway.admin_port)
        outer.cancel_scope.cancel()


async def test_open_gateway_context_manager() -> None:
    async with open_worker(WorkerConfig(port=0, metrics_port=0)) as worker:
        async with open_gateway(gateway_config([worker])) as gateway:
            await trio.to_thread.run_sync(check_simple, f"127.0.0.1:{gateway.grpc_port}", 6)
        assert refuses(gateway.grpc_port)


def test_two_gateways_in_one_process_have_their_own_registries() -> None:
    async def main() -> None:
        async with open_worker(WorkerConfig(port=0, metrics_port=0)) as worker:
            config = gateway_config([worker])
            async with open_gateway(config) as a, open_gateway(config) as b:
                assert a.grpc_port != b.grpc_port
                assert a._service.metrics.registry is not b._service.metrics.registry

    trio.run(main)
    assert rsgw.GatewayConfig is not None
