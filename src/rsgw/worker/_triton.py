"""The worker's catalogue and counters as Triton reports them: ModelConfig, ModelStatistics.

Pure: a catalogue entry (and the device's counters) in, Triton's messages out, so
`tritonclient`'s `get_model_config` and `get_inference_statistics` read the
simulated worker as they read a Triton server.

How the catalogue maps onto Triton's model configuration:
- Triton's batch dimension is implicit and first. A model whose batch axis is the
  first dimension of its batch input reports `max_batch_size` and the dimensions
  after it; any other model (no batch axis, or the axis elsewhere, as our image
  model's last axis) reports `max_batch_size: 0` and its full shapes, which is
  the truthful Triton description of it.
- Batching models get `dynamic_batching` (the device coalesces requests), stateful
  ones `sequence_batching` with their control inputs and idle time instead; every
  model runs as one instance of kind KIND_GPU on the worker's GPU.
- BYTES tensors are Triton's TYPE_STRING.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import InvalidRequest
from rsgw.worker.models._specs import ModelKind

if TYPE_CHECKING:
    from rsgw.worker.device._counters import ModelCounters
    from rsgw.worker.models._specs import ModelSpec, SequenceSpec, TensorSpec

_NS = 1_000_000_000


def data_type(datatype: str) -> str:
    """The name of Triton's `DataType` for a KServe V2 datatype name."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def batches_first(spec: ModelSpec) -> bool:
    """Whether Triton's implicit leading batch dimension describes the model."""
    return spec.max_batch_size > 0 and spec.batch_axis == 1


def _dims(tensor: TensorSpec, batched: bool) -> list[int]:
    return list(tensor.shape[1:] if batched and tensor.shape else tensor.shape)


def model_config(spec: ModelSpec, gpu: str) -> pb.ModelConfig:
    """Triton's configuration of a catalogue model on the GPU `gpu`."""
    batched = batches_first(spec)
    config = pb.ModelConfig(
        name=spec.name,
        platform=spec.platform,
        max_batch_size=spec.max_batch_size if batched else 0,
        input=[
            pb.ModelInput(
                name=t.name,
                data_type=data_type(t.datatype),
                dims=_dims(t, batched),
                format=f"FORMAT_{t.format or 'NONE'}",
            )
            for t in spec.inputs
        ],
        output=[
            pb.ModelOutput(
                name=t.name,
                data_type=data_type(t.datatype),
                dims=_dims(t, batched),
                label_filename=t.labels,
            )
            for t in spec.outputs
        ],
    )
    if spec.kind is ModelKind.ENSEMBLE:
        config.platform = "ensemble"
        for step in spec.submodels:
            config.ensemble_scheduling.step.add(model_name=step, model_version=-1)
    # One scheduler per model (a oneof in Triton's config): the ensemble's steps (set
    # above), the sequence batcher, or the dynamic batcher.
    if spec.sequence is not None:
        _sequence_batching(config.sequence_batching, spec.sequence)
    elif batched and spec.kind is not ModelKind.ENSEMBLE:
        config.dynamic_batching.SetInParent()
        config.dynamic_batching.preferred_batch_size.extend(spec.preferred_batch_size)
        config.dynamic_batching.max_queue_delay_microseconds = round(
            spec.max_queue_delay_seconds * 1e6
        )
    group = config.instance_group.add(
        name=f"{spec.name}_0", kind=pb.ModelInstanceGroup.KIND_GPU, count=1
    )
    if gpu.isdigit():
        group.gpus.append(int(gpu))
    if spec.decoupled:
        config.model_transaction_policy.decoupled = True
    config.version_policy.latest.num_versions = 1
    return config


_CONTROL_KINDS = {
    "START": pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START,
    "END": pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END,
    "READY": pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY,
    "CORRID": pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID,
}


def _sequence_batching(batching: pb.ModelSequenceBatching, sequence: SequenceSpec) -> None:
    batching.max_sequence_idle_microseconds = round(sequence.idle_seconds * 1_000_000)
    for name in sequence.controls:
        control = batching.control_input.add(name=name).control.add(kind=_CONTROL_KINDS[name])
        if name == "CORRID":
            control.data_type = pb.DataType.Value(data_type(sequence.corrid_datatype))  # type: ignore[assignment]  # the stubs type the field by its enum class
        else:
            control.int32_false_true.extend([0, 1])


#: What a RepositoryModelLoad `config` may change on a simulated model.
OVERRIDABLE = ("max_batch_size",)


def config_override(spec: ModelSpec, text: str) -> ModelSpec:
    """`spec` as a RepositoryModelLoad `config` parameter (Triton's JSON) configures it.

    A simulated model's tensors and computation are its catalogue's, so only what
    the device can honour may change: `max_batch_size` (a number or a decimal
    string, as protobuf's JSON has it). `name`, if given, must be the model's own.
    An empty object changes nothing.

    Raises:
        InvalidRequest: not a JSON object, an unknown or unchangeable key, a bad
            value; every message starts "failed to load '<model>'", as Triton's.
    """
    prefix = f"failed to load '{spec.name}'"
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"{prefix}: the config parameter is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise InvalidRequest(f"{prefix}: the config parameter must be a JSON object")
    changes: dict[str, int] = {}
    for key, value in config.items():
        if key == "name" and value == spec.name:
            continue
        if key not in OVERRIDABLE:
            raise InvalidRequest(
                f"{prefix}: a simulated model's configuration may override "
                f"{', '.join(OVERRIDABLE)} only, got {key!r}"
            )
        number = _whole_number(value)
        if number is None or number < 0:
            raise InvalidRequest(f"{prefix}: max_batch_size must be an integer >= 0, got {value!r}")
        if number > 0 and not batches_first(dataclasses.replace(spec, max_batch_size=1)):
            raise InvalidRequest(
                f"{prefix}: the model has no leading batch dimension to batch along"
            )
        changes[key] = number
    return dataclasses.replace(spec, **changes) if changes else spec  # type: ignore[arg-type]


def _whole_number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _duration(count: int, seconds: float) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=count, ns=round(seconds * _NS))


def model_statistics(
    spec: ModelSpec, counters: ModelCounters, gpu: str, weight_bytes: int
) -> pb.ModelStatistics:
    """Triton's statistics of one model from the device's and the service's counters.

    Durations are the simulated device seconds (scaled by --time-scale) for queue and
    compute, and wall seconds for a request's success or failure, as /metrics has them.
    The memory usage is the model's weights on its GPU, as Triton reports a loaded
    model's (`weight_bytes`, its sub-models' for a meta).
    """
    served = counters.requests_served
    stats = pb.ModelStatistics(
        name=spec.name,
        version=spec.version,
        last_inference=counters.last_inference_ms,
        inference_count=counters.rows_served,
        execution_count=counters.dispatch_count,
    )
    if weight_bytes > 0:
        device = int(gpu) if gpu.isdigit() else 0
        stats.memory_usage.add(type="GPU", id=device, byte_size=weight_bytes)
    inference = stats.inference_stats
    inference.success.CopyFrom(_duration(*counters.success))
    inference.fail.CopyFrom(_duration(*counters.fail))
    inference.queue.CopyFrom(_duration(served, counters.queue_seconds))
    inference.compute_infer.CopyFrom(_duration(served, counters.compute_request_seconds))
    inference.compute_input.count = served
    inference.compute_output.count = served
    for size in sorted(counters.batches):
        executions, seconds = counters.batches[size]
        batch = stats.batch_stats.add(batch_size=size)
        batch.compute_infer.CopyFrom(_duration(executions, seconds))
        batch.compute_input.count = executions
        batch.compute_output.count = executions
    return stats
