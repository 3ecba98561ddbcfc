"""The compute kinds a catalogue entry may name, and the tensors each one needs.

Pure. The catalogue parser asks `check_compute` about every entry, so a model
whose `compute` cannot run on its declared tensors fails at start-up, naming the
key path, instead of on its first request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rsgw.base._errors import ConfigError
from rsgw.worker.models._tensors import DATATYPES, INTEGER_DATATYPES, format_shape

if TYPE_CHECKING:
    from rsgw.worker.models._specs import ModelSpec

# How each model computes its outputs (implemented in _compute.py).
COMPUTE_KINDS: tuple[str, ...] = (
    "add_sub",
    "add_sub_string",
    "identity",
    "synthetic",
    "sequence_sum",
    "sequence_accumulate",
    "repeat",
    "classifier",
)
#: The computes of stateful models: they need a `sequence:` block.
SEQUENCE_COMPUTES = frozenset({"sequence_sum", "sequence_accumulate"})

# add_sub works on every integer type (with wrap-around) and on FP32/FP64. FP16 is
# left out because the standard library has no FP16 array arithmetic, and BOOL
# because a sum of booleans is not a boolean.
ADD_SUB_DATATYPES: frozenset[str] = INTEGER_DATATYPES | {"FP32", "FP64"}


def _check_pair(spec: ModelSpec, where: str, datatypes: frozenset[str]) -> None:
    """add_sub and add_sub_string: two like inputs and two outputs just like them."""
    for key, tensors in (("inputs", spec.inputs), ("outputs", spec.outputs)):
        if len(tensors) != 2:
            raise ConfigError(
                f"{where}.{key}: compute {spec.compute!r} needs exactly 2 {key}, got {len(tensors)}"
            )
    first = spec.inputs[0]
    if first.datatype not in datatypes:
        allowed = ", ".join(d for d in DATATYPES if d in datatypes)
        raise ConfigError(
            f"{where}.inputs[0].datatype must be one of {allowed} for compute "
            f"{spec.compute!r}, got {first.datatype!r}"
        )
    for key, tensors in (("inputs", spec.inputs), ("outputs", spec.outputs)):
        for i, t in enumerate(tensors):
            if t.datatype != first.datatype:
                raise ConfigError(
                    f"{where}.{key}[{i}].datatype must be {first.datatype} (as inputs[0]) "
                    f"for compute {spec.compute!r}, got {t.datatype!r}"
                )
            if t.shape != first.shape:
                raise ConfigError(
                    f"{where}.{key}[{i}].shape must be {format_shape(first.shape)} (as inputs[0]) "
                    f"for compute {spec.compute!r}, got {format_shape(t.shape)}"
                )


def _check_classifier(spec: ModelSpec, where: str) -> None:
    """classifier: one FP32 output with one fixed (class) dim beside an optional -1."""
    if len(spec.outputs) != 1 or spec.outputs[0].datatype != "FP32":
        raise ConfigError(f"{where}.outputs: compute 'classifier' needs one FP32 output")
    fixed = [d for d in spec.outputs[0].shape if d != -1]
    if len(fixed) != 1 or len(spec.outputs[0].shape) - len(fixed) > 1:
        raise ConfigError(
            f"{where}.outputs[0].shape must be [classes] or [-1, classes] for compute "
            f"'classifier', got {format_shape(spec.outputs[0].shape)}"
        )


def check_compute(spec: ModelSpec, where: str) -> None:
    """Check that `spec.compute` can produce the declared outputs from the declared inputs."""
    if spec.decoupled and spec.compute != "repeat":
        raise ConfigError(
            f"{where}.decoupled: a decoupled model computes 'repeat', got {spec.compute!r}"
        )
    if spec.compute == "add_sub":
        _check_pair(spec, where, ADD_SUB_DATATYPES)
    elif spec.compute == "add_sub_string":
        _check_pair(spec, where, frozenset({"BYTES"}))
    elif spec.compute == "classifier":
        _check_classifier(spec, where)
    elif spec.compute == "repeat":
        _check_repeat(spec, where)
    elif spec.compute in SEQUENCE_COMPUTES:
        _check_sequence_compute(spec, where)
    elif spec.compute == "identity":
        if len(spec.outputs) != len(spec.inputs):
            raise ConfigError(
                f"{where}.outputs: compute 'identity' needs one output per input "
                f"({len(spec.inputs)}), got {len(spec.outputs)}"
            )
        for i, (inp, out) in enumerate(zip(spec.inputs, spec.outputs, strict=True)):
            if (out.datatype, out.shape) != (inp.datatype, inp.shape):
                raise ConfigError(
                    f"{where}.outputs[{i}] must be {inp.datatype} {format_shape(inp.shape)} "
                    f"(as inputs[{i}]) for compute 'identity', "
                    f"got {out.datatype} {format_shape(out.shape)}"
                )


#: Triton's repeat backend's tensors: (name, datatype, shape).
_REPEAT_INPUTS = (("IN", "INT32", (-1,)), ("DELAY", "UINT32", (-1,)), ("WAIT", "UINT32", (1,)))
_REPEAT_OUTPUTS = (("OUT", "INT32", (1,)), ("IDX", "UINT32", (1,)))


def _check_repeat(spec: ModelSpec, where: str) -> None:
    """repeat: Triton's repeat backend's tensors exactly, and decoupled."""
    if not spec.decoupled:
        raise ConfigError(f"{where}.decoupled must be true for compute 'repeat'")
    for key, tensors, wanted in (
        ("inputs", spec.inputs, _REPEAT_INPUTS),
        ("outputs", spec.outputs, _REPEAT_OUTPUTS),
    ):
        got = tuple((t.name, t.datatype, t.shape) for t in tensors)
        if got != wanted:
            expected = ", ".join(f"{n} {d} {format_shape(s)}" for n, d, s in wanted)
            raise ConfigError(f"{where}.{key} must be {expected} for compute 'repeat'")


def _check_sequence_compute(spec: ModelSpec, where: str) -> None:
    """sequence_sum and sequence_accumulate: one INT32 input, one INT32 output alike."""
    if spec.sequence is None:
        raise ConfigError(f"{where}.sequence is required for compute {spec.compute!r}")
    if len(spec.inputs) != 1 or len(spec.outputs) != 1:
        raise ConfigError(
            f"{where}: compute {spec.compute!r} needs one input and one output, got "
            f"{len(spec.inputs)} and {len(spec.outputs)}"
        )
    (inp,), (out,) = spec.inputs, spec.outputs
    if inp.datatype != "INT32" or (out.datatype, out.shape) != (inp.datatype, inp.shape):
        raise ConfigError(
            f"{where}: compute {spec.compute!r} needs an INT32 input and an INT32 output of "
            f"its shape, got {inp.datatype} {format_shape(inp.shape)} and "
            f"{out.datatype} {format_shape(out.shape)}"
        )
