"""Routing metadata: each model's batch locator, max batch and measured cost.

Pure: no trio, no sockets, no logging, no clock. The shell polls ModelControlStatus on
the ready workers each probe round, turns the answers into `WorkerCounters`, and hands
them to `RoutingMetaTracker.refresh`, which returns a new immutable `RoutingMeta`. The
request path reads the current snapshot once per request (docs/original.md §4.3).

Theory of operation
-------------------

Workers report cumulative counters per model: compute seconds, requests served and
rows (items) served. A cost is a ratio of deltas, Δcompute/Δrequests per request and
Δcompute/Δrows per item, smoothed by an EWMA whose clock is *fleet compute-seconds*,
not wall time: `alpha = 1 - 2**(-dt/h)`, where `dt` is the GPU time the fleet spent
since the previous poll. An idle fleet's costs therefore do not decay, and a busy fleet
forgets old costs in proportion to the work it has done since.

The original sums each model's counters over the answering workers and takes deltas of
the sums. That mistakes a change in *which* workers answered for a change in work: a
worker that misses one poll makes every model's sum drop (read as a restart, so the
costs freeze and the decay clock stops), and its return makes the sums jump by its
whole history. We keep baselines per (worker, model) instead and sum the per-pair
deltas. Invariants:

* A pair's baseline survives the worker missing a poll, so its return contributes only
  the work done since it was last seen. State stays bounded by the configured workers
  times the models they ever served.
* A pair seen for the first time has a zero baseline, as in the original: its lifetime
  counters are a valid cost sample (so the very first poll adopts lifetime averages),
  but they are not "compute since the last poll", so they do not advance the decay
  clock. The first poll is therefore baseline-only for the clock, and a worker that
  joins after hours of work cannot flush every EWMA in one step.
* A pair with any negative delta restarted: it is re-baselined and contributes nothing
  (neither sample nor clock), and the other workers' pairs still count.
* A model's first sample is adopted as is; later samples blend with `alpha`.

XX TODO: a worker that restarts and then does more work than it had done before the
restart, all between two polls, looks like ordinary progress; telling them apart needs
a process start id in ModelControlStatus.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from rsgw.scheduling.calls._wire import peek_batch_size

#: Cost per item when no model has a measured cost yet: one unit, so nothing routes on
#: zeros (a free-looking model would attract every request).
DEFAULT_ITEM_COST: Final = 1.0


@dataclass(frozen=True, slots=True)
class ModelCounters:
    """One worker's ModelControlStatus entry for one model (protobuf-free).

    The counters are cumulative since the worker started. `batch_input_name` is the
    wire input carrying the batch axis ("" = none, or the worker is mid-reload) and
    `batch_axis` its 1-based axis (0 = none).
    """

    total_compute_seconds: float = 0.0
    requests_served: int = 0
    rows_served: int = 0
    max_batch_size: int = 0
    batch_input_name: str = ""
    batch_axis: int = 0
    weight_nbytes: int = 0


@dataclass(frozen=True, slots=True)
class WorkerCounters:
    """One worker's answer to a ModelControlStatus poll."""

    models: Mapping[str, ModelCounters] = field(default_factory=lambda: MappingProxyType({}))
    weight_cache_max_bytes: int = 0
    #: The worker's request scheduler (`fifo`, `edf`, `fair`); lpt_packing checks it.
    discipline: str = ""


@dataclass(frozen=True, slots=True)
class ModelMeta:
    """What the request path needs to know about one model."""

    max_batch: int = 0
    batch_input: str = ""
    batch_axis: int = 0
    cost_per_request: float = 0.0
    cost_per_item: float = 0.0


