"""Stateful models on the simulated device: Triton's sequence batcher, the shell half.

The book (`_sequences.SequenceBook`, pure) decides whether a request may run and
with what control values; this module runs it in order. Requests of one sequence
execute one at a time, in the order they arrived (a per-sequence lock, which
Trio hands over first come first served); requests of different sequences
batch together on the device as any requests do. The control inputs the model
declares (START, END, READY, CORRID) are added to the request's inputs, as
Triton's batcher adds them, and a model that keeps state gets its previous
value as `SEQUENCE_STATE` and returns the next one under that name.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from rsgw.base._errors import InvalidRequest
from rsgw.worker._sequences import CorrelationId, SequenceBook, SequenceStep
from rsgw.worker.models._specs import SEQUENCE_STATE
from rsgw.worker.models._tensors import Tensor, encode_bytes_elements, int_tensor, ints_from_le

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Hashable, Mapping

    from rsgw._proto import grpc_predict_v2_pb2 as pb
    from rsgw.worker.device._batching import BatchSeen
    from rsgw.worker.device._device import Device
    from rsgw.worker.models._specs import ModelSpec


class StatefulModels:
    """Runs the requests of stateful models in sequence order; see the module docstring."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.book = SequenceBook()
        self._locks: dict[tuple[str, CorrelationId], trio.Lock] = {}

    async def execute(
        self,
        spec: ModelSpec,
        parameters: Mapping[str, pb.InferParameter],
        inputs: Mapping[str, Tensor],
        *,
        rows: int,
        variant: Hashable,
        deadline: float,
        seen: list[BatchSeen] | None = None,
    ) -> tuple[Tensor, ...]:
        """Run one request of a sequence of `spec` (InvalidRequest if it may not); a
        traced one's batch is appended to `seen`."""
        assert spec.sequence is not None
        correlation_id, start, end = sequence_flags(parameters)
        if rows != 1:
            raise InvalidRequest(
                f"inference request to model '{spec.name}' must specify batch-size 1 due to "
                f"requirements of sequence batcher, got {rows}"
            )
        async with self._in_order((spec.name, correlation_id)):
            step = self.book.step(
                spec.name,
                correlation_id,
                start=start,
                end=end,
                now=trio.current_time(),
                idle_seconds=spec.sequence.idle_seconds,
            )
            given = {**inputs, **control_inputs(spec, step)}
            try:
                outputs = await self.device.execute(
                    spec, given, rows=rows, variant=variant, deadline=deadline, seen=seen
                )
            except BaseException:
                self.book.abandon(spec.name, step)
                raise
            state = next((t for t in outputs if t.name == SEQUENCE_STATE), None)
            value = None if state is None else int(ints_from_le("INT32", state.data)[0])
            self.book.finish(spec.name, step, value, now=trio.current_time())
            return tuple(t for t in outputs if t.name != SEQUENCE_STATE)

    def forget_model(self, model: str) -> None:
        """`model` was unloaded: its sequences are gone with it."""
        self.book.forget_model(model)

    @asynccontextmanager
    async def _in_order(self, key: tuple[str, CorrelationId]) -> AsyncIterator[None]:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = trio.Lock()
        async with lock:
            try:
                yield
            finally:
                # No checkpoint between here and the release: nobody can queue on
                # this lock after we look, so dropping it loses no waiter.
                if lock.statistics().tasks_waiting == 0:
                    self._locks.pop(key, None)


def sequence_flags(parameters: Mapping[str, pb.InferParameter]) -> tuple[CorrelationId, bool, bool]:
    """A request's correlation id and START/END flags, from Triton's request parameters."""
    correlation_id: CorrelationId = 0
    if "sequence_id" in parameters:
        value = parameters["sequence_id"]
        kind = value.WhichOneof("parameter_choice")
        if kind == "string_param":
            correlation_id = value.string_param
        elif kind in ("int64_param", "uint64_param"):
            correlation_id = getattr(value, kind)
        else:
            raise InvalidRequest(
                f"sequence_id must be an int64, uint64 or string parameter, got {kind}"
            )
    start = "sequence_start" in parameters and parameters["sequence_start"].bool_param
    end = "sequence_end" in parameters and parameters["sequence_end"].bool_param
    return correlation_id, start, end


def control_inputs(spec: ModelSpec, step: SequenceStep) -> dict[str, Tensor]:
    """The control tensors `spec` declares, for one request, and its state if it keeps one."""
    assert spec.sequence is not None
    shape = (1, 1) if spec.max_batch_size > 0 else (1,)
    flags = {"START": step.start, "END": step.end, "READY": True}
    tensors: dict[str, Tensor] = {}
    for name in spec.sequence.controls:
        if name == "CORRID":
            tensors[name] = _correlation_tensor(spec, step.correlation_id, shape)
        else:
            tensors[name] = int_tensor(name, "INT32", shape, [int(flags[name])])
    tensors[SEQUENCE_STATE] = int_tensor(SEQUENCE_STATE, "INT32", (1,), [step.accumulator])
    return tensors


def _correlation_tensor(spec: ModelSpec, value: CorrelationId, shape: tuple[int, ...]) -> Tensor:
    assert spec.sequence is not None
    if spec.sequence.corrid_datatype == "BYTES":
        return Tensor("CORRID", "BYTES", shape, encode_bytes_elements([str(value).encode()]))
    if isinstance(value, str):
        raise InvalidRequest(
            f"model '{spec.name}' takes unsigned integer correlation ids; got the string "
            f"'{value[:64]}'"
        )
    return int_tensor("CORRID", "UINT64", shape, [value % 2**64])
