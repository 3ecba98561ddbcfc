"""`serve_gateway`: the gateway's nursery tree, and the handle it hands out.

Started in dependency order, each child reporting ready before the next starts
(docs/product.md §4): the worker channels (lazy, so building them is instant), the
admin HTTP server, the prober (its first discovery round completes before we go
on, so the first request already has a routing table), then the gRPC listener.
`RunningGateway` is handed out only once both ports listen.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import httpx
import trio

from rsgw._admin import AdminApp, Reply, serve_admin
from rsgw._config import GatewayConfig, SchedulingMode
from rsgw._errors import ConfigError
from rsgw._exposition import (
    CONTENT_TYPE,
    add_runtime_series,
    merge_expositions,
    relabel_exposition,
)
from rsgw._net import TCP, Network, split_host_port
from rsgw._tls import ADMIN_ALPN, ALPN, ServerTls, TlsFiles, client_context
from rsgw.gateway._access import AccessLog
from rsgw.gateway._control import GatewayControl
from rsgw.gateway._discovery import Discovery
from rsgw.gateway._guard import RELOAD_CHECK_SECONDS, Guard
from rsgw.gateway._members import Members
from rsgw.gateway._meta_poll import MetaPoller
from rsgw.gateway._metrics import GatewayMetrics
from rsgw.gateway._packing import Packing
from rsgw.gateway._pool import WorkerPool, fan_out
from rsgw.gateway._prober import Prober
from rsgw.gateway._service import GatewayService
from rsgw.gateway._settings import ServerSettings
from rsgw.gateway._watchdog import Watchdog
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer
from rsgw.grpc._standard import standard_services
from rsgw.scheduling._knobs import WorkBasis
from rsgw.scheduling._lpt import LptScheduler
from rsgw.scheduling._meta import RoutingMetaTracker
from rsgw.scheduling._packer import Packer
from rsgw.scheduling._schedulers import LeastOutstandingScheduler, RoundRobinScheduler, Scheduler
from rsgw.scheduling._stalls import StallWatch

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GatewayStatus:
    """A frozen snapshot of what the gateway knows, for embedding applications and tests.

    Like `trio.Event.statistics()`, it is a copy: it never changes after it is taken,
    and holding it keeps nothing of the gateway alive.
    """

    #: The configured workers (URLs), in configured order.
    workers: tuple[str, ...]
    #: Workers whose last ServerReady said ready.
    ready: frozenset[str]
    #: model -> the ready workers serving it (the routing table in force).
    models: dict[str, tuple[str, ...]]
    #: Prober rounds completed, and channels the prober reset after a hung probe.
    probe_rounds: int
    channel_resets: int
    #: Calls admitted now (ModelInfer and shared-memory calls).
    inflight: int
    #: The scheduling mode, and under lpt_packing the placement in force (model -> URLs).
    mode: str
    placement: dict[str, tuple[str, ...]]


class Reloadable(Protocol):
    def reload(self) -> bool: ...


class RunningGateway:
    """A live gateway: its bound ports, a status snapshot, and a graceful stop."""

    def __init__(
        self,
        config: GatewayConfig,
        grpc_port: int,
        admin_port: int,
        server: GrpcServer,
        service: GatewayService,
        packing: Packing | None,
        cancel_scope: trio.CancelScope,
        *,
        members: Members,
        discovery: Discovery,
        reloadables: tuple[Reloadable, ...] = (),
        reload_config: Callable[[], GatewayConfig] | None = None,
    ) -> None:
        self.config = config
        self._reloadables = reloadables
        self._reload_config = reload_config
        self._members = members
        self._discovery = discovery
        self.grpc_port = grpc_port
        self.admin_port = admin_port
        self._server = server
        self._service = service
        self._packing = packing
        self._cancel_scope = cancel_scope

    def reload(self) -> None:
        """Read the certificate and tokens files, and gateway.yml's workers, again now
        (what SIGHUP does).

        Each keeps what is in force if its files do not load, and says so in the log.
        Of gateway.yml, `endpoints`, `metrics_endpoints` and `worker_names` are applied
        (workers join, departed ones drain); any other change needs a restart, and the
        log says so.
        """
        for reloadable in self._reloadables:
            reloadable.reload()
        self.reload_workers()

    def reload_workers(self) -> None:
        """Read gateway.yml's workers again and apply them (see `reload`); nothing
        without `reload_config`."""
        if self._reload_config is None:
            return
        try:
            config = self._reload_config()
            change = self._members.reconfigure(config)
            self._discovery.retarget(config)
        except ConfigError as exc:
            logger.error(
                "reload: gateway.yml not applied; the workers stay as they are",
                extra={"error": str(exc)},
            )
            return
        fixed = dataclasses.replace(
            config,
            endpoints=self.config.endpoints,
            metrics_endpoints=self.config.metrics_endpoints,
            worker_names=self.config.worker_names,
        )
        if fixed != self.config:
            logger.warning(
                "reload: only endpoints, metrics_endpoints and worker_names are applied at "
                "run time; restart the gateway for its other changes"
            )
        logger.info(
            "reload: gateway.yml applied",
            extra={
                "added": [m.label for m in change.added],
                "removed": [m.label for m in change.removed],
                "workers": self._members.count,
            },
        )

    # -- membership ------------------------------------------------------------------------

    def add_worker(self, url: str, name: str = "", metrics: str = "") -> str:
        """`url` joins the workers now; its label (see `Members.add`)."""
        return self._members.add(url, name, metrics)

    async def remove_worker(self, key: str, drain_seconds: float | None = None) -> int:
        """The worker `key` leaves after draining; the calls cut short (`Members.remove`)."""
        return await self._members.remove(key, drain_seconds)

    def statistics(self) -> GatewayStatus:
        """A frozen snapshot of the gateway's state (see `GatewayStatus`)."""
        prober = self._service.prober
        packing = self._packing
        placement = (
            {}
            if packing is None
            else {model: placed.urls for model, placed in packing.packer.assignment.items()}
        )
        return GatewayStatus(
            workers=self._service.pool.urls,
            ready=prober.ready,
            models=dict(prober.table.models),
            probe_rounds=prober.rounds,
            channel_resets=prober.channel_resets,
            inflight=self._service.inflight,
            mode=str(self.config.scheduling.mode),
            placement=placement,
        )

    def status(self) -> GatewayStatus:
        """`statistics()`, under the name the interface table promises (docs/product.md §2)."""
        return self.statistics()

    async def aclose(self, grace: float | None = None) -> None:
        """Drain, then stop: see `GrpcServer.aclose`.

        Readiness turns false and the listener closes at once; clients get GOAWAY;
        calls in flight get `grace` seconds (`shutdown.grace_seconds` unless given)
        and what is still running then ends UNAVAILABLE. Logs the start and the end.
        """
        grace = self.config.shutdown.grace_seconds if grace is None else grace
        if self._server.closing:
            await self._server.aclose(grace)  # a second caller waits for the first
            return
        self._service.prober.draining = True
        started = trio.current_time()
        logger.info(
            "gateway stopping",
            extra={"grace_seconds": grace, "inflight": self._service.inflight},
        )
        cut = await self._server.aclose(grace)
        self._cancel_scope.cancel()
        logger.info(
            "gateway stopped",
            extra={"seconds": round(trio.current_time() - started, 3), "calls_cut_short": cut},
        )


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
        )
        scheduler, packing = _scheduler(config, pool, prober, metrics)
        add_runtime_series(metrics.registry, "gateway", scheduling_mode=str(config.scheduling.mode))

        def ready_replicas() -> dict[str, int]:
            table, ready = prober.table, prober.ready
            return {m: sum(u in ready for u in table.replicas(m)) for m in prober.known}

        metrics.track_model_replicas(ready_replicas)
        service = GatewayService(
            pool,
            prober,
            metrics,
            request_timeout=config.worker_client.request_timeout_seconds,
            max_concurrent_requests=config.max_concurrent_requests,
            max_requests_per_worker=config.grpc.max_concurrent_requests_per_worker,
            scheduler=scheduler,
            holders=None if packing is None else packing.holders,
            identity=config.server_metadata,
            max_message_bytes=limits.max_recv_msg_bytes,
            access=_access_log(config, pool),
            shm=config.shm,
        )
        prober.on_swap = service.on_table_swap
        members = Members(config, service, nursery)  # the configured workers join the pool
        discovery = Discovery.from_config(config, members)
        app = _admin_app(config, pool, metrics, prober, http)
        tls, admin_tls = _server_tls(config, ALPN), _server_tls(config, ADMIN_ALPN)
        guard = Guard(config.auth)  # a tokens file that does not load stops the start here
        await nursery.start(guard.watch)
        bound_admin = await nursery.start(
            functools.partial(serve_admin, tls=admin_tls),
            app,
            admin_host,
            admin_port,
        )
        await nursery.start(discovery.serve)  # the dns:/// endpoints have answered once
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
        control = GatewayControl(mode, packing, prober, metrics, members)
        settings = ServerSettings(
            metrics, config.logging.format, lambda model: model in prober.known
        )
        handlers = (
            service.handlers()
            | control.handlers()
            | {method.path: handler for method, handler in settings.handlers().items()}
        )
        standard, streams = standard_services(handlers, lambda: prober.serving)
        server = GrpcServer(
            guard.wrap(handlers | standard),
            stream_handlers=guard.wrap_streams(service.stream_handlers() | streams),
            on_refused=metrics.refused,
            raw_paths=service.raw_paths,
            timeouts=service.timeouts,
            max_receive_message_bytes=limits.max_recv_msg_bytes,
            max_send_message_bytes=limits.max_send_msg_bytes,
            limits=config.connections.limits(),
            max_running_calls=config.max_concurrent_requests,
            max_concurrent_streams=config.connections.max_concurrent_streams,
            tls=tls,
        )
        members.attach(server=server)
        bound_grpc = await nursery.start(
            functools.partial(server.serve, network=network), grpc_host, grpc_port
        )
        members.own_port = bound_grpc
        logger.info(
            "gateway serving",
            extra={
                "grpc": f"{grpc_host}:{bound_grpc}",
                "metrics": f"{admin_host}:{bound_admin}",
                "grpc_port": bound_grpc,
                "metrics_port": bound_admin,
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


def _scheduler(
    config: GatewayConfig, pool: WorkerPool, prober: Prober, metrics: GatewayMetrics
) -> tuple[Scheduler, Packing | None]:
    """The scheduler for `scheduling.mode`, wired to its metrics and metadata polls."""
    scheduling = config.scheduling
    mode = scheduling.mode
    if mode is SchedulingMode.ROUND_ROBIN:
        logger.info("gateway scheduling", extra={"mode": str(mode)})
        return RoundRobinScheduler(), None
    tracker = RoutingMetaTracker(scheduling.routing_meta_halflife)
    if mode is SchedulingMode.LPT_PACKING:
        # The EMA halflife is held resolved, as the original's knobs hold it: a configured
        # 0 means "the rebalance budget at startup", not "whatever it is later".
        resolved = dataclasses.replace(
            scheduling, ema_halflife_compute_seconds=scheduling.resolved_ema_halflife
        )
        lpt = LptScheduler(resolved, Packer())
        packing = Packing(
            lpt, pool, prober, metrics, tracker, startup_wait=config.startup_wait_seconds
        )
        prober.on_ready = MetaPoller(pool, prober, tracker, lpt, packing.on_poll).poll
        logger.info("gateway scheduling", extra={"mode": str(mode)})
        return lpt, packing
    basis = WorkBasis(scheduling.work_basis)
    scheduler = LeastOutstandingScheduler(basis)
    metrics.track_inflight_work(lambda: str(basis), scheduler.loads)
    if scheduler.needs_routing_meta:
        prober.on_ready = MetaPoller(pool, prober, tracker, scheduler).poll
    logger.info("gateway scheduling", extra={"mode": str(mode), "work_basis": str(basis)})
    return scheduler, None


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


def _admin_app(
    config: GatewayConfig,
    pool: WorkerPool,
    metrics: GatewayMetrics,
    prober: Prober,
    http: httpx.AsyncClient,
) -> AdminApp:
    """`/metrics` merges every worker's scrape into ours; `/readyz` follows the prober."""

    timeout = config.metrics.scrape_timeout_seconds
    scheme = "https" if config.worker_client.tls_ca_file else "http"
    # Metrics endpoints listed beyond the endpoints pair with no worker: scraped as named.
    unpaired = {
        url: config.metrics_label(url) for url in config.metrics_endpoints[len(config.endpoints) :]
    }

    async def scrape(url: str, label: str) -> str | None:
        """A worker's series, relabelled; None when it could not be scraped (down, slow,
        an error status): that worker's gap, not the scrape's failure (fan_out raises
        anything but an RsgwError)."""
        try:
            with trio.fail_after(timeout):
                response = await http.get(f"{scheme}://{url}/metrics")
            response.raise_for_status()
        except (httpx.HTTPError, trio.TooSlowError, OSError):
            return None
        return relabel_exposition(response.text, "worker", label)

    async def metrics_endpoint() -> Reply:
        targets = pool.metrics_targets() | unpaired  # the members now, in the order they joined
        scraped = await fan_out(list(targets), lambda url: scrape(url, targets[url]))
        for url, label in targets.items():
            metrics.metrics_scraped(label, isinstance(scraped[url], str))
        texts = [metrics.render().decode()]
        for url in targets:  # member order, not completion order
            text = scraped[url]
            if isinstance(text, str):
                texts.append(text)
        return Reply(200, merge_expositions(texts).encode(), CONTENT_TYPE)

    async def healthz() -> Reply:
        return Reply(200, b"ok")

    async def readyz() -> Reply:
        return Reply(200, b"ok") if prober.serving else Reply(503, b"not ready")

    return AdminApp({"/metrics": metrics_endpoint, "/healthz": healthz, "/readyz": readyz})
