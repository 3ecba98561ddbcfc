"""One worker's device in virtual time: the worker's own queues, weight cache and costs.

Pure: no trio, no sockets, no clock. Between two events it does what the simulated
worker (`rsgw.worker.device._device`) does between two awaits, with the same parts: the same
`RequestQueues` (discipline, dynamic batcher), the same `WeightCache` (on-demand
loads, LRU eviction within the budget), the same costs (`ModelSpec.execution_seconds`
and `weight_load_seconds`), times the same time scale. It leaves out what costs no
device time: tensors, metas, sequences, and control commands but compaction.

A batch's weights load before it runs and the load is device time but not compute,
as on the worker; a call the client gave up on leaves the queue (the gateway cancels
it), and one already in a batch is still computed and counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from rsgw.worker.device._batching import BatchPolicy, Discipline, Pending, RequestQueues
from rsgw.worker.device._weights import Residency, WeightCache
from rsgw.worker.models._specs import ModelSpec

#: The counters `_results.summarise` reads per worker (as bench/fleet reads them from
#: each worker's /metrics), plus `rows@MODEL` and `dispatches@MODEL`.
COUNTERS = ("dispatches", "rows", "requests", "compute_s", "loads", "evicts", "load_s", "shed")


@dataclass(slots=True, eq=False)
class SimCall:
    """One client call: when it was due, where it went, how it ended."""

    index: int
    model: str
    sent: float
    deadline: float
    rows: int = 1
    ticket: object = None  # the gateway ledger's ticket while the gateway holds the call
    worker: str = ""  # the device it was sent to
    pending: Pending[SimCall] | None = None  # queued at a device
    code: str = ""  # the final status; "" while the call is open
    done: float = math.nan
    routed: float = math.nan  # when the gateway sent it to its worker
    position: int = 0  # the calls its worker held then, itself included


def device_weights(specs: Mapping[str, ModelSpec], budget: int) -> WeightCache:
    """A self-managed worker's weight cache: every model loads on demand within
    `budget`, or stays resident when there is no budget (0)."""
    floor = Residency.PINNED_SYSTEM if budget > 0 else Residency.PINNED_DEVICE
    return WeightCache(
        {m: s.weight_bytes for m, s in specs.items()}, budget, dict.fromkeys(specs, floor)
    )


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A batch on the device: its calls, and when it ends."""

    model: str
    calls: tuple[SimCall, ...]
    rows: int
    ends: float
    compute_s: float


@dataclass(slots=True)
class SimDevice:
    """One GPU worker: queues, weights and counters, stepped by the engine.

    Args:
        url: the worker's name in the gateway's tables.
        specs: its catalogue (model -> spec); every model is routable.
        discipline: how the next model is chosen (the worker's --discipline).
        weight_cache_bytes: the on-demand weight budget; 0 keeps every model resident.
        time_scale: multiplies every cost, as the worker's --time-scale does.
        load_bandwidth: bytes/s for models without a catalogue load time.
    """

    url: str
    specs: Mapping[str, ModelSpec]
    discipline: Discipline
    weight_cache_bytes: int
    time_scale: float = 1.0
    load_bandwidth: float = 8 * 1024**3
    queues: RequestQueues[SimCall] = field(init=False)
    cache: WeightCache = field(init=False)
    policies: dict[str, BatchPolicy] = field(init=False)
    max_batch: dict[str, int] = field(init=False)
    counters: dict[str, float] = field(init=False)
    per_model: dict[str, list[float]] = field(init=False)  # compute_s, requests, rows
    running: Dispatch | None = None

    def __post_init__(self) -> None:
        self.queues = RequestQueues(self.discipline)
        self.cache = device_weights(self.specs, self.weight_cache_bytes)
        self.policies = {
            m: BatchPolicy(s.max_queue_delay_seconds * self.time_scale, s.preferred_batch_size)
            for m, s in self.specs.items()
            if s.max_queue_delay_seconds > 0 and s.max_batch_size > 0
        }
        self.max_batch = {m: s.max_batch_size for m, s in self.specs.items()}
        self.counters = dict.fromkeys(COUNTERS, 0.0)
        for model in self.specs:  # as a worker's /metrics lists every model from the start
            self.counters[f"rows@{model}"] = self.counters[f"dispatches@{model}"] = 0.0
        self.per_model = {m: [0.0, 0.0, 0.0] for m in self.specs}

    def enqueue(self, call: SimCall, now: float) -> None:
        call.worker = self.url
        call.pending = Pending(call.model, call.rows, None, now, call.deadline, call)
        self.queues.enqueue(call.pending)

    def withdraw(self, call: SimCall) -> None:
        """The client gave up on a queued call: it leaves the queue unrun."""
        if call.pending is not None:
            self.queues.withdraw(call.pending)
            call.pending = None

    def start(self, now: float) -> tuple[Dispatch | None, list[SimCall]]:
        """The batch started now (None if the device is busy or nothing is due), and the
        calls `edf` dropped as expired on the way."""
        expired: list[SimCall] = []
        if self.running is not None:
            return None, expired
        while self.running is None:
            batch = self.queues.next_batch(self.max_batch, now, self.policies)
            if batch is None:
                break
            expired += [p.payload for p in batch.expired if p.payload is not None]
            if not batch.requests:
                continue
            spec = self.specs[batch.model]
            load_s = 0.0
            load = self.cache.load(batch.model, now)
            if load is not None:
                load_s = spec.weight_load_seconds(load.nbytes, self.load_bandwidth)
                load_s *= self.time_scale
                self.counters["loads"] += 1
                self.counters["evicts"] += len(load.evicted)
                self.counters["load_s"] += load_s
            compute_s = spec.execution_seconds(batch.rows) * self.time_scale
            calls = tuple(p.payload for p in batch.requests if p.payload is not None)
            for call in calls:
                call.pending = None
            self.running = Dispatch(
                batch.model, calls, batch.rows, now + load_s + compute_s, compute_s
            )
        for call in expired:
            call.pending = None
        return self.running, expired

    def finish(self) -> Dispatch:
        """The running batch is over: count it, let the scheduler learn its cost."""
        done = self.running
        assert done is not None
        self.running = None
        c = self.counters
        c["dispatches"] += 1
        c["rows"] += done.rows
        c["requests"] += len(done.calls)
        c["compute_s"] += done.compute_s
        key = done.model
        c[f"rows@{key}"] += done.rows
        c[f"dispatches@{key}"] += 1
        model = self.per_model[key]
        model[0] += done.compute_s
        model[1] += len(done.calls)
        model[2] += done.rows
        self.queues.record(key, done.rows, done.compute_s, done.ends)
        return done

    def wake_at(self) -> float:
        """When a model held back by its batcher becomes due (inf: none is)."""
        return self.queues.wake_at(self.policies) if len(self.queues) else math.inf

    def compact(self) -> None:
        """CompactMemory with nothing to reload: free every on-demand weight."""
        self.cache.free_unpinned()
