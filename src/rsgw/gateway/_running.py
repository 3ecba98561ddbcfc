"""`RunningGateway`: the handle `serve_gateway` hands out, and its status snapshot.

What an embedding application, `rsgw run` and the tests hold of a live gateway: its
bound ports, a frozen status snapshot, reloading (what SIGHUP does), workers joining
and leaving at run time, and the graceful stop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio

from rsgw.base._errors import ConfigError

if TYPE_CHECKING:
    from rsgw.config._config import GatewayConfig
    from rsgw.gateway._members import Members
    from rsgw.gateway.calls._service import GatewayService
    from rsgw.gateway.calls._tenancy import Tenancy
    from rsgw.gateway.fleet._dns_targets import Discovery
    from rsgw.gateway.placement._coordinator import Coordinator
    from rsgw.gateway.placement._packing import Packing
    from rsgw.grpc._server import GrpcServer
    from rsgw.rest._listener import RestListener

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
    #: What each worker was found to implement of the optional API (URL -> names).
    capabilities: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


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
        rest: RestListener | None = None,
        http_port: int | None = None,
        coordinator: Coordinator | None = None,
    ) -> None:
        self.config = config
        #: This gateway's part among coordinated gateways (None: it runs alone).
        self.coordinator = coordinator
        #: The REST listener's port; None when `listen.http` is "".
        self.http_port = http_port
        self._rest = rest
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

    @property
    def tenancy(self) -> Tenancy | None:
        """The tenants' policies, shares, quotas and counts (None without `tenancy:`)."""
        return self._service.tenancy

    def reload(self) -> None:
        """Read the certificate and tokens files, and gateway.yml's workers, again now
        (what SIGHUP does).

        Each keeps what is in force if its files do not load, and says so in the log.
        Of gateway.yml, `endpoints`, `metrics_endpoints` and `worker_names` are applied
        (workers join, departed ones drain), and the `tenancy:` block (replacing the
        tenant policies set at run time); any other change needs a restart, and the
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
            tenancy=self.config.tenancy,
        )
        if fixed != self.config:
            logger.warning(
                "reload: only endpoints, metrics_endpoints, worker_names and tenancy are "
                "applied at run time; restart the gateway for its other changes"
            )
        self._reload_tenancy(config)
        logger.info(
            "reload: gateway.yml applied",
            extra={
                "added": [m.label for m in change.added],
                "removed": [m.label for m in change.removed],
                "workers": self._members.count,
            },
        )

    def _reload_tenancy(self, config: GatewayConfig) -> None:
        """Apply gateway.yml's `tenancy:` block again, over any change made at run time."""
        tenancy = self.tenancy
        if tenancy is None:
            if config.tenancy.enabled:
                logger.warning(
                    "reload: the tenancy block is not applied: this gateway started without "
                    "one, so its calls carry no tenant; restart the gateway to turn it on"
                )
            return
        if config.tenancy != tenancy.config:
            tenancy.apply(config.tenancy, trio.current_time())
            logger.info("reload: tenancy applied", extra={"tenants": len(config.tenancy.tenants)})

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
            models=dict(prober.discovery.table.models),
            probe_rounds=prober.rounds,
            channel_resets=prober.channel_resets,
            inflight=self._service.inflight,
            mode=str(self.config.scheduling.mode),
            placement=placement,
            capabilities={
                url: prober.capabilities.table.of(url).names() for url in self._service.pool.urls
            },
        )

    def status(self) -> GatewayStatus:
        """`statistics()`, under the name the interface table promises (docs/product.md §2)."""
        return self.statistics()

    async def aclose(self, grace: float | None = None) -> None:
        """Drain, then stop: see `GrpcServer.aclose` and `RestListener.aclose`.

        Readiness turns false and the listeners close at once; gRPC clients get
        GOAWAY, REST replies say `Connection: close`; calls in flight get `grace`
        seconds (`shutdown.grace_seconds` unless given) and what is still running then
        ends UNAVAILABLE (REST: 503). Logs the start and the end.
        """
        grace = self.config.shutdown.grace_seconds if grace is None else grace
        if self._server.closing:
            await self._server.aclose(grace)  # a second caller waits for the first
            return
        self._service.prober.draining = True
        if self.coordinator is not None:  # another gateway places from now on, at once
            await self.coordinator.resign()
        started = trio.current_time()
        logger.info(
            "gateway stopping",
            extra={"grace_seconds": grace, "inflight": self._service.inflight},
        )
        cut = 0

        async def drain(listener: GrpcServer | RestListener) -> None:
            nonlocal cut
            cut += await listener.aclose(grace)

        async with trio.open_nursery() as nursery:
            for listener in (self._server, self._rest):
                if listener is not None:
                    nursery.start_soon(drain, listener)
        self._cancel_scope.cancel()
        logger.info(
            "gateway stopped",
            extra={"seconds": round(trio.current_time() - started, 3), "calls_cut_short": cut},
        )
