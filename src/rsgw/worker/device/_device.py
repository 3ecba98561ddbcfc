"""The simulated GPU: one dispatch loop executing one coalesced batch at a time.

A batch of R rows of model m occupies the device for
`(launch_seconds + item_seconds * R) * time_scale` seconds, so batching pays off
as it does on a real GPU: the launch cost is shared by every request in the
batch. Outputs are computed for real, per request, when the batch completes.

Weights (docs/original.md §8.4; `_memory.py` and `_weights.py`). A model whose
weights are not on the device pays a load before its batch runs; the load is
device time but not compute. Self-managed workers load on demand and evict by
LRU; externally managed ones serve only what the control plane pinned.

Control commands (SetModelResidency, CompactMemory) are queued to the dispatch
loop and run between batches, never during one: a batch never loses its
weights mid-kernel, and a load a command causes takes device time like any
other load.

Metas run in the caller's task, not in the loop: one sub-request per
sub-model, in order, each queued like any request of that sub-model (so it
coalesces with the sub-calls of other meta requests). A meta's compute is the
share of each sub-call batch's device time attributable to its request (rows
over batch rows), so summing every meta request's compute counts each second of
device time once, however the sub-calls coalesced.

Counters follow docs/original.md §8.2 and are cumulative since start: per dispatch
`dispatch_count += 1`, `requests_served += requests`, `rows_served += rows`,
`total_compute_seconds += the (scaled) execution time`.

Cancellation: a caller cancelled while its request waits withdraws it from the
queue; one cancelled while its batch executes simply stops waiting (a GPU kernel
is not interrupted), and the batch is still counted. A control command whose
caller gives up still runs: it is already in the device's stream.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import trio

from rsgw.base._errors import GrpcError, InvalidRequest, NotFound, RsgwError, shown
from rsgw.base._status import StatusCode
from rsgw.worker.device._batching import (
    Batch,
    BatchPolicy,
    BatchSeen,
    Discipline,
    Pending,
    RequestQueues,
)
from rsgw.worker.device._counters import ModelCounters as ModelCounters
from rsgw.worker.device._memory import (
    DEFAULT_LOAD_BANDWIDTH,
    DeviceMemory,
    not_resident,
    unloaded_model,
)
from rsgw.worker.device._weights import Residency, ResidencyMode
from rsgw.worker.models._compute import run_model

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping

    from rsgw.worker.models._specs import Catalogue, ModelSpec
    from rsgw.worker.models._tensors import Tensor

logger = logging.getLogger(__name__)

#: Sub-calls of metas coalesce with each other: they carry no tensors of their own.
_SUBCALL_VARIANT = "meta-subcall"


@dataclass(slots=True, eq=False)
class _Job:
    """The shell's half of a queued request: inputs in, outputs or error out."""

    spec: ModelSpec
    inputs: Mapping[str, Tensor]
    #: The name the client called (a meta's, for its sub-calls): errors name it.
    route: str
    #: A meta's sub-call: its outputs are never read, so never computed.
    internal: bool = False
    done: trio.Event = field(default_factory=trio.Event)
    outputs: tuple[Tensor, ...] = ()
    error: Exception | None = None
    #: This request's share of its batch's device seconds.
    compute_seconds: float = 0.0
    #: Where its batches go when the request is traced (else None: nothing recorded).
    seen: list[BatchSeen] | None = None


@dataclass(slots=True, eq=False)
class _Command:
    action: Callable[[], Awaitable[None]]
    done: trio.Event = field(default_factory=trio.Event)
    error: Exception | None = None


