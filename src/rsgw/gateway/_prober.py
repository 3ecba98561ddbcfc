"""The health prober: readiness, model discovery, and the routing-table swap.

Every `interval` seconds (and once at start) the prober asks every worker
ServerReady and RepositoryIndex(ready=true), each call under its own watchdog,
builds a new routing table from the READY models and swaps it in by reference.
Request handlers never wait for it; a request for a model the current table
lacks asks for an on-demand refresh, single-flight and at most once a second.
Discoveries (a round's, an on-demand one, the one after a model load) never
overlap: each waits for the one running, so tables are swapped in the order their
reads began and an older read never replaces a newer table.

Hangs (docs/original.md §5.2, §5.4): a ServerReady probe that times out, as opposed
to failing fast, resets that worker's channel, so a half-open connection stuck
behind a stopped or wedged worker is dropped instead of stalling every later
call. If every probe of `wedge_rounds` consecutive rounds times out after the
fleet was once responsive, our own client stack is the likely culprit: the
prober raises `GatewayWedged` and `rsgw run` exits so its supervisor restarts it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio
from google.protobuf.message import DecodeError, Message

from rsgw._errors import GatewayWedged, GrpcError, RsgwError
from rsgw._logging import log_limited
from rsgw._methods import Method
from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._status import StatusCode
from rsgw.gateway._capability_probe import CapabilityProbe
from rsgw.gateway._metrics import GatewayMetrics
from rsgw.gateway._pool import WorkerPool, fan_out
from rsgw.scheduling._capabilities import Capability, learned_from
from rsgw.scheduling._routing import RoutingTable, build_routing_table, is_ready_state

logger = logging.getLogger(__name__)

#: Watchdog on each probe call (the original's PROBE_TIMEOUT_SECONDS).
DEFAULT_PROBE_TIMEOUT = 8.0
#: gRPC deadline of each probe call, inside the watchdog.
PROBE_DEADLINE = 5.0
#: On-demand refreshes run at most this often.
MIN_REFRESH_INTERVAL = 1.0

_READY_REQUEST = pb.ServerReadyRequest().SerializeToString()
_INDEX_REQUEST = pb.RepositoryIndexRequest(ready=True).SerializeToString()

M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class ProbeResult(Generic[M]):
    """One worker's answer to one probe call: its parsed reply, a failure, or a hang."""

    reply: M | None
    timed_out: bool
    #: The worker's status and message when it answered with an error.
    error: GrpcError | None = None


