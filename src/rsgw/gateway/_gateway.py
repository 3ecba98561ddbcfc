"""`serve_gateway`: the gateway's nursery tree, and the handle it hands out.

Started in dependency order, each child reporting ready before the next starts
(docs/product.md §4): the worker channels (lazy, so building them is instant), the
admin HTTP server, the prober (its first discovery round completes before we go
on, so the first request already has a routing table), then the gRPC listener.
`RunningGateway` is handed out only once both ports listen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import httpx
import trio

from rsgw._admin import serve_admin
from rsgw._config import GatewayConfig, SchedulingMode, env_name
from rsgw._errors import ConfigError, ListenError
from rsgw._exposition import add_runtime_series
from rsgw._net import TCP, Network, split_host_port
from rsgw._tls import ADMIN_ALPN, ALPN, ServerTls, TlsFiles, client_context
from rsgw.gateway._access import AccessLog
from rsgw.gateway._admin_routes import admin_app
from rsgw.gateway._admission import intake_limit
from rsgw.gateway._control import GatewayControl
from rsgw.gateway._coordinator import Coordinator, default_member
from rsgw.gateway._discovery import Discovery
from rsgw.gateway._guard import RELOAD_CHECK_SECONDS, Guard
from rsgw.gateway._members import Members
from rsgw.gateway._meta_poll import MetaPoller
from rsgw.gateway._metrics import GatewayMetrics
from rsgw.gateway._packing import Packing
from rsgw.gateway._pool import WorkerPool
from rsgw.gateway._prober import Prober
from rsgw.gateway._running import RunningGateway
from rsgw.gateway._service import GatewayService
from rsgw.gateway._settings import ServerSettings
from rsgw.gateway._watchdog import Watchdog
from rsgw.grpc._client import Channel
from rsgw.grpc._h2 import DEFAULT_WINDOW_BYTES
from rsgw.grpc._server import GrpcServer
from rsgw.grpc._standard import standard_services
from rsgw.rest._door import RestDoor
from rsgw.rest._listener import RestListener
from rsgw.scheduling._knobs import WorkBasis
from rsgw.scheduling._lookups import ModelLookups
from rsgw.scheduling._lpt import LptScheduler
from rsgw.scheduling._meta import RoutingMetaTracker
from rsgw.scheduling._packer import Packer
from rsgw.scheduling._schedulers import LeastOutstandingScheduler, RoundRobinScheduler, Scheduler
from rsgw.scheduling._stalls import StallWatch

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
    mode = config.scheduling.mode
    for warning in config.warnings:
        logger.warning(warning)
    if config.env_overrides:
        logger.info(
            "gateway configuration overridden by environment",
            extra={"variables": list(config.env_overrides)},
        )
    grpc_host, grpc_port = split_host_port(config.listen.grpc)
    admin_host, admin_port = split_host_port(config.listen.metrics)
    limits = config.grpc
    async with (
        trio.open_nursery() as nursery,
        httpx.AsyncClient(
            timeout=config.metrics.scrape_timeout_seconds,
            verify=_worker_tls(config, ["http/1.1"]) or True,
        ) as http,
    ):
        worker_tls = _worker_tls(config)

        def channel(url: str) -> Channel:
            return Channel(
                url,
                nursery,
                network=network,
                max_concurrent_streams=config.worker_client.max_concurrent_streams,
                max_receive_message_bytes=limits.max_recv_msg_bytes,
                max_send_message_bytes=limits.max_send_msg_bytes,
                ssl_context=worker_tls,
            )

        pool = WorkerPool(channel)
        metrics = GatewayMetrics(pool.label)
        prober = Prober(
            pool,
            metrics,
            interval=config.health_interval_seconds,
            probe_timeout=config.probe_timeout_seconds,
            wedge_rounds=config.wedge_exit_rounds,
            lookups=ModelLookups(
                config.discovery.models,
                found_ttl=config.discovery.found_ttl_seconds,
                miss_ttl=config.discovery.miss_ttl_seconds,
                per_second=config.discovery.lookups_per_second,
            ),
        )
        scheduler, packing, poller = _scheduler(config, pool, prober, metrics)
        add_runtime_series(metrics.registry, "gateway", scheduling_mode=str(config.scheduling.mode))

        def ready_replicas() -> dict[str, int]:
            table, ready = prober.discovery.table, prober.ready
            return {m: sum(u in ready for u in table.replicas(m)) for m in prober.discovery.known}

        metrics.track_model_replicas(ready_replicas)
        service = GatewayService(
            pool,
            prober,
            metrics,
            request_timeout=config.worker_client.request_timeout_seconds,
            max_concurrent_requests=config.max_concurrent_requests,
            max_requests_per_worker=config.grpc.max_concurrent_requests_per_worker,
            max_queue_seconds=config.grpc.max_queue_seconds,
            scheduler=scheduler,
            holders=None if packing is None else packing.holders,
            identity=config.server_metadata,
            max_message_bytes=limits.max_recv_msg_bytes,
            access=_access_log(config, pool),
            shm=config.shm,
            measured=None if poller is None else poller.measured,
        )
        prober.discovery.on_swap = service.on_table_swap
        members = Members(config, service, nursery)  # the configured workers join the pool
        discovery = Discovery.from_config(config, members)
        app = admin_app(config, pool, metrics, prober, http)
        tls, admin_tls = _server_tls(config, ALPN), _server_tls(config, ADMIN_ALPN)
        guard = Guard(config.auth)  # a tokens file that does not load stops the start here
        await nursery.start(guard.watch)
        with _naming("listen.metrics"):
            bound_admin = await nursery.start(
                functools.partial(serve_admin, tls=admin_tls),
                app,
                admin_host,
                admin_port,
            )
        await nursery.start(discovery.serve)  # the dns:/// endpoints have answered once
        coordinator = _coordinator(config, packing, network)
        if coordinator is not None:
            metrics.watch_coordination(
                lambda: coordinator.view,
                lambda: coordinator.elections_won,
                lambda: coordinator.publications,
            )
            await nursery.start(coordinator.run)  # connected to etcd, or it said why not
        if packing is not None:
            await packing.start()  # waits for the fleet; the first placement is in force
            await nursery.start(packing.serve)
        await nursery.start(prober.serve)
        outliers = config.outlier_detection
        watchdog = Watchdog(
            pool,
            prober,
            metrics,
            StallWatch(outliers.stall_seconds, outliers.ping_timeout_seconds),
            ejection_seconds=outliers.ejection_seconds,
        )
        await nursery.start(watchdog.serve)
        members.attach(watchdog=watchdog, packing=packing)
        control = GatewayControl(
            mode, packing, prober, metrics, members, poller.sources if poller else None
        )
        if coordinator is not None:
            control.coordinate(coordinator)
        settings = ServerSettings(
            metrics, config.logging.format, lambda model: model in prober.discovery.known
        )
        handlers = (
            service.handlers()
            | control.handlers()
            | {method.path: handler for method, handler in settings.handlers().items()}
        )
        pass_through = service.pass_through()
        standard, streams = standard_services([*handlers, *pass_through], lambda: prober.serving)
        guarded, guarded_through = guard.wrap(handlers | standard), guard.wrap(pass_through)
        uploads = config.connections.upload_budget()
        metrics.watch_uploads(uploads)
        server = GrpcServer(
            guarded,
            pass_through=guarded_through,
            stream_handlers=guard.wrap_streams(service.stream_handlers() | streams),
            on_refused=metrics.refused,
            time_limits=service.time_limits,
            max_receive_message_bytes=limits.max_recv_msg_bytes,
            max_send_message_bytes=limits.max_send_msg_bytes,
            limits=config.connections.limits(),
            max_running_calls=intake_limit(config.max_concurrent_requests),
            max_concurrent_streams=config.connections.max_concurrent_streams,
            tls=tls,
            upload_budget=uploads,
            window_bytes=config.connections.stream_window_bytes,
            connection_window_bytes=DEFAULT_WINDOW_BYTES,
        )
        members.attach(server=server)
        with _naming("listen.grpc"):
            bound_grpc = await nursery.start(
                functools.partial(server.serve, network=network), grpc_host, grpc_port
            )
        members.own_port = bound_grpc
        bound_http: int | None = None
        rest: RestListener | None = None
        if config.listen.http:
            door = RestDoor(
                guarded,
                guarded_through,
                time_limits=service.time_limits,
                max_body_bytes=limits.max_recv_msg_bytes,
                upload_budget=uploads,
            )
            http_host, http_port = split_host_port(config.listen.http)
            rest = RestListener(
                door,
                limits=config.connections.limits(),
                tls=admin_tls,
                max_concurrent_streams=config.connections.max_concurrent_streams,
                upload_budget=uploads,
            )
            with _naming("listen.http"):
                bound_http = await nursery.start(rest.serve, http_host, http_port)
        logger.info(
            "gateway serving",
            extra={
                "grpc": f"{grpc_host}:{bound_grpc}",
                "metrics": f"{admin_host}:{bound_admin}",
                "grpc_port": bound_grpc,
                "metrics_port": bound_admin,
                "http_port": bound_http,
                "endpoints": list(pool.urls),
                "mode": str(mode),
                "max_concurrent_requests": members.inbound_cap,
                "outbound_streams_per_worker": config.worker_client.max_concurrent_streams,
            },
        )
        running = RunningGateway(
            config,
            bound_grpc,
            bound_admin,
            server,
            service,
            packing,
            nursery.cancel_scope,
            members=members,
            discovery=discovery,
            reload_config=reload_config,
            reloadables=(guard, *(t for t in (tls, admin_tls) if t is not None)),
            rest=rest,
            http_port=bound_http,
            coordinator=coordinator,
        )
        if config_file and reload_config is not None:
            # Stamped now, so a change made once `started` returns is never missed.
            nursery.start_soon(
                _watch_config, config_file, _stamp(config_file), running.reload_workers
            )
        task_status.started(running)
        await trio.sleep_forever()


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


def _coordinator(
    config: GatewayConfig, packing: Packing | None, network: Network
) -> Coordinator | None:
    """The gateway's part in coordinating with others (`coordination.etcd_endpoints`),
    which only lpt_packing has a use for."""
    coordination = config.coordination
    if not coordination.enabled:
        return None
    if packing is None:
        logger.warning(
            "coordination.etcd_endpoints is set, but only lpt_packing coordinates gateways; "
            "this gateway routes on its own",
            extra={"mode": str(config.scheduling.mode)},
        )
        return None
    _, port = split_host_port(config.listen.grpc)
    member = coordination.member or default_member(port or os.getpid())
    return Coordinator(
        coordination, packing, member=member, address=config.listen.grpc, network=network
    )


def _scheduler(
    config: GatewayConfig, pool: WorkerPool, prober: Prober, metrics: GatewayMetrics
) -> tuple[Scheduler, Packing | None, MetaPoller | None]:
    """The scheduler for `scheduling.mode`, wired to its metrics and its metadata
    polls (the poller, when the mode reads work counters)."""
    scheduling = config.scheduling
    mode = scheduling.mode
    if mode is SchedulingMode.ROUND_ROBIN:
        logger.info("gateway scheduling", extra={"mode": str(mode)})
        return RoundRobinScheduler(), None, None
    tracker = RoutingMetaTracker(scheduling.routing_meta_halflife)
    if mode is SchedulingMode.LPT_PACKING:
        # The EMA halflife is held resolved, as the original's knobs hold it: a configured
        # 0 means "the rebalance budget at startup", not "whatever it is later".
        resolved = dataclasses.replace(
            scheduling, ema_halflife_compute_seconds=scheduling.resolved_ema_halflife
        )
        lpt = LptScheduler(resolved, Packer())
        packing = Packing(
            lpt,
            pool,
            prober,
            metrics,
            tracker,
            startup_wait=config.startup_wait_seconds,
            repository=config.repository,
        )
        placing = packing.poller = MetaPoller(
            pool, prober, tracker, lpt, packing.on_poll, repository=config.repository
        )
        prober.on_ready = placing.poll
        logger.info("gateway scheduling", extra={"mode": str(mode)})
        return lpt, packing, placing
    basis = WorkBasis(scheduling.work_basis)
    scheduler = LeastOutstandingScheduler(basis)
    metrics.track_inflight_work(lambda: str(basis), scheduler.loads)
    poller: MetaPoller | None = None
    if scheduler.needs_routing_meta:
        poller = MetaPoller(pool, prober, tracker, scheduler)
        prober.on_ready = poller.poll
    logger.info("gateway scheduling", extra={"mode": str(mode), "work_basis": str(basis)})
    return scheduler, None, poller


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


def _server_tls(config: GatewayConfig, alpn: list[str]) -> ServerTls | None:
    """A listener's TLS, or None (cleartext); files that do not load are a ConfigError."""
    if not config.tls.enabled:
        return None
    files = TlsFiles(config.tls.cert_file, config.tls.key_file, config.tls.client_ca_file)
    try:
        return ServerTls(files, alpn)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls: cannot load {config.tls.cert_file}: {exc}") from None


def _worker_tls(config: GatewayConfig, alpn: list[str] = ALPN) -> ssl.SSLContext | None:
    """The context for TLS to the workers, or None (cleartext)."""
    client = config.worker_client
    if not client.tls_ca_file:
        return None
    try:
        files = (client.tls_ca_file, client.tls_cert_file, client.tls_key_file)
        return client_context(*files, alpn=alpn)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"worker_client.tls_ca_file: cannot load it: {exc}") from None


def _access_log(config: GatewayConfig, pool: WorkerPool) -> AccessLog | None:
    """The access log `logging:` asks for, or None (off, the default)."""
    rate = config.logging.access_log_sample_rate
    if rate <= 0:
        return None
    return AccessLog(rate, config.logging.access_log_max_per_second, pool.label)


@contextlib.contextmanager
def _naming(key: str) -> Iterator[None]:
    """A listener that cannot bind says which setting chose its address."""
    try:
        yield
    except ListenError as exc:
        raise ListenError(
            f"{exc} (set by {key}, {env_name(key)}; rsgw run --{key.replace('.', '-')})"
        ) from exc
