"""The gateway's parts, built in dependency order: each builder takes what it needs.

`serve_gateway` (`rsgw.gateway._gateway`) reads as the list of these steps. Nothing is
attached to a part after it is built: each is given its collaborators when it is
constructed, so the order of the builders is the order of the dependencies. Where two
parts need each other, a small object built before both carries what passes between
them (docs/decisions.md, "Rooms by what they serve"):

- the metadata poller runs at the end of each prober round (the prober's `on_ready`)
  and reads workers with the prober's probes: it is given the `CapabilityProbe` the
  prober is given too, and the probe timeout, not the prober;
- under lpt_packing, the poller's answers reach the repack loop through `Polls`,
  built before both;
- the coordinator drives the packing it belongs to (`follow`, a repack now), so the
  packing builds it from the factory it is given (`Packing(coordinate=)`); the other
  gateways' changes reach the control service through the coordinator's `changes`
  channel, which the control service reads (`serve_changes`);
- the listener's running-call cap follows the workers: it is an `Intake` built
  before both `Members` (which resizes it) and the listener (which takes it).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from rsgw.base._errors import ConfigError
from rsgw.config._config import GatewayConfig, SchedulingMode
from rsgw.gateway._control import GatewayControl
from rsgw.gateway._members import Members
from rsgw.gateway.calls._admission import intake_limit
from rsgw.gateway.calls._service import GatewayService
from rsgw.gateway.calls._tenancy import Tenancy
from rsgw.gateway.fleet._capability_probe import CapabilityProbe
from rsgw.gateway.fleet._dns_targets import Discovery
from rsgw.gateway.fleet._meta_poll import MetaPoller
from rsgw.gateway.fleet._pool import WorkerPool
from rsgw.gateway.fleet._prober import Prober
from rsgw.gateway.fleet._watchdog import Watchdog
from rsgw.gateway.observe._access import AccessLog
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.gateway.placement._coordinator import Coordinator, default_member
from rsgw.gateway.placement._packing import Packing, Polls
from rsgw.grpc._client import Channel
from rsgw.grpc._intake import Intake
from rsgw.runtime._exposition import add_runtime_series
from rsgw.runtime._net import Network, split_host_port
from rsgw.runtime._tls import ALPN, client_context
from rsgw.scheduling.calls._forecast import Forecast
from rsgw.scheduling.calls._meta import RoutingMetaTracker
from rsgw.scheduling.calls._schedulers import (
    LeastOutstandingScheduler,
    RoundRobinScheduler,
    Scheduler,
)
from rsgw.scheduling.fleet._lookups import ModelLookups
from rsgw.scheduling.fleet._stalls import StallWatch
from rsgw.scheduling.knobs._knobs import WorkBasis
from rsgw.scheduling.placement._demand import DecayedDemand
from rsgw.scheduling.placement._lpt import LptScheduler
from rsgw.scheduling.placement._packer import Packer

if TYPE_CHECKING:
    from rsgw.gateway.observe._tracing import Tracer

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Fleet:
    """The workers the gateway watches (`rsgw.gateway.fleet`), and how it schedules
    calls among them (`scheduler`, with `packing` under lpt_packing)."""

    pool: WorkerPool
    metrics: GatewayMetrics
    prober: Prober
    scheduler: Scheduler
    #: The routing-metadata poller, when the mode reads work counters.
    poller: MetaPoller | None
    #: lpt_packing's shell (and, with coordination, its coordinator).
    packing: Packing | None
    #: The admission forecast: the calls path measures it, a model load resets it.
    forecast: Forecast
    stalls: StallWatch
    watchdog: Watchdog


@dataclass(frozen=True, slots=True)
class Policy:
    """The scheduler for `scheduling.mode`, before the prober that feeds it exists."""

    scheduler: Scheduler
    poller: MetaPoller | None = None
    #: lpt_packing: its scheduler, metadata tracker and poll mailbox, for `Packing`.
    lpt: LptScheduler | None = None
    tracker: RoutingMetaTracker | None = None
    polls: Polls | None = None


def build_fleet(config: GatewayConfig, nursery: trio.Nursery, network: Network) -> Fleet:
    """The pool (a lazy channel per worker: building it is instant), its metrics, the
    scheduler and its metadata poller, the prober, the packing shell, the watchdog."""
    channel = functools.partial(_channel, config, nursery, network, worker_tls(config))
    pool = WorkerPool(channel)
    metrics = GatewayMetrics(pool.label)
    capabilities = CapabilityProbe(pool, metrics)
    policy = choose_policy(config, pool, capabilities, metrics)
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
        capabilities=capabilities,
        on_ready=None if policy.poller is None else policy.poller.poll,
        on_swap=policy.scheduler.table_swapped,
    )
    forecast = Forecast()
    packing = _packing(config, policy, pool, prober, metrics, network, forecast)
    add_runtime_series(metrics.registry, "gateway", scheduling_mode=str(config.scheduling.mode))
    outliers = config.outlier_detection
    stalls = StallWatch(outliers.stall_seconds, outliers.ping_timeout_seconds)
    watchdog = Watchdog(pool, prober, metrics, stalls, ejection_seconds=outliers.ejection_seconds)
    return Fleet(
        pool, metrics, prober, policy.scheduler, policy.poller, packing, forecast, stalls, watchdog
    )


def _channel(
    config: GatewayConfig,
    nursery: trio.Nursery,
    network: Network,
    tls: ssl.SSLContext | None,
    url: str,
) -> Channel:
    """One worker's channel (lazy: it connects on its first call)."""
    limits = config.grpc
    return Channel(
        url,
        nursery,
        network=network,
        max_concurrent_streams=config.worker_client.max_concurrent_streams,
        max_receive_message_bytes=limits.max_recv_msg_bytes,
        max_send_message_bytes=limits.max_send_msg_bytes,
        ssl_context=tls,
    )


