"""In-process fleets for gateway tests: N simulated workers and a gateway, one Trio run."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from rsgw._config import GatewayConfig, ListenConfig
from rsgw.gateway._gateway import RunningGateway, serve_gateway
from rsgw.worker._catalogue import Catalogue, builtin_catalogue
from rsgw.worker._worker import RunningWorker, WorkerConfig, serve_worker


@dataclass
class Fleet:
    workers: list[RunningWorker]
    gateway: RunningGateway
    nursery: trio.Nursery

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.gateway.grpc_port}"


def gateway_config(workers: list[RunningWorker], **overrides: Any) -> GatewayConfig:
    config = GatewayConfig(
        endpoints=tuple(f"127.0.0.1:{w.grpc_port}" for w in workers),
        metrics_endpoints=tuple(f"127.0.0.1:{w.metrics_port}" for w in workers),
        worker_names=tuple(w.config.name for w in workers),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0"),
        health_interval_seconds=overrides.pop("health_interval_seconds", 0.2),
    )
    return dataclasses.replace(config, **overrides)


@asynccontextmanager
async def open_fleet(
    count: int = 3,
    *,
    catalogues: list[Catalogue] | None = None,
    worker_overrides: dict[str, Any] | list[dict[str, Any]] | None = None,
    **gateway_overrides: Any,
) -> AsyncIterator[Fleet]:
    async with trio.open_nursery() as nursery:
        workers: list[RunningWorker] = []
        for i in range(count):
            extra = worker_overrides or {}
            if isinstance(extra, list):
                extra = extra[i]
            config = WorkerConfig(
                name=f"worker{i}",
                gpu=str(i),
                port=0,
                metrics_port=0,
                catalogue=catalogues[i] if catalogues else builtin_catalogue(),
                **extra,
            )
            workers.append(await nursery.start(serve_worker, config))
        gateway = await nursery.start(serve_gateway, gateway_config(workers, **gateway_overrides))
        try:
            yield Fleet(workers, gateway, nursery)
        finally:
            nursery.cancel_scope.cancel()
