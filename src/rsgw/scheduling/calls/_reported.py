"""Work counters for workers without ReactantServer's control plane.

Pure. The schedulers' costs come from cumulative per-model counters
(`rsgw.scheduling.calls._meta.WorkerCounters`: compute seconds, requests, items, the batch
locator, weight bytes), which ReactantServer's workers report in ModelControlStatus.
Other workers are read from what they do report, and where they report nothing, the
gateway measures them itself; `CounterSource` says which, and status shows it:

- **statistics** (Triton, `rsgw worker --api triton`): ModelStatistics and each
  model's ModelConfig (`from_statistics`). GPU time is the batches' compute time
  (`batch_stats`: a batch's time counted once, where `inference_stats` counts it
  once per request in it), requests are the successful ones, items are
  `inference_count`; the batch axis is the first input's first dimension when the
  model batches (`max_batch_size` > 0), as Triton's own batcher reads it; weights are
  the memory usage the model reports.
- **gateway** (MLServer, KServe's ModelServer): what the gateway sees of its own calls
  (`MeasuredCounters`): the worker's service time of each ModelInfer (sent to
  answered), one item per request. A service time includes the worker's queueing, so
  a slow or busy worker looks as costly as it is to send work to, which is what
  `least_outstanding` needs to send it less.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.scheduling.calls._meta import ModelCounters, WorkerCounters

_NS = 1e-9


class CounterSource(enum.Enum):
    """Where a worker's work counters come from."""

    CONTROL_PLANE = "control_plane"
    STATISTICS = "statistics"
    GATEWAY = "gateway"

    def __str__(self) -> str:
        return self.value


def from_statistics(
    statistics: pb.ModelStatisticsResponse, configs: Mapping[str, pb.ModelConfig]
) -> WorkerCounters:
    """A worker's counters from its ModelStatistics (all models) and the models'
    configurations (see the module docstring); versions of one model add up."""
    models: dict[str, ModelCounters] = {}
    for stats in statistics.model_stats:
        if stats.batch_stats:
            ns = sum(
                b.compute_input.ns + b.compute_infer.ns + b.compute_output.ns
                for b in stats.batch_stats
            )
        else:
            inference = stats.inference_stats
            ns = inference.compute_input.ns + inference.compute_infer.ns
            ns += inference.compute_output.ns
        config = configs.get(stats.name)
        batches = config is not None and config.max_batch_size > 0 and len(config.input) > 0
        before = models.get(stats.name, ModelCounters())
        models[stats.name] = ModelCounters(
            total_compute_seconds=before.total_compute_seconds + ns * _NS,
            requests_served=before.requests_served + stats.inference_stats.success.count,
            rows_served=before.rows_served + stats.inference_count,
            max_batch_size=config.max_batch_size if config is not None else 0,
            batch_input_name=config.input[0].name if batches and config is not None else "",
            batch_axis=1 if batches else 0,
            weight_nbytes=before.weight_nbytes + sum(m.byte_size for m in stats.memory_usage),
        )
    return WorkerCounters(models=MappingProxyType(models))


class MeasuredCounters:
    """What the gateway sees of its own ModelInfer calls to each worker, cumulative.

    Bounded by the workers times the models routed to them (a name no worker serves
    is never routed, so never recorded).
    """

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        #: url -> model -> [service seconds, calls].
        self._seen: dict[str, dict[str, list[float]]] = {}

    def record(self, url: str, model: str, seconds: float) -> None:
        """One call of `model` that `url` answered in `seconds`."""
        models = self._seen.get(url)
        if models is None:
            models = self._seen[url] = {}
        tally = models.get(model)
        if tally is None:
            models[model] = [seconds, 1.0]
        else:
            tally[0] += seconds
            tally[1] += 1.0

    def counters(self, url: str) -> WorkerCounters:
        """`url`'s counters as a control plane would report them (one item per call)."""
        models = {
            model: ModelCounters(
                total_compute_seconds=seconds, requests_served=int(calls), rows_served=int(calls)
            )
            for model, (seconds, calls) in self._seen.get(url, {}).items()
        }
        return WorkerCounters(models=MappingProxyType(models))

    def forget(self, url: str) -> None:
        """`url` left the pool."""
        self._seen.pop(url, None)
