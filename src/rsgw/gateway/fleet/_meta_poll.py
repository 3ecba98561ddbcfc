"""Routing-metadata polls: every ready worker's work counters, each round.

The counters come from ModelControlStatus where a worker has ReactantServer's
control plane, from ModelStatistics and ModelConfig where it has Triton's, and from
the gateway's own measurements of its calls elsewhere (`rsgw.scheduling.calls._reported`).
The prober calls `poll` at the end of every round that saw a ready worker. Each
call runs under the prober's watchdog; a poll that hangs resets that worker's
channel (docs/original.md §5.4), exactly as a hung ServerReady probe does, and the
worker is simply absent from this round's sample. The pure tracker turns the
cumulative counters into per-model costs and the scheduler gets the new snapshot
by reference. Under lpt_packing the same answers also feed the packer (`on_poll`),
so one round costs one poll per worker whatever reads it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

import trio
from google.protobuf.message import Message

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.gateway.fleet._capability_probe import CapabilityProbe
from rsgw.gateway.fleet._pool import WorkerPool, fan_out
from rsgw.gateway.fleet._probe_call import DEFAULT_PROBE_TIMEOUT, ProbeResult, probe_call
from rsgw.scheduling.calls._meta import (
    ModelCounters,
    RoutingMeta,
    RoutingMetaTracker,
    WorkerCounters,
)
from rsgw.scheduling.calls._reported import CounterSource, MeasuredCounters, from_statistics
from rsgw.scheduling.calls._schedulers import Scheduler
from rsgw.scheduling.fleet._capabilities import Capability

logger = logging.getLogger(__name__)

_REQUEST = cpb.ModelControlStatusRequest().SerializeToString()
_ALL_STATISTICS = pb.ModelStatisticsRequest().SerializeToString()
_WHOLE_INDEX = pb.RepositoryIndexRequest(ready=False).SerializeToString()
_NOTHING = ModelCounters()
M = TypeVar("M", bound=Message)

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


async def poll_control_status(
    capabilities: CapabilityProbe, pool: WorkerPool, url: str, watchdog_seconds: float
) -> ControlAnswer:
    """One bounded ModelControlStatus call (`watchdog_seconds`, the prober's); a hang resets the
    worker's channel, and UNIMPLEMENTED is learned into `capabilities`."""
    result = await probe_call(
        pool,
        url,
        Method.MODEL_CONTROL_STATUS,
        _REQUEST,
        cpb.ModelControlStatusResponse,
        watchdog_seconds,
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
            capabilities.learn(url, Capability.CONTROL_PLANE, False, error.message)
            return ControlAnswer(None, lacking=error.message or "UNIMPLEMENTED")
        return ControlAnswer(None)
    return ControlAnswer(to_counters(result.reply))


class MetaPoller:
    """Feeds the scheduler fresh routing metadata after each probe round.

    Each ready worker is read from the best source it has (`CounterSource`):
    ReactantServer's ModelControlStatus; else ModelStatistics and ModelConfig
    (Triton); else what the gateway measured of its calls to it (`measured`, which
    the ModelInfer path records into). Only the first are placeable under
    lpt_packing (`on_poll` gets those); every source feeds the costs.
    """

    def __init__(
        self,
        pool: WorkerPool,
        capabilities: CapabilityProbe,
        tracker: RoutingMetaTracker,
        scheduler: Scheduler,
        on_poll: PollListener | None = None,
        *,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        measured: MeasuredCounters | None = None,
        repository: RepositoryConfig | None = None,
    ) -> None:
        self._pool = pool
        self._capabilities = capabilities
        self._probe_timeout = probe_timeout
        self.tracker = tracker
        self._scheduler = scheduler
        self._on_poll = on_poll
        #: What the gateway measures of its own calls (the last source).
        self.measured = measured or MeasuredCounters()
        #: Where each worker's counters came from at the last poll that read it.
        self.sources: dict[str, CounterSource] = {}
        #: url -> (the connection it was read on, its models' configurations).
        self._configs: dict[str, tuple[int, dict[str, pb.ModelConfig]]] = {}
        self.polls = 0
        #: The models the gateway places by loading and unloading them, if any.
        self.repository = repository or RepositoryConfig()
        #: model -> the largest weight a worker reported for it (an unloaded model
        #: reports none, and the packer still weighs it).
        self._weights: dict[str, int] = {}

    async def poll(self, ready: frozenset[str]) -> None:
        urls = [url for url in self._pool.urls if url in ready]
        polled, placeable = await self.read(urls)
        meta = self.tracker.refresh(polled)
        self._scheduler.meta_refreshed(meta)
        self.polls += 1
        if self._on_poll is not None:
            self._on_poll(MappingProxyType(placeable), meta, ready)

    async def read(
        self, urls: Sequence[str]
    ) -> tuple[dict[str, WorkerCounters], dict[str, WorkerCounters]]:
        """`urls`' counters, each from its best source, and the placeable ones (both
        in `urls`' order): the control plane's, and those of the workers placed by
        loading and unloading (`rsgw.scheduling.placement._repository_moves`), which list every
        model handed to the gateway that their repository has, loaded or not."""
        table = self._capabilities.table
        control = table.able(urls, Method.MODEL_CONTROL_STATUS)
        others = [url for url in urls if url not in control]
        reporting = table.able(table.able(others, Method.MODEL_STATISTICS), Method.MODEL_CONFIG)
        controlled = await fan_out(
            control,
            lambda url: poll_control_status(
                self._capabilities, self._pool, url, self._probe_timeout
            ),
        )
        reported = await fan_out(reporting, self._statistics)
        table = self._capabilities.table  # what the control polls taught
        loadable = table.loadable(urls) if self.repository.models else ()
        repositories = await fan_out(loadable, self._repository_models)
        polled: dict[str, WorkerCounters] = {}
        placeable: dict[str, WorkerCounters] = {}
        for url in urls:  # pool order
            if url in controlled:
                answer = controlled[url]
                if isinstance(answer, ControlAnswer) and answer.counters is not None:
                    polled[url] = placeable[url] = answer.counters
                    self.sources[url] = CounterSource.CONTROL_PLANE
            elif isinstance(counters := reported.get(url), WorkerCounters):
                polled[url] = counters
                self.sources[url] = CounterSource.STATISTICS
            else:  # no statistics (or, this once, no answer to them: UNIMPLEMENTED is learned)
                polled[url] = self.measured.counters(url)
                self.sources[url] = CounterSource.GATEWAY
            models = repositories.get(url)
            if url in polled and isinstance(models, tuple):
                placeable[url] = self._placeable(url, polled[url], models)
        return polled, placeable

    async def _repository_models(self, url: str) -> tuple[str, ...] | None:
        """The handed models `url`'s repository has, loaded or not (None: no answer)."""
        result = await self._probe(
            url, Method.REPOSITORY_INDEX, _WHOLE_INDEX, pb.RepositoryIndexResponse
        )
        if result.reply is None:
            return None
        handed = self.repository.models
        return tuple(sorted({m.name for m in result.reply.models if m.name in handed}))

    def weight_of(self, model: str) -> int:
        """A handed model's weight in bytes: what a worker's statistics reported
        (`memory_usage`, the largest seen), else `repository.weight_bytes`, else
        `repository.default_weight_bytes`."""
        repository = self.repository
        return self._weights.get(model) or repository.weight_bytes.get(
            model, repository.default_weight_bytes
        )

    def _placeable(
        self, url: str, counters: WorkerCounters, models: Sequence[str]
    ) -> WorkerCounters:
        """A loadable worker's counters as the packer takes them: every handed model
        its repository has (zeros for one not loaded), weighed as configured or as last
        reported, against the configured budget."""
        placed: dict[str, ModelCounters] = {}
        for model in models:
            each = counters.models.get(model, _NOTHING)
            if each.weight_nbytes > self._weights.get(model, 0):
                self._weights[model] = each.weight_nbytes
            placed[model] = dataclasses.replace(each, weight_nbytes=self.weight_of(model))
        return WorkerCounters(
            models=MappingProxyType(placed),
            weight_cache_max_bytes=self.repository.budget_of(self._pool.label(url), url),
            discipline=counters.discipline,
        )

    async def _statistics(self, url: str) -> WorkerCounters | None:
        """A Triton-like worker's counters: ModelStatistics, and the configuration of
        each model it names (read once per connection)."""
        result = await self._probe(
            url, Method.MODEL_STATISTICS, _ALL_STATISTICS, pb.ModelStatisticsResponse
        )
        if result.reply is None:
            return None
        connection = self._pool.channels[url].connects
        cached = self._configs.get(url)
        configs = cached[1] if cached is not None and cached[0] == connection else {}
        missing = {s.name for s in result.reply.model_stats} - set(configs)

        async def read(model: str) -> None:
            request = pb.ModelConfigRequest(name=model).SerializeToString()
            answer = await self._probe(url, Method.MODEL_CONFIG, request, pb.ModelConfigResponse)
            if answer.reply is not None:
                configs[model] = answer.reply.config

        async with trio.open_nursery() as nursery:
            for model in sorted(missing):
                nursery.start_soon(read, model)
        self._configs[url] = (connection, configs)
        return from_statistics(result.reply, configs)

    async def _probe(
        self, url: str, method: Method, request: bytes, response: type[M]
    ) -> ProbeResult[M]:
        return await probe_call(self._pool, url, method, request, response, self._probe_timeout)

    def forget(self, url: str) -> None:
        """`url` left the pool."""
        self.measured.forget(url)
        self.sources.pop(url, None)
        self._configs.pop(url, None)


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
