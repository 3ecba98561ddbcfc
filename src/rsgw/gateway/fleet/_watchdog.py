"""The stall watch's shell: look at every worker connection a few times a second.

A worker that stops answering (SIGSTOP, a hung process, a dead host, a cut
network) would otherwise keep its place in routing until the prober's next round
times out (seconds), and every call sent to it meanwhile would wait for its
deadline. Here a stall is noticed, confirmed with an HTTP/2 PING and answered by
ejection within `stall_seconds + ping_timeout` (1.5 s by default): the worker
leaves routing at once, its channel is reset so the calls waiting on it fail over
to other replicas (they got no answer, so they may go elsewhere), and the prober
brings it back once it answers ready again. The decisions are
`rsgw.scheduling.fleet._stalls.StallWatch`'s.
"""

from __future__ import annotations

import logging

import trio

from rsgw.gateway.fleet._pool import WorkerPool
from rsgw.gateway.fleet._prober import Prober
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.scheduling.fleet._stalls import StallWatch, Verdict

logger = logging.getLogger(__name__)


class Watchdog:
    """Runs `StallWatch` over the pool's channels and carries out its verdicts."""

    def __init__(
        self,
        pool: WorkerPool,
        prober: Prober,
        metrics: GatewayMetrics,
        watch: StallWatch,
        *,
        ejection_seconds: float,
    ) -> None:
        self._pool = pool
        self._prober = prober
        self._metrics = metrics
        self.watch = watch
        self.ejection_seconds = ejection_seconds
        #: How often every connection is looked at.
        self.interval = min(0.25, max(0.02, watch.stall_seconds / 4))

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self.watch.enabled:
            return
        planned = trio.current_time()
        while True:
            planned += self.interval
            await trio.sleep_until(planned)
            now = trio.current_time()
            lag = now - planned
            if lag > self.interval:
                planned = now  # fell behind: look from now on, do not catch up
            self.look(now, lag=lag)

    def look(self, now: float, *, lag: float = 0.0) -> None:
        """One look at every worker's connection (what `serve` does each tick)."""
        for url in self._pool.urls:
            if url in self._prober.ejected:
                continue
            channel = self._pool.channels[url]
            pending, reads = channel.liveness()
            verdict = self.watch.look(url, now, pending=pending, reads=reads, lag=lag)
            if verdict is Verdict.PING:
                channel.ping()
            elif verdict is Verdict.EJECT:
                self._eject(url, now, pending)

    def _eject(self, url: str, now: float, pending: int) -> None:
        stalled = self.watch.stalled_for(url, now)
        self.watch.forget(url)
        label = self._pool.label(url)
        logger.warning(
            "worker ejected",
            extra={
                "worker": label,
                "waiting_calls": pending,
                "silent_s": round(stalled, 3),
                "out_for_at_least_s": self.ejection_seconds,
            },
        )
        self._prober.eject(url, self.ejection_seconds)
        self._pool.channels[url].reset(
            f"no answer for {stalled:.1f} s to {pending} calls nor to a PING; worker ejected"
        )
