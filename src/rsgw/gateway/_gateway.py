"""`serve_gateway`: the gateway's nursery tree, and the handle it hands out.

Started in dependency order, each child reporting ready before the next starts
(docs/product.md §4): the parts are built (`rsgw.gateway._parts`: the worker
channels are lazy, so building them is instant), then the admin HTTP server, the
`dns:///` targets, coordination, the repack loop, the prober (its first discovery
round completes before we go on, so the first request already has a routing table),
the watchdog, and last the doors (`rsgw.gateway._doors`). `RunningGateway` is handed
out only once every port listens.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import trio

from rsgw.config._config import GatewayConfig
from rsgw.gateway._doors import (
    Tls,
    build_grpc,
    guarded_handlers,
    start_admin,
    start_grpc,
    start_rest,
)
from rsgw.gateway._parts import (
    Fleet,
    build_fleet,
    build_members,
    build_service,
    start_control,
    worker_tls,
)
from rsgw.gateway._running import RunningGateway
from rsgw.gateway.calls._guard import RELOAD_CHECK_SECONDS, Guard
from rsgw.runtime._net import TCP, Network, split_host_port

logger = logging.getLogger(__name__)


async def serve_gateway(
    config: GatewayConfig,
    *,
    network: Network = TCP,
    reload_config: Callable[[], GatewayConfig] | None = None,
    config_file: str | None = None,
    task_status: trio.TaskStatus[RunningGateway] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the gateway until cancelled (or `RunningGateway.aclose()`).

    `network` carries the gRPC listener and the connections to the workers (TCP
    unless an embedding application or a test says otherwise); the admin HTTP
    server and the worker metrics scrapes always use TCP. `reload_config` reads
    gateway.yml again for `RunningGateway.reload` (SIGHUP); without it a reload
    reads only the certificates and tokens. With `config_file` too, the workers are
    applied again whenever that file changes (checked every second).

    Raises:
        ListenError: the gRPC or admin address is busy or cannot be bound.
        GatewayWedged: every worker probe hung for `wedge_exit_rounds` rounds.
        StartupError: under lpt_packing, the fleet is not all up within the startup
            wait, or a worker does not batch or serves a different model set.
    """
    _announce(config)
    async with trio.open_nursery() as nursery, _scrape_client(config) as http:
        fleet = build_fleet(config, nursery, network)
        service = build_service(config, fleet)
        if service.infer.tracer is not None:  # the spans still queued go when it stops
            nursery.start_soon(_at_stop, service.infer.tracer.close)
        members, discovery, intake = build_members(config, nursery, fleet, service)
        tls, guard = Tls.load(config), Guard(config.auth)  # files that do not load stop here
        await nursery.start(guard.watch)
        admin_port = await start_admin(nursery, config, fleet, http, tls)
        await nursery.start(discovery.serve)  # the dns:/// endpoints have answered once
        await _start_fleet(nursery, fleet)
        control = await start_control(nursery, config, fleet, members, service.tenancy)
        handlers = guarded_handlers(config, service, control, guard, fleet.metrics, fleet.prober)
        server = build_grpc(config, handlers, service, fleet.metrics, intake, tls)
        members.own_port = grpc_port = await start_grpc(nursery, config, server, network)
        rest, http_port = await start_rest(nursery, config, handlers, service, server, tls)
        _announce_serving(config, fleet, members.inbound_cap, admin_port, grpc_port, http_port)
        running = RunningGateway(
            config,
            grpc_port,
            admin_port,
            server,
            service,
            fleet.packing,
            nursery.cancel_scope,
            members=members,
            discovery=discovery,
            reload_config=reload_config,
            reloadables=(guard, *tls.reloadables),
            rest=rest,
            http_port=http_port,
            coordinator=control.coordination,
        )
        if config_file and reload_config is not None:  # stamped now: no change is missed
            stamp, reload = _stamp(config_file), running.reload_workers
            nursery.start_soon(_watch_config, config_file, stamp, reload)
        task_status.started(running)
        await trio.sleep_forever()


async def _at_stop(close: Callable[[], None]) -> None:
    """Call `close` when the gateway stops."""
    try:
        await trio.sleep_forever()
    finally:
        close()


def _announce(config: GatewayConfig) -> None:
    """Say what the configuration warns of, and which settings the environment set."""
    for warning in config.warnings:
        logger.warning(warning)
    if config.env_overrides:
        logger.info(
            "gateway configuration overridden by environment",
            extra={"variables": list(config.env_overrides)},
        )


def _scrape_client(config: GatewayConfig) -> httpx.AsyncClient:
    """The HTTP client of the worker metrics scrapes (`/metrics` merges them)."""
    return httpx.AsyncClient(
        timeout=config.metrics.scrape_timeout_seconds,
        verify=worker_tls(config, ["http/1.1"]) or True,
    )


async def _start_fleet(nursery: trio.Nursery, fleet: Fleet) -> None:
    """Coordination (connected to etcd, or it said why not), the repack loop (the
    fleet waited for, the first placement in force), the prober (its first round
    done), the watchdog."""
    packing = fleet.packing
    if packing is not None:
        coordinator = packing.coordination
        if coordinator is not None:
            fleet.metrics.watch_coordination(
                lambda: coordinator.view,
                lambda: coordinator.elections_won,
                lambda: coordinator.publications,
            )
            await nursery.start(coordinator.run)
        await packing.start()
        await nursery.start(packing.serve)
    await nursery.start(fleet.prober.serve)
    await nursery.start(fleet.watchdog.serve)


def _announce_serving(
    config: GatewayConfig,
    fleet: Fleet,
    inbound_cap: int,
    admin_port: int,
    grpc_port: int,
    http_port: int | None,
) -> None:
    grpc_host, _ = split_host_port(config.listen.grpc)
    admin_host, _ = split_host_port(config.listen.metrics)
    logger.info(
        "gateway serving",
        extra={
            "grpc": f"{grpc_host}:{grpc_port}",
            "metrics": f"{admin_host}:{admin_port}",
            "grpc_port": grpc_port,
            "metrics_port": admin_port,
            "http_port": http_port,
            "endpoints": list(fleet.pool.urls),
            "mode": str(config.scheduling.mode),
            "max_concurrent_requests": inbound_cap,
            "outbound_streams_per_worker": config.worker_client.max_concurrent_streams,
        },
    )


async def _watch_config(
    path: str, stamp: tuple[int, int] | None, changed: Callable[[], None]
) -> None:
    """Apply gateway.yml's workers whenever the file changes from `stamp` (checked every
    second), as SIGHUP does: an operator, or a ConfigMap update, need not signal."""
    while True:
        await trio.sleep(RELOAD_CHECK_SECONDS)
        now = _stamp(path)
        if now != stamp:
            stamp = now
            logger.info("gateway.yml changed; applying its workers", extra={"file": path})
            changed()


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size)


@asynccontextmanager
async def open_gateway(
    config: GatewayConfig, *, network: Network = TCP
) -> AsyncIterator[RunningGateway]:
    """A gateway for the duration of the block; stopped gracefully on exit."""
    async with trio.open_nursery() as nursery:
        gateway: RunningGateway = await nursery.start(
            functools.partial(serve_gateway, network=network), config
        )
        try:
            yield gateway
        finally:
            with trio.CancelScope(shield=True):
                await gateway.aclose()
