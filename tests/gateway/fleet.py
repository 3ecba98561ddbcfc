"""In-process fleets for gateway tests: N simulated workers and a gateway, one Trio run.

`open_fleet(memory=True)` runs the whole fleet on `tests.memory.MemoryNetwork`:
workers, gateway and the test's client (`Fleet.infer`, rsgw's own channel) talk
over memory streams, so the test can take the autojump clock (name
`autojump_clock` in the test's arguments) and a timeout of seconds costs no wall
time. Workers then run without their admin HTTP server. Without `memory`, the
fleet listens on loopback TCP for real clients (grpcio, tritonclient, httpx),
which run in threads and so need the real clock.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import ListenError
from rsgw.base._methods import Method
from rsgw.config._config import GatewayConfig, ListenConfig
from rsgw.gateway._gateway import serve_gateway
from rsgw.gateway._running import RunningGateway
from rsgw.grpc._client import Channel
from rsgw.runtime._net import TCP, Network
from rsgw.worker._worker import RunningWorker, WorkerConfig, serve_worker
from rsgw.worker.models._catalogue import builtin_catalogue
from rsgw.worker.models._specs import Catalogue
from tests.memory import MemoryNetwork

#: Message limits of the test client: as large as the gateway's own default.
CLIENT_LIMIT = 512 * 1024 * 1024


@dataclass
class Fleet:
    workers: list[RunningWorker]
    gateway: RunningGateway
    nursery: trio.Nursery
    network: Network = TCP

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.gateway.grpc_port}"

    def worker_url(self, index: int) -> str:
        return f"127.0.0.1:{self.workers[index].grpc_port}"

    def channel(self, **options: Any) -> Channel:
        """rsgw's own client to the gateway, over the fleet's network."""
        options.setdefault("max_receive_message_bytes", CLIENT_LIMIT)
        options.setdefault("max_send_message_bytes", CLIENT_LIMIT)
        options.setdefault("max_concurrent_streams", 1000)
        return Channel(self.target, self.nursery, network=self.network, **options)

    async def restart_worker(self, index: int, config: WorkerConfig | None = None) -> RunningWorker:
        """Start worker `index` again on its port, after `kill()` or `aclose()`.

        As a restarted process would be: nothing registered, nothing resident.
        `config` (default: the old one) is started with the old port.
        """
        old = self.workers[index]
        config = dataclasses.replace(config or old.config, port=old.grpc_port)
        with trio.fail_after(10):
            while True:  # the old listener closes once its cancelled tasks unwind
                try:
                    worker: RunningWorker = await self.nursery.start(
                        start_worker, config, self.network
                    )
                    break
                except (ListenError, BaseExceptionGroup) as exc:
                    if not isinstance(leaf(exc), ListenError):
                        raise
                    await trio.sleep(0.05)
        self.workers[index] = worker
        return worker

    async def infer(
        self,
        request: pb.ModelInferRequest | bytes,
        *,
        deadline: float = math.inf,
        channel: Channel | None = None,
    ) -> pb.ModelInferResponse:
        """One ModelInfer through the gateway; raises the `RsgwError` it ended with."""
        body = request if isinstance(request, bytes) else request.SerializeToString()
        reply = await (channel or self.channel()).unary(
            Method.MODEL_INFER.wire, body, deadline=deadline
        )
        return pb.ModelInferResponse.FromString(reply)


async def repository_states(fleet: Fleet, index: int) -> dict[str, str]:
    """Worker `index`'s own RepositoryIndex, asked directly: model -> state."""
    request = pb.RepositoryIndexRequest(ready=False).SerializeToString()
    channel = Channel(fleet.worker_url(index), fleet.nursery, network=fleet.network)
    try:
        reply = await channel.unary(Method.REPOSITORY_INDEX.wire, request)
    finally:
        await channel.aclose()
    return {m.name: m.state for m in pb.RepositoryIndexResponse.FromString(reply).models}


def gateway_config(
    workers: list[RunningWorker], *, with_metrics: bool = True, **overrides: Any
) -> GatewayConfig:
    config = GatewayConfig(
        endpoints=tuple(f"127.0.0.1:{w.grpc_port}" for w in workers),
        metrics_endpoints=(
            tuple(f"127.0.0.1:{w.metrics_port}" for w in workers) if with_metrics else ()
        ),
        worker_names=tuple(w.config.name for w in workers),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
        health_interval_seconds=overrides.pop("health_interval_seconds", 0.2),
    )
    return dataclasses.replace(config, **overrides)


@asynccontextmanager
async def open_fleet(
    count: int = 3,
    *,
    memory: bool = False,
    catalogues: list[Catalogue] | None = None,
    worker_overrides: dict[str, Any] | list[dict[str, Any]] | None = None,
    reload_config: Callable[[], GatewayConfig] | None = None,
    config_file: str | None = None,
    **gateway_overrides: Any,
) -> AsyncIterator[Fleet]:
    network: Network = MemoryNetwork() if memory else TCP
    async with trio.open_nursery() as nursery:
        workers: list[RunningWorker] = []
        for i in range(count):
            extra = worker_overrides or {}
            if isinstance(extra, list):
                extra = extra[i]
            worker_config = WorkerConfig(
                name=f"worker{i}",
                gpu=str(i),
                port=0,
                metrics_port=-1 if memory else 0,
                catalogue=catalogues[i] if catalogues else builtin_catalogue(),
                **extra,
            )
            workers.append(await nursery.start(start_worker, worker_config, network))
        config = gateway_config(workers, with_metrics=not memory, **gateway_overrides)
        gateway = await nursery.start(
            functools.partial(start_gateway, reload_config=reload_config, config_file=config_file),
            config,
            network,
        )
        try:
            yield Fleet(workers, gateway, nursery, network)
        finally:
            nursery.cancel_scope.cancel()


def leaf(group: BaseException) -> BaseException:
    """The first leaf of a (possibly nested) exception group."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


async def start_worker(
    config: WorkerConfig,
    network: Network,
    *,
    task_status: trio.TaskStatus[RunningWorker] = trio.TASK_STATUS_IGNORED,
) -> None:
    await serve_worker(config, network=network, task_status=task_status)


async def start_gateway(
    config: GatewayConfig,
    network: Network,
    *,
    reload_config: Callable[[], GatewayConfig] | None = None,
    config_file: str | None = None,
    task_status: trio.TaskStatus[RunningGateway] = trio.TASK_STATUS_IGNORED,
) -> None:
    await serve_gateway(
        config,
        network=network,
        reload_config=reload_config,
        config_file=config_file,
        task_status=task_status,
    )