@dataclass(frozen=True, slots=True)
class RoutingMeta:
    """An immutable snapshot of the fleet's routing metadata, swapped by reference.

    Besides the per-model entries it carries this poll's memory facts (docs/original.md §4.3
    `mem`, `mem_cap`, `permodel_workers`, `polled`) for the packer, and the running
    total of fleet compute-seconds the decay clock has counted.
    """

    models: Mapping[str, ModelMeta] = field(default_factory=lambda: MappingProxyType({}))
    #: Unweighted mean of the positive per-item costs (0.0 if none).
    mean_cost_per_item: float = 0.0
    #: model -> the largest weight_nbytes any answering worker reported.
    weight_nbytes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: worker URL -> weight_cache_max_bytes, for the workers that answered.
    weight_cache_max_bytes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: model -> the answering workers that reported it, in poll order.
    workers: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    #: The workers that answered this poll, in poll order.
    polled: tuple[str, ...] = ()
    #: Fleet compute-seconds counted by the decay clock since the tracker started.
    fleet_compute_seconds: float = 0.0
    #: Counts refreshes; 0 is the empty snapshot before the first poll.
    generation: int = 0

    def meta(self, model: str) -> ModelMeta | None:
        return self.models.get(model)

    def item_cost(self, model: str) -> float:
        """The compute-seconds one item of `model` is expected to cost; never 0.

        A model with no measured cost yet (cold: never polled, or never served an item)
        borrows the fleet mean, so it weighs like an average model instead of looking
        free and attracting every request; with no costs at all, one unit.
        """
        entry = self.models.get(model)
        if entry is not None and entry.cost_per_item > 0:
            return entry.cost_per_item
        if self.mean_cost_per_item > 0:
            return self.mean_cost_per_item
        return DEFAULT_ITEM_COST

    def request_items(self, model: str, body: bytes) -> int:
        """How many items a ModelInfer request for `model` carries (at least 1).

        A model with no batch axis (unbatched, all fixed-shape, or a meta, which
        deliberately reports none) and a model not polled yet count one item: their
        leading dimension names an axis, not a count. Otherwise the extent of the
        reported input along the reported axis, read without decoding the payload; an
        absent input or a zero extent also counts one.

        Raises:
            DecodeError: `body` is not a valid ModelInferRequest encoding.
        """
        entry = self.models.get(model)
        if entry is None or entry.batch_axis < 1 or not entry.batch_input:
            return 1
        extent = peek_batch_size(body, entry.batch_input, entry.batch_axis)
        return extent if extent > 0 else 1


def ewma(old: float, sample: float, dt: float, halflife: float) -> float:
    """Blend `sample` into `old` with `alpha = 1 - 2**(-dt/halflife)`.

    After `dt = halflife` a step change has moved halfway; `dt = 0` leaves `old`.
    """
    if dt <= 0:
        return old
    alpha = 1.0 - math.pow(2.0, -dt / halflife)
    return (1.0 - alpha) * old + alpha * sample


