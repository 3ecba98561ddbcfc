"""The health prober: readiness, capabilities, and a discovery each round.

Every `interval` seconds (and once at start) the prober asks every worker
ServerReady, each call under its own watchdog; learns what a worker implements
when it connects anew (`rsgw.gateway.fleet._capability_probe`); then has model discovery
read what every worker serves and swap in a new routing table
(`rsgw.gateway.fleet._model_discovery`, which also answers the on-demand refreshes).

Hangs (docs/original.md §5.2, §5.4): a ServerReady probe that times out, as opposed
to failing fast, resets that worker's channel, so a half-open connection stuck
behind a stopped or wedged worker is dropped instead of stalling every later
call. If every probe of `wedge_rounds` consecutive rounds times out after the
fleet was once responsive, our own client stack is the likely culprit: the
prober raises `GatewayWedged` and `rsgw run` exits so its supervisor restarts it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import GatewayWedged
from rsgw.base._methods import Method
from rsgw.gateway.fleet._capability_probe import CapabilityProbe
from rsgw.gateway.fleet._model_discovery import ModelDiscovery
from rsgw.gateway.fleet._pool import WorkerPool, fan_out
from rsgw.gateway.fleet._probe_call import (
    DEFAULT_PROBE_TIMEOUT,
    M,
    ProbeResult,
    answer_of,
    probe_call,
)
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.scheduling.fleet._lookups import ModelLookups

if TYPE_CHECKING:
    from rsgw.scheduling.calls._routing import RoutingTable

logger = logging.getLogger(__name__)

_READY_REQUEST = pb.ServerReadyRequest().SerializeToString()


class Prober:
    """Keeps `ready`, `capabilities` and (through `discovery`) the routing table
    current; see the module docstring."""

    def __init__(
        self,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        *,
        interval: float = 10.0,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        wedge_rounds: int = 3,
        lookups: ModelLookups | None = None,
        capabilities: CapabilityProbe | None = None,
        on_ready: Callable[[frozenset[str]], Awaitable[None]] | None = None,
        on_swap: Callable[[RoutingTable], None] | None = None,
    ) -> None:
        self._pool = pool
        self._metrics = metrics
        self.interval = interval
        self.probe_timeout = probe_timeout
        self.wedge_rounds = wedge_rounds
        #: Runs at the end of every round that saw a ready worker (routing-metadata polls).
        self.on_ready = on_ready
        #: What each worker implements (`capabilities.table`), probed per connection
        #: (given when the metadata poller, built before the prober, learns into it too).
        self.capabilities = capabilities or CapabilityProbe(pool, metrics)
        #: Workers out of routing for not answering (`eject`), and until when at least.
        self.ejected: dict[str, float] = {}
        #: The routing table (`discovery.table`) and the models ever served.
        self.discovery = ModelDiscovery(
            pool,
            metrics,
            self.capabilities,
            self.ejected,
            lookups=lookups,
            probe_timeout=probe_timeout,
            on_swap=on_swap,
        )
        #: Workers whose last ServerReady said ready.
        self.ready: frozenset[str] = frozenset()
        #: False until the first probe round has completed (`/readyz` says 503).
        self.probed = False
        #: Set when the gateway begins to drain (see `serving`).
        self.draining = False
        self.rounds = 0
        self.channel_resets = 0
        self._ever_responsive = False
        self._wedged = 0
        self._wake = trio.Event()
        self._round_done = trio.Event()

    @property
    def serving(self) -> bool:
        """What readiness answers (/readyz, ServerReady, grpc.health.v1).

        A ready worker, and the gateway not draining: a stopping gateway says "not
        ready" at once, so load balancers send it nothing new while it finishes.
        """
        return not self.draining and bool(self.ready)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Probe once, report started, then probe every interval until cancelled.

        The first round (readiness and discovery) completes before `started()`, so
        the gateway's first request already has a routing table and `/readyz` is
        right from the moment the listener opens.

        Raises:
            GatewayWedged: the wedge condition held (see the module docstring).
        """
        async with trio.open_nursery() as nursery:
            self.discovery.nursery = nursery
            self._wake = trio.Event()  # a wake before the first round: that round
            await self._guarded_round()
            task_status.started()
            while True:
                with trio.move_on_after(self.interval):
                    await self._wake.wait()
                self._wake = trio.Event()
                await self._guarded_round()

    async def _guarded_round(self) -> None:
        try:
            await self.run_round()
        except GatewayWedged:
            raise
        except Exception:  # a bug in one round must not stop the probing
            logger.exception("probe round failed; keeping the previous state")
        finally:
            done, self._round_done = self._round_done, trio.Event()
            done.set()

    async def next_round(self) -> None:
        """Wait until the round after this moment has ended."""
        await self._round_done.wait()

    def wake(self) -> None:
        """Run the next round now instead of at the end of the interval."""
        self._wake.set()

    async def run_round(self) -> None:
        """One probe round: readiness, channel resets, wedge check, discovery."""
        pool = self._pool
        urls = pool.urls  # this round's members: a worker may join or leave meanwhile
        results = await fan_out(
            urls,
            lambda url: self.probe(
                url, Method.SERVER_READY, _READY_REQUEST, pb.ServerReadyResponse
            ),
        )
        ready: set[str] = set()
        all_timed_out = bool(urls)
        now = trio.current_time()
        members = set(pool.urls)  # not a worker that left during the round
        for url in urls:
            if url not in members:
                continue
            result = answer_of(results[url])
            is_ready = result.reply is not None and result.reply.ready
            if is_ready and url in self.ejected:
                is_ready = self._returns(url, now)
            if is_ready:
                ready.add(url)
            self._metrics.worker_ready.labels(pool.label(url)).set(1 if is_ready else 0)
            if result.timed_out:
                logger.warning(
                    "ServerReady probe timed out; resetting the worker's channel",
                    extra={"worker": pool.label(url), "timeout_s": self.probe_timeout},
                )
                pool.channels[url].reset("reset after a hung probe")
                self.channel_resets += 1
            else:
                all_timed_out = False
                self._ever_responsive = True
        if ready != self.ready:
            logger.info(
                "worker readiness changed",
                extra={"ready": sorted(pool.label(u) for u in ready), "workers": len(pool.urls)},
            )
        self.ready = frozenset(ready)
        self.probed = True
        self.rounds += 1
        self._wedged = self._wedged + 1 if all_timed_out else 0
        if self._ever_responsive and self.wedge_rounds > 0 and self._wedged >= self.wedge_rounds:
            logger.error(
                "every worker probe timed out; the gateway is wedged",
                extra={"rounds": self._wedged},
            )
            raise GatewayWedged(
                f"every worker probe timed out for {self._wedged} consecutive rounds"
            )
        stale = self.capabilities.stale([url for url in urls if url in self.ready])
        if stale:  # connected anew: perhaps restarted, perhaps another server now
            await self.capabilities.probe(stale)
        await self.discovery.refresh()
        if self.ready and self.on_ready is not None:
            await self.on_ready(self.ready)

    async def probe(
        self, url: str, method: Method, request: bytes, response: type[M]
    ) -> ProbeResult[M]:
        """One bounded probe call of `url` (`rsgw.gateway.fleet._probe_call`)."""
        return await probe_call(self._pool, url, method, request, response, self.probe_timeout)

    # -- ejection -----------------------------------------------------------------------

    def eject(self, url: str, seconds: float) -> None:
        """Take `url` out of routing now, for at least `seconds` (it stopped answering).

        It comes back at the first probe round after that which finds it ready.
        """
        self.ejected[url] = trio.current_time() + seconds
        self._metrics.worker_ejected.labels(self._pool.label(url)).set(1)
        self._metrics.worker_ejections.labels(self._pool.label(url)).inc()
        if url in self.ready:
            self.ready = self.ready - {url}
            self._metrics.worker_ready.labels(self._pool.label(url)).set(0)
        self.discovery.without(url)

    def forget(self, url: str) -> None:
        """`url` left the pool: out of readiness, ejection and routing now."""
        self.ready = self.ready - {url}
        self.ejected.pop(url, None)
        self.capabilities.forget(url)
        self.discovery.without(url)

    def _returns(self, url: str, now: float) -> bool:
        """An ejected worker answered ready: back in routing if its time out is over."""
        if now < self.ejected[url]:
            return False
        del self.ejected[url]
        self._metrics.worker_ejected.labels(self._pool.label(url)).set(0)
        logger.info("worker returned", extra={"worker": self._pool.label(url)})
        return True
