"""Routing-metadata polls: ModelControlStatus from every ready worker, each round.

The prober calls `poll` at the end of every round that saw a ready worker. Each
call runs under the prober's watchdog; a poll that hangs resets that worker's
channel (REFERENCE.md §5.4), exactly as a hung ServerReady probe does, and the
worker is simply absent from this round's sample. The pure tracker turns the
cumulative counters into per-model costs and the scheduler gets the new snapshot
by reference.
"""

from __future__ import annotations

import logging
from types import MappingProxyType

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.gateway._pool import WorkerPool, fan_out
from rsgw.gateway._prober import Prober, ProbeResult
from rsgw.gateway._schedulers import Scheduler
from rsgw.scheduling._meta import ModelCounters, RoutingMetaTracker, WorkerCounters

logger = logging.getLogger(__name__)

CONTROL_STATUS = b"/reactant_control.ControlService/ModelControlStatus"
_REQUEST = cpb.ModelControlStatusRequest().SerializeToString()


class MetaPoller:
    """Feeds the scheduler fresh routing metadata after each probe round."""

    def __init__(
        self,
        pool: WorkerPool,
        prober: Prober,
        tracker: RoutingMetaTracker,
        scheduler: Scheduler,
    ) -> None:
        self._pool = pool
        self._prober = prober
        self.tracker = tracker
        self._scheduler = scheduler
        self.polls = 0

    async def poll(self, ready: frozenset[str]) -> None:
        urls = [url for url in self._pool.urls if url in ready]
        results = await fan_out(urls, self._one)
        polled: dict[str, WorkerCounters] = {}
        for url in urls:
            result = results[url]
            if isinstance(result, WorkerCounters):
                polled[url] = result
        self._scheduler.meta_refreshed(self.tracker.refresh(polled))
        self.polls += 1

    async def _one(self, url: str) -> WorkerCounters | None:
        result: ProbeResult = await self._prober.probe(url, CONTROL_STATUS, _REQUEST)
        if result.timed_out:
            logger.warning(
                "ModelControlStatus poll timed out; resetting the worker's channel",
                extra={"worker": self._pool.label(url)},
            )
            self._pool.channels[url].reset("reset after a hung ModelControlStatus poll")
            return None
        if result.reply is None:
            return None
        return to_counters(cpb.ModelControlStatusResponse.FromString(result.reply))


def to_counters(status: cpb.ModelControlStatusResponse) -> WorkerCounters:
    """The protobuf-free view of one worker's ModelControlStatus answer."""
    return WorkerCounters(
        models=MappingProxyType(
            {
                m.name: ModelCounters(
                    total_compute_seconds=m.total_compute_seconds,
                    requests_served=m.requests_served,
                    rows_served=m.rows_served,
                    max_batch_size=m.max_batch_size,
                    batch_input_name=m.batch_input_name,
                    batch_axis=m.batch_axis,
                    weight_nbytes=m.weight_nbytes,
                )
                for m in status.models
            }
        ),
        weight_cache_max_bytes=status.weight_cache_max_bytes,
    )