def choose_policy(
    config: GatewayConfig,
    pool: WorkerPool,
    capabilities: CapabilityProbe,
    metrics: GatewayMetrics,
) -> Policy:
    """The scheduler for `scheduling.mode`, wired to its metrics and its metadata
    poller (when the mode reads work counters)."""
    scheduling = config.scheduling
    mode = scheduling.mode
    if mode is SchedulingMode.ROUND_ROBIN:
        logger.info("gateway scheduling", extra={"mode": str(mode)})
        return Policy(RoundRobinScheduler())
    tracker = RoutingMetaTracker(scheduling.routing_meta_halflife)
    timeout = config.probe_timeout_seconds
    if mode is SchedulingMode.LPT_PACKING:
        # The EMA halflife is held resolved, as the original's knobs hold it: a configured
        # 0 means "the rebalance budget at startup", not "whatever it is later".
        resolved = dataclasses.replace(
            scheduling, ema_halflife_compute_seconds=scheduling.resolved_ema_halflife
        )
        repository = config.repository
        lru = repository.eviction == "lru"
        # Residency counts every call of the handed models in a demand meter (the value
        # of a copy, and the turn of a cold model waiting for room).
        handed = bool(repository.models)
        demand = DecayedDemand(repository.demand_halflife_seconds) if handed else None
        lpt = LptScheduler(resolved, Packer(track_recency=lru, demand=demand))
        polls = Polls()
        poller = MetaPoller(
            pool,
            capabilities,
            tracker,
            lpt,
            polls.post,
            probe_timeout=timeout,
            repository=config.repository,
        )
        logger.info("gateway scheduling", extra={"mode": str(mode)})
        return Policy(lpt, poller, lpt, tracker, polls)
    basis = WorkBasis(scheduling.work_basis)
    scheduler = LeastOutstandingScheduler(basis)
    metrics.track_inflight_work(lambda: str(basis), scheduler.loads)
    polling = None
    if scheduler.needs_routing_meta:
        polling = MetaPoller(pool, capabilities, tracker, scheduler, probe_timeout=timeout)
    logger.info("gateway scheduling", extra={"mode": str(mode), "work_basis": str(basis)})
    return Policy(scheduler, polling)


def _packing(
    config: GatewayConfig,
    policy: Policy,
    pool: WorkerPool,
    prober: Prober,
    metrics: GatewayMetrics,
    network: Network,
    forecast: Forecast,
) -> Packing | None:
    """lpt_packing's shell, with its coordinator when gateways coordinate."""
    if policy.lpt is None:
        if config.coordination.enabled:
            logger.warning(
                "coordination.etcd_endpoints is set, but only lpt_packing coordinates "
                "gateways; this gateway routes on its own",
                extra={"mode": str(config.scheduling.mode)},
            )
        return None
    assert policy.poller is not None and policy.tracker is not None and policy.polls is not None
    return Packing(
        policy.lpt,
        pool,
        prober,
        metrics,
        policy.tracker,
        poller=policy.poller,
        polls=policy.polls,
        startup_wait=config.startup_wait_seconds,
        repository=config.repository,
        coordinate=_coordinate(config, network),
        on_loading=lambda url: forecast.reset(url, trio.current_time()),
    )


def _coordinate(config: GatewayConfig, network: Network) -> Callable[[Packing], Coordinator] | None:
    """How the packing shell builds its part in coordinating with other gateways
    (`coordination.etcd_endpoints`), or None when it places alone."""
    coordination = config.coordination
    if not coordination.enabled:
        return None
    _, port = split_host_port(config.listen.grpc)
    member = coordination.member or default_member(port or os.getpid())
    return functools.partial(
        Coordinator, coordination, member=member, address=config.listen.grpc, network=network
    )


