"""Routing-metadata polls: ModelControlStatus from every ready worker, each round.

The prober calls `poll` at the end of every round that saw a ready worker. Each
call runs under the prober's watchdog; a poll that hangs resets that worker's
channel (docs/original.md §5.4), exactly as a hung ServerReady probe does, and the
worker is simply absent from this round's sample. The pure tracker turns the
cumulative counters into per-model costs and the scheduler gets the new snapshot
by reference. Under lpt_packing the same answers also feed the packer (`on_poll`),
so one round costs one poll per worker whatever reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rsgw._methods import Method
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw._status import StatusCode
from rsgw.gateway._pool import WorkerPool, fan_out
from rsgw.gateway._prober import Prober
from rsgw.scheduling._capabilities import Capability
from rsgw.scheduling._meta import ModelCounters, RoutingMeta, RoutingMetaTracker, WorkerCounters
from rsgw.scheduling._schedulers import Scheduler

logger = logging.getLogger(__name__)

_REQUEST = cpb.ModelControlStatusRequest().SerializeToString()

#: What a poll hands on: the answering workers' counters (poll order), the new
#: routing metadata, and the ready set the round saw.
PollListener = Callable[[Mapping[str, WorkerCounters], RoutingMeta, frozenset[str]], None]


@dataclass(frozen=True, slots=True)
class ControlAnswer:
    """One worker's ModelControlStatus: its counters, or None (failed or `timed_out`,
    or `lacking`: the worker has no such control plane, in its own words)."""

    counters: WorkerCounters | None
    timed_out: bool = False
    lacking: str | None = None


async def poll_control_status(prober: Prober, pool: WorkerPool, url: str) -> ControlAnswer:
    """One bounded ModelControlStatus call; a hang resets the worker's channel."""
    result = await prober.probe(
        url, Method.MODEL_CONTROL_STATUS, _REQUEST, cpb.ModelControlStatusResponse
    )
    if result.timed_out:
        logger.warning(
            "ModelControlStatus poll timed out; resetting the worker's channel",
            extra={"worker": pool.label(url)},
        )
        pool.channels[url].reset("reset after a hung ModelControlStatus poll")
        return ControlAnswer(None, True)
    if result.reply is None:
        error = result.error
        if error is not None and error.code is StatusCode.UNIMPLEMENTED:
            prober.capabilities.learn(url, Capability.CONTROL_PLANE, False, error.message)
            return ControlAnswer(None, lacking=error.message or "UNIMPLEMENTED")
        return ControlAnswer(None)
    return ControlAnswer(to_counters(result.reply))


class MetaPoller:
    """Feeds the scheduler fresh routing metadata after each probe round."""

    def __init__(
        self,
        pool: WorkerPool,
        prober: Prober,
        tracker: RoutingMetaTracker,
        scheduler: Scheduler,
        on_poll: PollListener | None = None,
    ) -> None:
        self._pool = pool
        self._prober = prober
        self.tracker = tracker
        self._scheduler = scheduler
        self._on_poll = on_poll
        self.polls = 0

    async def poll(self, ready: frozenset[str]) -> None:
        able = self._prober.capabilities.table.able  # workers with ReactantServer's control plane
        urls = able([url for url in self._pool.urls if url in ready], Method.MODEL_CONTROL_STATUS)
        results = await fan_out(
            urls, lambda url: poll_control_status(self._prober, self._pool, url)
        )
        polled: dict[str, WorkerCounters] = {}
        for url in urls:
            answer = results[url]
            if isinstance(answer, ControlAnswer) and answer.counters is not None:
                polled[url] = answer.counters
        meta = self.tracker.refresh(polled)
        self._scheduler.meta_refreshed(meta)
        self.polls += 1
        if self._on_poll is not None:
            self._on_poll(MappingProxyType(polled), meta, ready)


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
        discipline=status.discipline,
    )
