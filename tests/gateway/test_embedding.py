"""Embedding the gateway in a Trio application (issue 5, item 9)."""

from __future__ import annotations

import socket

import trio

import rsgw
from rsgw.gateway._gateway import open_gateway, serve_gateway
from rsgw.worker._worker import WorkerConfig, open_worker
from tests.gateway.fleet import gateway_config
from tests.helpers import check_simple


def refuses(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_embed_serve_aclose_and_ports_refuse() -> None:
    async with open_worker(WorkerConfig(port=0, metrics_port=0)) as worker:
        config = gateway_config([worker])
        async with trio.open_nursery() as nursery:
            gateway = await nursery.start(serve_gateway, config)
            assert gateway.grpc_port > 0 and gateway.admin_port > 0
            await trio.to_thread.run_sync(check_simple, f"127.0.0.1:{gateway.grpc_port}", 5)
            status = gateway.status()
            assert status.ready == frozenset(config.endpoints)
            assert "simple" in status.models
            await gateway.aclose()
        assert refuses(gateway.grpc_port)
        assert refuses(gateway.admin_port)


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
