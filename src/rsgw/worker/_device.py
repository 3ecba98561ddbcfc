"""The simulated GPU: one dispatch loop executing one coalesced batch at a time.

A batch of R rows of model m occupies the device for
`(launch_seconds + item_seconds * R) * time_scale` seconds, so batching pays off
as it does on a real GPU: the launch cost is shared by every request in the
batch. Outputs are computed for real, per request, when the batch completes.

Counters follow REFERENCE.md §8.2 and are cumulative since start: per dispatch
`dispatch_count += 1`, `requests_served += requests`, `rows_served += rows`,
`total_compute_seconds += the (scaled) execution time`.

Cancellation: a caller cancelled while its request waits withdraws it from the
queue; one cancelled while its batch executes simply stops waiting (a GPU kernel
is not interrupted), and the batch is still counted.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from rsgw._errors import RsgwError
from rsgw.grpc._status import GrpcError, StatusCode
from rsgw.worker._batching import Batch, Discipline, Pending, RequestQueues
from rsgw.worker._compute import run_model

if TYPE_CHECKING:
    from collections.abc import Hashable, Mapping

    from rsgw.worker._catalogue import Catalogue, ModelSpec
    from rsgw.worker._tensors import Tensor

logger = logging.getLogger(__name__)

#: Queue-wait samples kept per model for the p50/p99 gauges.
_WAIT_SAMPLES = 1024


@dataclass(slots=True)
class ModelCounters:
    """Cumulative per-model figures, as ModelControlStatus reports them."""

    dispatch_count: int = 0
    requests_served: int = 0
    rows_served: int = 0
    total_compute_seconds: float = 0.0
    queue_waits: deque[float] = field(default_factory=lambda: deque(maxlen=_WAIT_SAMPLES))


@dataclass(slots=True, eq=False)
class _Job:
    """The shell's half of a queued request: inputs in, outputs or error out."""

    spec: ModelSpec
    inputs: Mapping[str, Tensor]
    done: trio.Event = field(default_factory=trio.Event)
    outputs: tuple[Tensor, ...] = ()
    error: Exception | None = None


class Device:
    """One simulated GPU with per-model queues.

    Run `serve` in a nursery; call `execute` from request handlers.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        time_scale: float = 1.0,
        discipline: Discipline = Discipline.FIFO,
    ) -> None:
        self.catalogue = catalogue
        self.time_scale = time_scale
        self.discipline = discipline
        self.counters: dict[str, ModelCounters] = {
            m.name: ModelCounters() for m in catalogue.models
        }
        self._max_batch = {m.name: m.max_batch_size for m in catalogue.models}
        self._queues: RequestQueues[_Job] = RequestQueues(discipline)
        self._work = trio.Event()
        self.busy_seconds = 0.0

    def queue_depth(self, model: str) -> int:
        return self._queues.depth(model)

    async def execute(
        self,
        spec: ModelSpec,
        inputs: Mapping[str, Tensor],
        *,
        rows: int,
        variant: Hashable,
        deadline: float = math.inf,
    ) -> tuple[Tensor, ...]:
        """Queue one request, wait for its batch to run, return its outputs.

        Raises:
            GrpcError: DEADLINE_EXCEEDED when `deadline` passed before the batch
                started (the request never ran).
            RsgwError: the model rejected the request's values.
        """
        job = _Job(spec, inputs)
        pending: Pending[_Job] = Pending(
            spec.name, rows, variant, trio.current_time(), deadline, job
        )
        self._queues.enqueue(pending)
        self._work.set()
        try:
            await job.done.wait()
        finally:
            self._queues.withdraw(pending)
        if job.error is not None:
            raise job.error
        return job.outputs

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The dispatch loop: runs until cancelled; then fails what is still queued."""
        task_status.started()
        try:
            while True:
                batch = self._queues.next_batch(self._max_batch, trio.current_time())
                if batch is None:
                    await self._work.wait()
                    self._work = trio.Event()
                    continue
                for pending in batch.expired:
                    self._fail(pending, _expired(pending))
                if batch.requests:
                    await self._run(batch)
        finally:
            for pending in self._queues.drain():
                self._fail(pending, GrpcError(StatusCode.UNAVAILABLE, "worker is shutting down"))

    async def _run(self, batch: Batch[_Job]) -> None:
        spec = self.catalogue.get(batch.model)
        assert spec is not None
        rows = batch.rows
        started = trio.current_time()
        counters = self.counters[batch.model]
        for pending in batch.requests:
            counters.queue_waits.append(started - pending.enqueued_at)
        seconds = spec.execution_seconds(rows) * self.time_scale
        await trio.sleep(seconds)
        counters.dispatch_count += 1
        counters.requests_served += len(batch.requests)
        counters.rows_served += rows
        counters.total_compute_seconds += seconds
        self.busy_seconds += seconds
        for pending in batch.requests:
            job = pending.payload
            assert job is not None
            try:
                job.outputs = run_model(spec, job.inputs, pending.rows)
            except RsgwError as exc:
                job.error = exc
            except Exception as exc:  # a bug in a compute function: fail this request only
                logger.exception("model %s failed to compute", spec.name)
                job.error = GrpcError(StatusCode.INTERNAL, f"model {spec.name} failed: {exc}")
            job.done.set()

    @staticmethod
    def _fail(pending: Pending[_Job], error: Exception) -> None:
        job = pending.payload
        assert job is not None
        job.error = error
        job.done.set()


def _expired(pending: Pending[_Job]) -> GrpcError:
    return GrpcError(
        StatusCode.DEADLINE_EXCEEDED,
        f"deadline exceeded before model '{pending.model}' could run the request",
    )