class RoutingMetaTracker:
    """Derives `RoutingMeta` snapshots from successive ModelControlStatus polls.

    Holds the per-(worker, model) baselines and the cost EWMAs between polls; see the
    module docstring for why baselines are kept per worker. `snapshot` is the last
    published `RoutingMeta`.

    Args:
        halflife: the EWMA halflife in fleet compute-seconds
            (`scheduling.routing_meta_halflife`), > 0.

    Raises:
        ValueError: `halflife` is not positive (the config check should have caught it).
    """

    def __init__(self, halflife: float) -> None:
        if not halflife > 0:
            raise ValueError(f"routing meta halflife must be positive, got {halflife!r}")
        self._halflife = halflife
        self._baselines: dict[tuple[str, str], tuple[float, int, int]] = {}
        self._cost_per_request: dict[str, float] = {}
        self._cost_per_item: dict[str, float] = {}
        self._snapshot = RoutingMeta()

    @property
    def halflife(self) -> float:
        return self._halflife

    @property
    def snapshot(self) -> RoutingMeta:
        return self._snapshot

    def refresh(self, polled: Mapping[str, WorkerCounters]) -> RoutingMeta:
        """Fold one probe round's answers in and publish a new snapshot.

        Args:
            polled: worker URL -> its answer, for the workers that answered, in the
                configured worker order (the first non-empty batch locator wins).
                A worker that failed or timed out is simply absent.

        Returns:
            The new snapshot (also kept as `snapshot`).
        """
        previous = self._snapshot
        dt = 0.0
        # model -> summed (Δcompute, Δrequests, Δrows) over the pairs that count.
        deltas: dict[str, tuple[float, int, int]] = {}
        max_batch: dict[str, int] = {}
        locators: dict[str, tuple[str, int]] = {}
        weight_nbytes: dict[str, int] = {}
        workers: dict[str, list[str]] = {}
        for url, answer in polled.items():
            for model, c in answer.models.items():
                max_batch[model] = max(max_batch.get(model, c.max_batch_size), c.max_batch_size)
                weight_nbytes[model] = max(weight_nbytes.get(model, 0), c.weight_nbytes)
                if c.batch_input_name and model not in locators:
                    locators[model] = (c.batch_input_name, c.batch_axis)
                workers.setdefault(model, []).append(url)

                key = (url, model)
                seen = key in self._baselines
                b_compute, b_requests, b_rows = self._baselines.get(key, (0.0, 0, 0))
                self._baselines[key] = (c.total_compute_seconds, c.requests_served, c.rows_served)
                d_compute = c.total_compute_seconds - b_compute
                d_requests = c.requests_served - b_requests
                d_rows = c.rows_served - b_rows
                if d_compute < 0 or d_requests < 0 or d_rows < 0:
                    continue  # this worker restarted: re-baselined above, nothing counts
                if seen:
                    dt += d_compute
                s_compute, s_requests, s_rows = deltas.get(model, (0.0, 0, 0))
                deltas[model] = (s_compute + d_compute, s_requests + d_requests, s_rows + d_rows)

        for model, (d_compute, d_requests, d_rows) in deltas.items():
            if d_requests > 0:
                self._cost_per_request[model] = self._blend(
                    self._cost_per_request, model, d_compute / d_requests, dt
                )
            if d_rows > 0:
                self._cost_per_item[model] = self._blend(
                    self._cost_per_item, model, d_compute / d_rows, dt
                )

        published = sorted(set(max_batch) | set(self._cost_per_request) | set(self._cost_per_item))
        models: dict[str, ModelMeta] = {}
        for model in published:
            before = previous.models.get(model, ModelMeta())
            batch_input, batch_axis = locators.get(model, (before.batch_input, before.batch_axis))
            models[model] = ModelMeta(
                max_batch=max_batch.get(model, before.max_batch),
                batch_input=batch_input,
                batch_axis=batch_axis,
                cost_per_request=self._cost_per_request.get(model, 0.0),
                cost_per_item=self._cost_per_item.get(model, 0.0),
            )
        positive = [cost for cost in self._cost_per_item.values() if cost > 0]
        self._snapshot = RoutingMeta(
            models=MappingProxyType(models),
            mean_cost_per_item=sum(positive) / len(positive) if positive else 0.0,
            weight_nbytes=MappingProxyType(weight_nbytes),
            weight_cache_max_bytes=MappingProxyType(
                {url: answer.weight_cache_max_bytes for url, answer in polled.items()}
            ),
            workers=MappingProxyType({m: tuple(urls) for m, urls in workers.items()}),
            polled=tuple(polled),
            fleet_compute_seconds=previous.fleet_compute_seconds + dt,
            generation=previous.generation + 1,
        )
        return self._snapshot

    def _blend(self, costs: dict[str, float], model: str, sample: float, dt: float) -> float:
        """The model's new cost: its first sample as is, later ones through the EWMA.

        A stored cost of 0 (compute that measured nothing) counts as no sample yet, as
        the original's `old or sample` does, so one empty interval cannot pin a model at 0
        and make it decay up slowly from there.
        """
        old = costs.get(model, 0.0)
        return sample if old <= 0 else ewma(old, sample, dt, self._halflife)
