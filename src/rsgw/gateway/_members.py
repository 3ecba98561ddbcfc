"""Workers that join and leave a running gateway: AddWorker, RemoveWorker (issue 24).

The shell over the pool, the prober, the ledger and the metrics: a worker added is in
the pool (a new channel, which registers the gateway's shared-memory regions when it
connects) and is probed at once, so round_robin and least_outstanding route to it as
soon as it reports ready. A worker removed takes no new call at once (out of the pool's
members and the routing table), keeps its calls in flight for the drain, then its
channel closes and its series leave /metrics.

Not yet (issue 24 continues): lpt_packing (the packer's placement would need the new
worker at its next repack), the inbound cap (it stays workers x per-worker cap of the
configured workers), unregistering shared memory on a removed worker, SIGHUP and DNS.
"""

from __future__ import annotations

import logging

import trio

from rsgw._config import GatewayConfig, SchedulingMode
from rsgw._errors import ConfigError
from rsgw._schema import check_target
from rsgw._status import StatusCode
from rsgw.gateway._service import GatewayService
from rsgw.gateway._watchdog import Watchdog

logger = logging.getLogger(__name__)

#: How often a worker being removed is checked for calls still running on it.
DRAIN_POLL_SECONDS = 0.05


class MembershipRefused(ConfigError):
    """A membership change that cannot be made; `status` is its gRPC answer."""

    def __init__(self, status: StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status


class Members:
    """Adds and removes the gateway's workers at run time."""

    def __init__(
        self, config: GatewayConfig, service: GatewayService, watchdog: Watchdog | None
    ) -> None:
        self._config = config
        self._service = service
        self._watchdog = watchdog

    @property
    def count(self) -> int:
        """The workers now (a removed one is gone once its removal starts)."""
        return len(self._service.pool.urls)

    def add(self, url: str, name: str = "") -> str:
        """`url` joins the workers now: probed at once, routed to once it is ready.

        Returns its label. The inbound cap stays what start-up set; each worker keeps
        its own per-worker cap.

        Raises:
            ConfigError: `url` is not host:port.
            MembershipRefused: `url` is a worker already (ALREADY_EXISTS), its name is
                taken (ALREADY_EXISTS), or the mode is lpt_packing (FAILED_PRECONDITION).
        """
        url = check_target(url, "worker")
        pool = self._service.pool
        if self._config.scheduling.mode is SchedulingMode.LPT_PACKING:
            raise MembershipRefused(
                StatusCode.FAILED_PRECONDITION,
                "adding a worker at run time is not supported under lpt_packing yet",
            )
        if url in pool.urls:
            raise MembershipRefused(StatusCode.ALREADY_EXISTS, f"{url} is a worker already")
        label = name or url
        if any(label in (pool.label(u), pool.public_name(u)) for u in pool.urls):
            raise MembershipRefused(StatusCode.ALREADY_EXISTS, f"the name {label!r} is taken")
        pool.add(url, name)
        metrics = self._service.metrics
        metrics.worker_ejected.labels(label).set(0)
        metrics.worker_ejections.labels(label)
        logger.info("worker added", extra={"worker": label, "workers": len(pool.urls)})
        self._service.prober.wake()
        return label

    async def remove(self, key: str, drain_seconds: float | None = None) -> int:
        """The worker `key` (its address or name) leaves; returns the calls cut short.

        No new call goes to it from now on; the calls it holds get `drain_seconds`
        (`shutdown.grace_seconds` unless given) to finish, then its channel closes and
        what is still running fails over to the other replicas where it can.

        Raises:
            MembershipRefused: no worker is called `key` (NOT_FOUND), or it is the last
                one (FAILED_PRECONDITION).
        """
        pool, prober = self._service.pool, self._service.prober
        found = [u for u in pool.urls if key in (u, pool.label(u), pool.public_name(u))]
        if not found:
            raise MembershipRefused(StatusCode.NOT_FOUND, f"no worker is called {key!r}")
        if len(pool.urls) == 1:
            raise MembershipRefused(
                StatusCode.FAILED_PRECONDITION, f"{key!r} is the last worker; it cannot leave"
            )
        (url,) = found
        label = pool.label(url)
        grace = self._config.shutdown.grace_seconds if drain_seconds is None else drain_seconds
        pool.retire(url)
        prober.forget(url)
        if self._watchdog is not None:
            self._watchdog.watch.forget(url)
        ledger = self._service.ledger
        started = trio.current_time()
        with trio.move_on_after(grace):
            # The ledger is a pure core, with no event to wait on: poll it, bounded.
            while ledger.held(url) > 0:  # noqa: ASYNC110
                await trio.sleep(DRAIN_POLL_SECONDS)
        cut = ledger.held(url)
        await pool.close(url)
        self._service.metrics.forget_worker(label)
        logger.info(
            "worker removed",
            extra={
                "worker": label,
                "workers": len(pool.urls),
                "seconds": round(trio.current_time() - started, 3),
                "calls_cut_short": cut,
            },
        )
        return cut