class Device:
    """One simulated GPU with per-model queues and a weight cache.

    Run `serve` in a nursery; call `execute` from request handlers and the
    control methods from ControlService handlers (which validate first).

    Args:
        catalogue: the models.
        time_scale: multiplies every simulated duration (execution and loads).
        discipline: how the next model to dispatch is chosen.
        weight_cache_bytes: the on-demand weight budget; 0 disables the cache,
            and a self-managed worker then keeps every model on the device.
        residency_mode: who decides what is on the device.
        load_bandwidth: bytes/s a weight load moves, for models without `load_ms`.
        pinned: routable models pinned on the device from the start.

    Raises:
        ConfigError: `pinned` names a model clients cannot call.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        time_scale: float = 1.0,
        discipline: Discipline = Discipline.FIFO,
        weight_cache_bytes: int = 0,
        residency_mode: ResidencyMode = ResidencyMode.SELF_MANAGED,
        load_bandwidth: float = DEFAULT_LOAD_BANDWIDTH,
        pinned: Iterable[str] = (),
        loaded_at_start: Iterable[str] | None = None,
        gpu_memory_bytes: int = 0,
    ) -> None:
        self.catalogue = catalogue
        self.time_scale = time_scale
        self.discipline = discipline
        self.residency_mode = residency_mode
        self.counters: dict[str, ModelCounters] = {
            m.name: ModelCounters() for m in catalogue.models
        }
        self.memory = DeviceMemory(
            catalogue,
            weight_cache_bytes=weight_cache_bytes,
            mode=residency_mode,
            load_bandwidth=load_bandwidth,
            time_scale=time_scale,
            pinned=pinned,
            loaded_at_start=loaded_at_start,
            gpu_memory_bytes=gpu_memory_bytes,
        )
        self._max_batch = {m.name: m.max_batch_size for m in catalogue.models}
        #: The models that hold requests back to batch them (Triton's dynamic batcher).
        self._policies: dict[str, BatchPolicy] = {}
        for spec in catalogue.models:
            self._set_policy(spec)
        #: Models loaded with a configuration override (RepositoryModelLoad's `config`).
        self._overridden: dict[str, ModelSpec] = {}
        self._queues: RequestQueues[_Job] = RequestQueues(discipline)
        self._meta_inflight = {m.name: 0 for m in catalogue.models if m.is_meta}
        self._commands: deque[_Command] = deque()
        self._work = trio.Event()
        self.busy_seconds = 0.0

    # -- what the service and the metrics read ---------------------------------------

    def model(self, name: str, version: str = "") -> ModelSpec:
        """The routable model a client named, loaded; NOT_FOUND otherwise, in Triton's words.

        Internal sub-models are NOT_FOUND as if they did not exist.
        """
        spec = self._overridden.get(name) or self.catalogue.route(name)
        if spec is None:
            raise NotFound(f"Request for unknown model: '{shown(name)}' is not found")
        if name in self.memory.unloaded:
            raise unloaded_model(name)
        if version and version != spec.version:
            _check_version_string(version)
            raise NotFound(
                f"Request for unknown model: '{shown(name)}' version {shown(version)} is not found"
            )
        return spec

    def queue_depth(self, model: str) -> int:
        """Requests of `model` waiting; for a meta, its requests in progress."""
        if model in self._meta_inflight:
            return self._meta_inflight[model]
        return self._queues.depth(model)

    def weight(self, model: str) -> float:
        """`model`'s fair weight."""
        return self._queues.fair.weight(model)

    def set_weight(self, model: str, weight: float) -> None:
        """Set a routable model's fair weight; a meta's applies to its sub-calls too.

        Takes effect at the next dispatch decision (which is between batches).

        Raises:
            InvalidRequest: `weight` is not a finite number > 0.
        """
        spec = self.catalogue.get(model)
        assert spec is not None
        for name in dict.fromkeys([model, *(s.name for s in self.catalogue.submodels(spec))]):
            self._queues.fair.set_weight(name, weight)

    # -- inference ------------------------------------------------------------------

    async def execute(
        self,
        spec: ModelSpec,
        inputs: Mapping[str, Tensor],
        *,
        rows: int,
        variant: Hashable,
        deadline: float = math.inf,
        seen: list[BatchSeen] | None = None,
    ) -> tuple[Tensor, ...]:
        """Queue one request, wait for its batch to run, return its outputs.

        A meta runs through its sub-models first (module docstring). A traced
        request's batches (a meta's one per sub-model) are appended to `seen`.

        Raises:
            GrpcError: DEADLINE_EXCEEDED when `deadline` passed before the batch
                started (the request never ran).
            FailedPrecondition: externally managed, and the weights were
                unpinned while the request waited.
            RsgwError: the model rejected the request's values.
        """
        if spec.is_meta:
            return await self._execute_meta(spec, inputs, rows, deadline, seen)
        job = _Job(spec, inputs, spec.name, seen=seen)
        return (await self._submit(job, rows, variant, deadline)).outputs

    async def _submit(self, job: _Job, rows: int, variant: Hashable, deadline: float) -> _Job:
        pending: Pending[_Job] = Pending(
            job.spec.name, rows, variant, trio.current_time(), deadline, job
        )
        self._queues.enqueue(pending)
        self._work.set()
        try:
            await job.done.wait()
        finally:
            self._queues.withdraw(pending)
        if job.error is not None:
            raise job.error
        return job

    async def _execute_meta(
        self,
        spec: ModelSpec,
        inputs: Mapping[str, Tensor],
        rows: int,
        deadline: float,
        seen: list[BatchSeen] | None,
    ) -> tuple[Tensor, ...]:
        self._meta_inflight[spec.name] += 1
        try:
            compute = 0.0
            for sub in self.catalogue.submodels(spec):
                job = _Job(sub, {}, spec.name, internal=True, seen=seen)
                await self._submit(job, rows, _SUBCALL_VARIANT, deadline)
                compute += job.compute_seconds
            outputs = run_model(spec, inputs, rows)
        finally:
            self._meta_inflight[spec.name] -= 1
        # A meta counts one row per request whatever its inputs carry: it
        # reports no batch axis, and rows must then equal requests (the seed's
        # "Models with no batch axis, and metas").
        counters = self.counters[spec.name]
        counters.dispatch_count += 1
        counters.requests_served += 1
        counters.rows_served += 1
        counters.total_compute_seconds += compute
        counters.compute_request_seconds += compute
        executions, busy = counters.batches.get(1, (0, 0.0))
        counters.batches[1] = (executions + 1, busy + compute)
        return outputs

    # -- control (validated by the caller; run between batches) ---------------------

    async def set_residency(self, model: str, target: Residency) -> Residency:
        """Pin a routable model on the device (paying its load), or unpin it to `target`.

        Returns the model's residency afterwards.
        """
        await self._control(partial(self.memory.set_residency, model, target))
        return self.memory.residence(model).residency

    async def unload(self, model: str) -> None:
        """RepositoryModelUnload of a routable model; its queued requests then fail."""
        await self._control(partial(self.memory.unload, model))

    async def load(self, model: str, override: ModelSpec | None = None) -> None:
        """RepositoryModelLoad of a routable model (see `DeviceMemory.load`).

        With `override` (the same model, configured otherwise), the model serves as
        that from now on; without, as its catalogue entry says again.
        """

        async def action() -> None:
            await self.memory.load(model)
            if override is None:
                self._overridden.pop(model, None)
                spec = self.catalogue.get(model)
                assert spec is not None
            else:
                self._overridden[model] = spec = override
            self._max_batch[model] = spec.max_batch_size
            self._set_policy(spec)

        await self._control(action)

    async def compact(self, reload: Iterable[str]) -> tuple[int, int]:
        """CompactMemory (see `DeviceMemory.compact`): (models reloaded, resident bytes)."""
        requested = list(dict.fromkeys(reload))
        outcome: list[tuple[int, int]] = []

        async def action() -> None:
            outcome.append(await self.memory.compact(requested))

        await self._control(action)
        return outcome[0]

    async def _control(self, action: Callable[[], Awaitable[None]]) -> None:
        command = _Command(action)
        self._commands.append(command)
        self._work.set()
        await command.done.wait()
        if command.error is not None:
            raise command.error

    # -- the dispatch loop ----------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The dispatch loop: runs until cancelled; then fails what is still queued."""
        task_status.started()
        try:
            while True:
                await self._drain_commands()
                policies = self._policies
                batch = self._queues.next_batch(self._max_batch, trio.current_time(), policies)
                if batch is None:
                    if not self._commands:
                        # A new request, a command, or a held batch's delay running out.
                        with trio.move_on_at(self._queues.wake_at(policies)):
                            await self._work.wait()
                        if self._work.is_set():
                            self._work = trio.Event()
                    continue
                for pending in batch.expired:
                    self._fail(pending, _expired(pending))
                if batch.requests:
                    await self._run(batch)
        finally:
            shutting_down = GrpcError(StatusCode.UNAVAILABLE, "worker is shutting down")
            for pending in self._queues.drain():
                self._fail(pending, shutting_down)
            while self._commands:
                command = self._commands.popleft()
                command.error = shutting_down
                command.done.set()

    def _set_policy(self, spec: ModelSpec) -> None:
        """`spec`'s dynamic batching in the device's time (delays scale as costs do)."""
        if spec.max_queue_delay_seconds > 0 and spec.max_batch_size > 0:
            self._policies[spec.name] = BatchPolicy(
                spec.max_queue_delay_seconds * self.time_scale, spec.preferred_batch_size
            )
        else:
            self._policies.pop(spec.name, None)

    async def _drain_commands(self) -> None:
        while self._commands:
            command = self._commands[0]
            try:
                await command.action()
            except Exception as exc:  # reported to the control call, not fatal to the device
                command.error = exc
            self._commands.popleft()
            command.done.set()

    async def _run(self, batch: Batch[_Job]) -> None:
        spec = self._overridden.get(batch.model) or self.catalogue.get(batch.model)
        assert spec is not None
        if self.memory.unloaded and not (batch := self._without_unloaded(batch)).requests:
            return
        started, loads = trio.current_time(), self.memory.counters.loads
        if not await self.memory.make_resident(spec):
            # Unpinned while these waited: they never run (and never count).
            for pending in batch.requests:
                assert pending.payload is not None
                self._fail(pending, not_resident(pending.payload.route))
            return
        rows = batch.rows
        counters = self.counters[batch.model]
        for pending in batch.requests:
            counters.queue_waits.append(started - pending.enqueued_at)
            counters.queue_seconds += started - pending.enqueued_at
        counters.queue_wait_count += len(batch.requests)
        seconds = spec.execution_seconds(rows) * self.time_scale
        # The compute starts once the weights are on the device, if the batch loaded them.
        computing = started if self.memory.counters.loads == loads else trio.current_time()
        await trio.sleep(seconds)
        counters.dispatch_count += 1
        counters.requests_served += len(batch.requests)
        counters.rows_served += rows
        counters.total_compute_seconds += seconds
        counters.compute_request_seconds += seconds * len(batch.requests)
        executions, busy = counters.batches.get(rows, (0, 0.0))
        counters.batches[rows] = (executions + 1, busy + seconds)
        self.busy_seconds += seconds
        # The scheduler learns the simulated (scaled) time, the same seconds the
        # counters report, so the fair split it steers is the one they show.
        ended = trio.current_time()
        self._queues.record(batch.model, rows, seconds, ended)
        for pending in batch.requests:
            job = pending.payload
            assert job is not None
            job.compute_seconds = (
                seconds * pending.rows / rows if rows else seconds / len(batch.requests)
            )
            if job.seen is not None:
                moments = (pending.enqueued_at, started, computing, ended)
                job.seen.append(BatchSeen(*moments, len(batch.requests), rows))
            if not job.internal:
                self._compute(spec, job, pending.rows)
            job.done.set()

    def _without_unloaded(self, batch: Batch[_Job]) -> Batch[_Job]:
        """`batch` less the requests of models unloaded while they waited (those fail)."""
        unloaded = self.memory.unloaded
        kept = []
        for pending in batch.requests:
            assert pending.payload is not None
            if pending.payload.route in unloaded:
                self._fail(pending, unloaded_model(pending.payload.route))
            else:
                kept.append(pending)
        return dataclasses.replace(batch, requests=tuple(kept))

    @staticmethod
    def _compute(spec: ModelSpec, job: _Job, rows: int) -> None:
        try:
            job.outputs = run_model(spec, job.inputs, rows)
        except RsgwError as exc:
            job.error = exc
        except Exception as exc:  # a bug in a compute function: fail this request only
            logger.exception("model %s failed to compute", spec.name)
            job.error = GrpcError(StatusCode.INTERNAL, f"model {spec.name} failed: {exc}")

    @staticmethod
    def _fail(pending: Pending[_Job], error: Exception) -> None:
        job = pending.payload
        assert job is not None
        job.error = error
        job.done.set()


def _check_version_string(version: str) -> None:
    """Triton's refusals of a version that is not a positive integer (INVALID_ARGUMENT)."""
    try:
        number = int(version)
    except ValueError:
        raise InvalidRequest(
            f"failed to get model version from specified version string '{version}' "
            "(details: not an integer), version should be an integral value > 0"
        ) from None
    if number < 0:
        raise InvalidRequest(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )


def _expired(pending: Pending[_Job]) -> GrpcError:
    model = pending.model if pending.payload is None else pending.payload.route
    return GrpcError(
        StatusCode.DEADLINE_EXCEEDED,
        f"deadline exceeded before model '{model}' could run the request",
    )