class Prober:
    """Keeps `table` and `ready` current; see the module docstring."""

    def __init__(
        self,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        *,
        interval: float = 10.0,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        wedge_rounds: int = 3,
        on_swap: Callable[[RoutingTable], None] | None = None,
        on_ready: Callable[[frozenset[str]], Awaitable[None]] | None = None,
    ) -> None:
        self._pool = pool
        self._metrics = metrics
        #: What each worker implements (`capabilities.table`), probed per connection.
        self.capabilities = CapabilityProbe(pool, metrics)
        self.interval = interval
        self.probe_timeout = probe_timeout
        self.wedge_rounds = wedge_rounds
        self.on_swap = on_swap
        #: Runs at the end of every round that saw a ready worker (routing-metadata polls).
        self.on_ready = on_ready
        #: The current routing table; replaced, never mutated.
        self.table = RoutingTable()
        #: Every model some worker has served since start (bounded by the fleet's
        #: catalogues): a request for one of these whose replicas are all down is
        #: UNAVAILABLE, not NOT_FOUND.
        self.known: frozenset[str] = frozenset()
        #: Workers whose last ServerReady said ready.
        self.ready: frozenset[str] = frozenset()
        #: False until the first probe round has completed (`/readyz` says 503).
        self.probed = False
        #: Set when the gateway begins to drain (see `serving`).
        self.draining = False
        #: Workers out of routing for not answering (`eject`), and until when at least.
        self.ejected: dict[str, float] = {}
        self.rounds = 0
        self.channel_resets = 0
        self._ever_responsive = False
        self._wedged = 0
        self._wake = trio.Event()
        self._round_done = trio.Event()
        #: Discovery is single-flight: set while one runs, to its end. Reads are
        #: numbered as they begin; `_discovered` is the last one that swapped its table.
        self._discovering: trio.Event | None = None
        self._began = 0
        self._discovered = 0
        self._last_refresh = -math.inf
        self._nursery: trio.Nursery | None = None
        self._generation = 0

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
            self._nursery = nursery
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
            result = _answer(results[url])
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
        await self._refresh()
        if self.ready and self.on_ready is not None:
            await self.on_ready(self.ready)

    async def probe(
        self, url: str, method: Method, request: bytes, response: type[M]
    ) -> ProbeResult[M]:
        """One bounded probe call: a reply, a fast failure, or a hang (timed out).

        A reply that does not parse as `response` is a failed probe of that worker
        alone (logged, rate-limited): one broken worker must not cost the round
        everyone else's answers.
        """
        channel = self._pool.channels[url]
        with trio.move_on_after(self.probe_timeout):
            try:
                deadline = trio.current_time() + min(PROBE_DEADLINE, self.probe_timeout)
                reply = await channel.unary(method.wire, request, deadline=deadline, uncapped=True)
            except GrpcError as exc:
                return ProbeResult(None, exc.code is StatusCode.DEADLINE_EXCEEDED, exc)
            except RsgwError:  # unreachable, or its reply was cut short
                return ProbeResult(None, False)
            try:
                return ProbeResult(response.FromString(reply), False)
            except DecodeError as exc:
                worker = self._pool.label(url)
                extra = {"worker": worker, "rpc": method.rpc, "error": str(exc)}
                log_limited(
                    logger,
                    logging.WARNING,
                    "a worker's probe reply does not parse; counted as a failed probe",
                    extra,
                    (method.rpc, worker),
                )
                return ProbeResult(None, False)
        return ProbeResult(None, True)

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
        self._generation += 1
        self._swap(self.table.without(url, self._generation))

    def forget(self, url: str) -> None:
        """`url` left the pool: out of readiness, ejection and routing now."""
        self.ready = self.ready - {url}
        self.ejected.pop(url, None)
        self.capabilities.forget(url)
        self._generation += 1
        self._swap(self.table.without(url, self._generation))

    def _returns(self, url: str, now: float) -> bool:
        """An ejected worker answered ready: back in routing if its time out is over."""
        if now < self.ejected[url]:
            return False
        del self.ejected[url]
        self._metrics.worker_ejected.labels(self._pool.label(url)).set(0)
        logger.info("worker returned", extra={"worker": self._pool.label(url)})
        return True

    # -- discovery ----------------------------------------------------------------------

    async def _refresh(self) -> None:
        """Wait until a discovery that began after this call has swapped its table in.

        Discoveries never overlap, so tables are swapped in the order their reads
        began and an older read never replaces a newer table. One running now may
        have read the indexes before what made us call (a model load, a new probe
        round): we wait for it, then begin the next one, unless another waiter began
        it first, in which case we share it. If the read we waited for failed or was
        cancelled, we run one ourselves.
        """
        wanted = self._began + 1
        while self._discovered < wanted:
            running = self._discovering
            if running is None:
                await self._discover()
            else:
                await running.wait()

    async def _discover(self) -> None:
        """One discovery: every worker's RepositoryIndex, then the table swap.

        Callers check `_discovering` is None first, with no await in between.
        """
        done = self._discovering = trio.Event()
        self._began += 1
        number = self._began
        try:
            results = await fan_out(
                self._pool.urls,
                lambda url: self.probe(
                    url, Method.REPOSITORY_INDEX, _INDEX_REQUEST, pb.RepositoryIndexResponse
                ),
            )
            served: dict[str, list[str]] = {}
            for url, each in results.items():
                if url in self.ejected:
                    continue
                result = _answer(each)
                if result.error is not None:
                    error = result.error
                    self.capabilities.learn(
                        url, Capability.REPOSITORY_INDEX, learned_from(error.code), error.message
                    )
                if result.reply is not None:
                    served[url] = [m.name for m in result.reply.models if is_ready_state(m.state)]
                elif result.timed_out:
                    logger.warning(
                        "RepositoryIndex discovery timed out",
                        extra={"worker": self._pool.label(url)},
                    )
            self._generation += 1
            self._swap(build_routing_table(served, self._pool.urls, self._generation))
            self._discovered = number
        finally:
            self._last_refresh = trio.current_time()
            self._discovering = None
            done.set()

    def _swap(self, table: RoutingTable) -> None:
        if dict(table.models) != dict(self.table.models):
            logger.info(
                "routing table changed",
                extra={"models": len(table), "generation": table.generation},
            )
        self.table = table
        if not self.known.issuperset(table.models):
            self.known = self.known | frozenset(table.models)
        self._metrics.routing_table_size.set(len(table))
        if self.on_swap is not None:
            self.on_swap(table)

    async def refresh_now(self) -> None:
        """Rediscover before answering (a request named a model we do not know).

        Single-flight: joins a discovery already running; skips if one finished
        less than a second ago.
        """
        running = self._discovering
        if running is not None:
            await running.wait()
        elif trio.current_time() - self._last_refresh >= MIN_REFRESH_INTERVAL:
            try:
                await self._discover()
            except Exception:
                logger.warning("on-demand discovery failed", exc_info=True)

    async def rediscover(self) -> None:
        """Rediscover now, unthrottled, and wait for it: the fleet's models just changed.

        A discovery already running may have read the indexes before the change, so
        this one runs after it. Model control answers only once routing agrees.
        """
        try:
            await self._refresh()
        except Exception:
            logger.warning("discovery after a model change failed", exc_info=True)

    def request_refresh(self) -> None:
        """Rediscover soon, without waiting (a worker said NOT_FOUND)."""
        if (
            self._discovering is None
            and self._nursery is not None
            and trio.current_time() - self._last_refresh >= MIN_REFRESH_INTERVAL
        ):
            self._nursery.start_soon(self.refresh_now)


def _answer(result: ProbeResult[M] | Exception) -> ProbeResult[M]:
    """A worker's probe result out of a fan-out. `probe` answers every failure of a
    worker with a result; an `RsgwError` that still came out of it is that worker's
    failed probe, never the round's."""
    return result if isinstance(result, ProbeResult) else ProbeResult(None, False)
