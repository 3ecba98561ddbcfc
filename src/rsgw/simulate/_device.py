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

Under explicit model control (`--model-control-mode explicit`, issue 49's cold path)
the device starts with nothing loaded and serves only the models loaded on it:
RepositoryModelLoad and Unload are control commands (`Command`), run in the order they
came, before the next batch, as the worker's dispatch loop runs them. A load occupies
the device for the model's load time (device time, not compute, counted in `loads`
and `load_s`); an unload takes none, but waits its turn behind the running batch and
the commands before it. A model reads READY (RepositoryIndex) from the moment its load
begins, as the worker lists it once `DeviceMemory.load` has taken it back.
"""

from __future__ import annotations

import math
from collections import deque
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
    #: Issue 52: who sent it, the `priority` it carries, and the band the gateway gave it.
    tenant: str = ""
    priority: int = 0
    band: int = 0
    seated: bool = False  # it holds a place in its tenant's quota
    placed: str = ""  # the worker where it holds a place by band and share
    refused: str = ""  # why the gateway refused it (`_tenants.REASONS`), if it did


def device_weights(specs: Mapping[str, ModelSpec], budget: int) -> WeightCache:
    """A self-managed worker's weight cache: every model loads on demand within
    `budget`, or stays resident when there is no budget (0)."""
    floor = Residency.PINNED_SYSTEM if budget > 0 else Residency.PINNED_DEVICE
    return WeightCache(
        {m: s.weight_bytes for m, s in specs.items()}, budget, dict.fromkeys(specs, floor)
    )


LOAD = "load"
UNLOAD = "unload"


@dataclass(frozen=True, slots=True)
class Command:
    """RepositoryModelLoad (`LOAD`) or Unload of `model`, asked at `asked` (the gateway
    times a load from then: its wait behind other commands counts); `tag` is the
    asker's own (the simulated gateway's load or eviction it belongs to)."""

    kind: str
    model: str
    asked: float
    tag: object = None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A batch on the device (or a control command): its calls, and when it ends."""

    model: str
    calls: tuple[SimCall, ...]
    rows: int
    ends: float
    compute_s: float
    command: Command | None = None


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
        explicit: explicit model control: nothing loaded at start, models loaded and
            unloaded by `control` commands only, within `weight_cache_bytes` (the
            worker's --gpu-memory-bytes).
    """

    url: str
    specs: Mapping[str, ModelSpec]
    discipline: Discipline
    weight_cache_bytes: int
    time_scale: float = 1.0
    load_bandwidth: float = 8 * 1024**3
    explicit: bool = False
    queues: RequestQueues[SimCall] = field(init=False)
    cache: WeightCache = field(init=False)
    policies: dict[str, BatchPolicy] = field(init=False)
    max_batch: dict[str, int] = field(init=False)
    counters: dict[str, float] = field(init=False)
    per_model: dict[str, list[float]] = field(init=False)  # compute_s, requests, rows
    running: Dispatch | None = None
    #: Explicit model control: the models loaded, and the commands waiting their turn.
    loaded: set[str] = field(init=False, default_factory=set)
    commands: deque[Command] = field(init=False, default_factory=deque)

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
        if self.commands:  # control commands run before the next batch
            self.running = self._command(self.commands.popleft(), now)
            return self.running, expired
        while self.running is None:
            batch = self.queues.next_batch(self.max_batch, now, self.policies)
            if batch is None:
                break
            expired += [p.payload for p in batch.expired if p.payload is not None]
            if not batch.requests:
                continue
            spec = self.specs[batch.model]
            load_s = 0.0
            if self.explicit:
                # The gateway routes only to READY copies and unloads none with calls.
                assert batch.model in self.loaded, (self.url, batch.model)
            elif (load := self.cache.load(batch.model, now)) is not None:
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

    def control(self, command: Command) -> None:
        """Queue a RepositoryModelLoad or Unload (the caller starts an idle device)."""
        self.commands.append(command)

    @property
    def ready(self) -> frozenset[str]:
        """The models RepositoryIndex lists READY: loaded, or with their load begun."""
        running = self.running
        if running is not None and running.command is not None and running.command.kind == LOAD:
            return frozenset(self.loaded | {running.model})
        return frozenset(self.loaded)

    def loaded_bytes(self) -> int:
        return sum(self.specs[m].weight_bytes for m in self.loaded)

    def _command(self, command: Command, now: float) -> Dispatch:
        seconds = 0.0
        if command.kind == LOAD and command.model not in self.loaded:
            spec = self.specs[command.model]
            # The worker fails a load past its GPU memory; the gateway's ledger never asks.
            assert self.loaded_bytes() + spec.weight_bytes <= self.weight_cache_bytes, (
                self.url,
                command.model,
            )
            seconds = self._load_seconds(command.model)
        return Dispatch(command.model, (), 0, now + seconds, 0.0, command)

    def finish(self) -> Dispatch:
        """The running batch (or command) is over: count it, let the scheduler learn its
        cost (a command: carry it out)."""
        done = self.running
        assert done is not None
        self.running = None
        if done.command is not None:
            self._carry_out(done)
            return done
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

    def _carry_out(self, done: Dispatch) -> None:
        command = done.command
        assert command is not None
        if command.kind == UNLOAD:
            self.loaded.discard(command.model)
        elif command.model not in self.loaded:
            self.loaded.add(command.model)
            self.counters["loads"] += 1
            self.counters["load_s"] += self._load_seconds(command.model)

    def _load_seconds(self, model: str) -> float:
        spec = self.specs[model]
        return spec.weight_load_seconds(spec.weight_bytes, self.load_bandwidth) * self.time_scale

    def wake_at(self) -> float:
        """When a model held back by its batcher becomes due (inf: none is)."""
        return self.queues.wake_at(self.policies) if len(self.queues) else math.inf

    def compact(self) -> None:
        """CompactMemory with nothing to reload: free every on-demand weight."""
        self.cache.free_unpinned()