def build_service(config: GatewayConfig, fleet: Fleet) -> GatewayService:
    """The call path (`rsgw.gateway.calls`): one handler table for whichever door."""
    prober = fleet.prober

    packing = fleet.packing
    # Handed models load on demand (issue 49): one loaded nowhere is cold, not down.
    on_demand = packing.placer.handed if packing is not None else frozenset()

    def ready_replicas() -> dict[str, int]:
        table, ready = prober.discovery.table, prober.ready
        counts = {m: sum(u in ready for u in table.replicas(m)) for m in prober.discovery.known}
        return {m: n for m, n in counts.items() if n or m not in on_demand}

    fleet.metrics.track_model_replicas(ready_replicas)
    poller = fleet.poller
    return GatewayService(
        fleet.pool,
        prober,
        fleet.metrics,
        request_timeout=config.worker_client.request_timeout_seconds,
        max_concurrent_requests=config.max_concurrent_requests,
        max_requests_per_worker=config.grpc.max_concurrent_requests_per_worker,
        max_queue_seconds=config.grpc.max_queue_seconds,
        scheduler=fleet.scheduler,
        holders=None if packing is None else packing.holders,
        identity=config.server_metadata,
        max_message_bytes=config.grpc.max_recv_msg_bytes,
        access=_access_log(config, fleet.pool),
        shm=config.shm,
        measured=None if poller is None else poller.measured,
        cold=None if packing is None or not packing.placer.handed else packing.cold,
        forecast=fleet.forecast,
        tracer=_tracer(config, fleet.metrics),
        tenancy=_tenancy(config, fleet.metrics),
    )


def _tracer(config: GatewayConfig, metrics: GatewayMetrics) -> Tracer | None:
    """The gateway's tracer when `tracing:` has an exporter, else None (the default:
    OpenTelemetry is not even imported, `rsgw.gateway.observe._tracing`)."""
    if not config.tracing.enabled:
        return None
    try:
        from rsgw.gateway.observe._tracing import Tracer
    except ImportError as exc:
        raise ConfigError(
            f"tracing.endpoint is set but OpenTelemetry is not installed ({exc.name}): "
            "install rsgw[tracing]"
        ) from None
    dropped = metrics.spans_dropped

    def count(reason: str, spans: int) -> None:
        dropped.labels(reason).inc(spans)

    return Tracer(config.tracing, count, mode=str(config.scheduling.mode))


def _tenancy(config: GatewayConfig, metrics: GatewayMetrics) -> Tenancy | None:
    """The tenants' priorities, shares and quotas, or None when `tenancy:` asks for none."""
    if not config.tenancy.enabled:
        return None
    tenancy = config.tenancy
    logger.info(
        "gateway tenancy",
        extra={
            "header": tenancy.header or None,
            "priority_levels": tenancy.priority_levels,
            "tenants": len(tenancy.tenants),
        },
    )
    return Tenancy(tenancy, metrics, trio.current_time())


def _access_log(config: GatewayConfig, pool: WorkerPool) -> AccessLog | None:
    """The access log `logging:` asks for, or None (off, the default)."""
    rate = config.logging.access_log_sample_rate
    if rate <= 0:
        return None
    return AccessLog(rate, config.logging.access_log_max_per_second, pool.label)


def build_members(
    config: GatewayConfig, nursery: trio.Nursery, fleet: Fleet, service: GatewayService
) -> tuple[Members, Discovery, Intake]:
    """The workers joining and leaving (the configured ones join now), their `dns:///`
    targets, and the listener's running-call cap that follows them."""
    intake = Intake(intake_limit(config.max_concurrent_requests))
    members = Members(
        config, service, nursery, packing=fleet.packing, stalls=fleet.stalls, intake=intake
    )
    return members, Discovery.from_config(config, members), intake


async def start_control(
    nursery: trio.Nursery,
    config: GatewayConfig,
    fleet: Fleet,
    members: Members,
    tenancy: Tenancy | None = None,
) -> GatewayControl:
    """GatewayControlService: the operator's door to scheduling and membership, applying
    the other gateways' changes from now on (with coordination)."""
    packing, poller = fleet.packing, fleet.poller
    control = GatewayControl(
        config.scheduling.mode,
        packing,
        fleet.prober,
        fleet.metrics,
        members,
        None if poller is None else poller.sources,
        coordinator=None if packing is None else packing.coordination,
        tenancy=tenancy,
    )
    await nursery.start(control.serve_changes)
    return control


def worker_tls(config: GatewayConfig, alpn: list[str] = ALPN) -> ssl.SSLContext | None:
    """The context for TLS to the workers, or None (cleartext)."""
    client = config.worker_client
    if not client.tls_ca_file:
        return None
    try:
        files = (client.tls_ca_file, client.tls_cert_file, client.tls_key_file)
        return client_context(*files, alpn=alpn)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"worker_client.tls_ca_file: cannot load it: {exc}") from None
