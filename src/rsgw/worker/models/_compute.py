"""What a simulated model computes: real results for the Triton examples, zeros for the rest.

Pure: no I/O, no clock, no logging. Time is the scheduler's business (the cost
model in `ModelSpec.execution_seconds`); this module only turns input tensors
into output tensors, so Triton's example clients, which check the numbers they
get back, run against the simulated worker unchanged.

The functions work on one request's tensors. They use the `array` module on the
raw little-endian bytes: for the 16-element tensors of the examples that costs a
couple of microseconds, and the worker keeps no numpy dependency.
"""

from __future__ import annotations

import hashlib
import math
import re
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rsgw.base._errors import InvalidRequest
from rsgw.worker.models._specs import SEQUENCE_STATE
from rsgw.worker.models._tensors import (
    DATATYPE_SIZES,
    FLOAT_TYPECODES,
    INT_TYPECODES,
    Tensor,
    array_to_le,
    decode_bytes_elements,
    element_count,
    encode_bytes_elements,
    floats_from_le,
    format_shape,
    int_tensor,
    ints_from_le,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from rsgw.worker.models._specs import ModelSpec

# Signed integers are added as the unsigned type of the same width: two's
# complement makes the bytes of the wrapped result identical, and one masked
# Python-int operation then serves every integer type.
_UNSIGNED_TWIN: dict[str, str] = {
    "INT8": "UINT8",
    "INT16": "UINT16",
    "INT32": "UINT32",
    "INT64": "UINT64",
    "UINT8": "UINT8",
    "UINT16": "UINT16",
    "UINT32": "UINT32",
    "UINT64": "UINT64",
}

# Strictly ASCII digits with an optional sign: `int()` alone would also take
# whitespace, underscores and non-ASCII digits, which no Triton client sends.
_DECIMAL = re.compile(rb"[+-]?[0-9]+")


def _inputs_in_order(spec: ModelSpec, inputs: Mapping[str, Tensor]) -> list[Tensor]:
    """The request's tensors in the order the spec declares its inputs."""
    ordered: list[Tensor] = []
    for declared in spec.inputs:
        tensor = inputs.get(declared.name)
        if tensor is None:
            raise InvalidRequest(f"model '{spec.name}': missing input '{declared.name}'")
        ordered.append(tensor)
    return ordered


def _same_shape(spec: ModelSpec, a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape:
        raise InvalidRequest(
            f"model '{spec.name}': input '{b.name}' shape {format_shape(b.shape)} must equal "
            f"input '{a.name}' shape {format_shape(a.shape)}"
        )


def _add_sub(spec: ModelSpec, inputs: Mapping[str, Tensor], rows: int) -> tuple[Tensor, ...]:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, elementwise in the input datatype."""
    a, b = _inputs_in_order(spec, inputs)
    _same_shape(spec, a, b)
    total: array[int] | array[float]
    diff: array[int] | array[float]
    twin = _UNSIGNED_TWIN.get(a.datatype)
    if twin is not None:
        x = ints_from_le(twin, a.data)
        y = ints_from_le(twin, b.data)
        mask = (1 << (8 * DATATYPE_SIZES[twin])) - 1
        code = INT_TYPECODES[twin]
        total = array(code, [(p + q) & mask for p, q in zip(x, y, strict=True)])
        diff = array(code, [(p - q) & mask for p, q in zip(x, y, strict=True)])
    else:
        # FP32/FP64: Python adds in double precision and `array('f')` rounds once
        # to float32; double rounding is harmless for + and - (53 >= 2*24 + 2), so
        # the results match float32 arithmetic, overflow to inf included.
        u = floats_from_le(a.datatype, a.data)
        v = floats_from_le(a.datatype, b.data)
        fcode = FLOAT_TYPECODES[a.datatype]
        total = array(fcode, [p + q for p, q in zip(u, v, strict=True)])
        diff = array(fcode, [p - q for p, q in zip(u, v, strict=True)])
    out0, out1 = spec.outputs
    return (
        Tensor(out0.name, a.datatype, a.shape, array_to_le(total)),
        Tensor(out1.name, a.datatype, a.shape, array_to_le(diff)),
    )


def _parse_decimals(spec: ModelSpec, tensor: Tensor) -> list[int]:
    values: list[int] = []
    for i, item in enumerate(decode_bytes_elements(tensor.data, element_count(tensor.shape))):
        if _DECIMAL.fullmatch(item) is None:
            raise InvalidRequest(
                f"model '{spec.name}' input '{tensor.name}': element {i} must be a decimal "
                f"integer, got {item[:32]!r}"
            )
        try:
            values.append(int(item))
        except ValueError as exc:  # more digits than sys.get_int_max_str_digits()
            raise InvalidRequest(
                f"model '{spec.name}' input '{tensor.name}': element {i} has too many digits "
                f"({len(item)})"
            ) from exc
    return values


def _add_sub_string(spec: ModelSpec, inputs: Mapping[str, Tensor], rows: int) -> tuple[Tensor, ...]:
    """The add_sub of decimal strings: sum and difference as decimal strings.

    The integers are unbounded (Python ints), so nothing wraps; Triton's
    example client only sends small numbers, which both agree on.
    """
    a, b = _inputs_in_order(spec, inputs)
    _same_shape(spec, a, b)
    x = _parse_decimals(spec, a)
    y = _parse_decimals(spec, b)
    total = encode_bytes_elements([str(p + q).encode() for p, q in zip(x, y, strict=True)])
    diff = encode_bytes_elements([str(p - q).encode() for p, q in zip(x, y, strict=True)])
    out0, out1 = spec.outputs
    return (
        Tensor(out0.name, "BYTES", a.shape, total),
        Tensor(out1.name, "BYTES", a.shape, diff),
    )


def _identity(spec: ModelSpec, inputs: Mapping[str, Tensor], rows: int) -> tuple[Tensor, ...]:
    """Each output is the input at the same position, shape and bytes unchanged."""
    ordered = _inputs_in_order(spec, inputs)
    return tuple(
        Tensor(out.name, t.datatype, t.shape, t.data)
        for out, t in zip(spec.outputs, ordered, strict=True)
    )


def _synthetic(spec: ModelSpec, inputs: Mapping[str, Tensor], rows: int) -> tuple[Tensor, ...]:
    """Zeros (empty strings for BYTES) of the declared shape, every -1 made `rows`.

    The stand-in for GPU-shaped models whose numbers nobody checks: the cost
    model carries their behaviour, and zeros are the cheapest honest bytes.
    """
    outputs: list[Tensor] = []
    for out in spec.outputs:
        shape = tuple(rows if d == -1 else d for d in out.shape)
        count = element_count(shape)
        if out.datatype == "BYTES":
            data = encode_bytes_elements([b""]) * count
        else:
            data = bytes(count * DATATYPE_SIZES[out.datatype])
        outputs.append(Tensor(out.name, out.datatype, shape, data))
    return tuple(outputs)


def _control(inputs: Mapping[str, Tensor], name: str) -> int:
    """A control input's value: START, END, READY as 0/1, CORRID as an integer.

    A string correlation id counts as the integer it spells, 0 if it spells none
    (Triton's dyna_sequence backend reads it the same way).
    """
    tensor = inputs.get(name)
    if tensor is None:
        return 0
    if tensor.datatype == "BYTES":
        (text,) = decode_bytes_elements(tensor.data, 1)
        return int(text) if _DECIMAL.fullmatch(text) else 0
    return int(ints_from_le(tensor.datatype, tensor.data)[0])


def _sequence_sum(spec: ModelSpec, inputs: Mapping[str, Tensor], rows: int) -> tuple[Tensor, ...]:
    """Triton's simple_sequence models: OUTPUT = INPUT + START, plus CORRID at END.

    Each element of INPUT (INT32) gets 1 added on the first request of a sequence,
    and the correlation id added on the last (models that receive END and CORRID).
    """
    (value,) = _inputs_in_order(spec, inputs)
    extra = _control(inputs, "START")
    if _control(inputs, "END"):
        extra += _control(inputs, "CORRID")
    out = array(
        INT_TYPECODES["INT32"], [_wrap32(x + extra) for x in ints_from_le("INT32", value.data)]
    )
    return (Tensor(spec.outputs[0].name, "INT32", value.shape, array_to_le(out)),)


def _sequence_accumulate(
    spec: ModelSpec, inputs: Mapping[str, Tensor], rows: int
) -> tuple[Tensor, ...]:
    """Triton's dyna_sequence backend: an INT32 accumulator per sequence.

    START sets it to the sum of INPUT, every later request adds that sum, END adds
    the correlation id; OUTPUT is the accumulator in every element. The state goes
    out (and comes back in with the next request) as `SEQUENCE_STATE`.
    """
    (value,) = _inputs_in_order(spec, inputs)
    total = sum(ints_from_le("INT32", value.data))
    if not _control(inputs, "START"):
        total += _control(inputs, SEQUENCE_STATE)
    if _control(inputs, "END"):
        total += _control(inputs, "CORRID")
    total = _wrap32(total)
    return (
        int_tensor(
            spec.outputs[0].name, "INT32", value.shape, [total] * element_count(value.shape)
        ),
        int_tensor(SEQUENCE_STATE, "INT32", (1,), [total]),
    )


@dataclass(frozen=True, slots=True)
class Repeats:
    """What a decoupled `repeat` request answers: responses after delays, then a wait.

    `responses` are (seconds to wait before it, its output tensors), in order;
    `final_wait` is the time after the last before the request is complete.
    """

    responses: tuple[tuple[float, tuple[Tensor, ...]], ...]
    final_wait: float


def repeat_responses(spec: ModelSpec, inputs: Mapping[str, Tensor]) -> Repeats:
    """Triton's repeat backend: one response per element of IN, each after its DELAY.

    Response i carries OUT = [IN[i]] and IDX = [i] (INT32, UINT32), sent DELAY[i]
    milliseconds after the one before; WAIT milliseconds after the last, the
    request completes. An empty IN answers nothing but the completion.
    """
    values = ints_from_le("INT32", inputs["IN"].data)
    delays = ints_from_le("UINT32", inputs["DELAY"].data)
    if len(delays) != len(values):
        raise InvalidRequest(
            f"model '{spec.name}': DELAY must have one element per element of IN "
            f"({len(values)}), got {len(delays)}"
        )
    (wait,) = ints_from_le("UINT32", inputs["WAIT"].data) or (0,)
    out, idx = spec.outputs
    responses = tuple(
        (
            delay / 1000.0,
            (
                int_tensor(out.name, "INT32", (1,), [value]),
                int_tensor(idx.name, "UINT32", (1,), [i]),
            ),
        )
        for i, (value, delay) in enumerate(zip(values, delays, strict=True))
    )
    return Repeats(responses, wait / 1000.0)


def _classifier(spec: ModelSpec, inputs: Mapping[str, Tensor], rows: int) -> tuple[Tensor, ...]:
    """A deterministic stand-in for an image classifier: a softmax that depends on the input.

    Each batch row of the first input (FP32 pixels, or BYTES holding an encoded
    image) is hashed; the hash sets a phase, and the class scores are a softmax
    over cosines of it, so a given image always gets the same classes and
    different images get different ones. No real vision happens: the cost model
    carries the GPU time, and the numbers only have to be honest probabilities.
    """
    (out,) = spec.outputs
    first = inputs[spec.inputs[0].name]
    width = next(d for d in out.shape if d != -1)
    per_row = len(first.data) // rows if rows else 0
    scores: list[float] = []
    for row in range(max(rows, 1)):
        digest = hashlib.blake2b(first.data[row * per_row : (row + 1) * per_row], digest_size=8)
        phase = int.from_bytes(digest.digest(), "little") / 2**64 * math.tau
        logits = [4.0 * math.cos(phase * (i + 1) + i) for i in range(width)]
        top = max(logits)
        weights = [math.exp(v - top) for v in logits]
        total = sum(weights)
        scores.extend(w / total for w in weights)
    shape = tuple(rows if d == -1 else d for d in out.shape)
    data = array_to_le(array(FLOAT_TYPECODES["FP32"], scores))
    return (Tensor(out.name, "FP32", shape, data),)


def _nothing(spec: ModelSpec, inputs: Mapping[str, Tensor], rows: int) -> tuple[Tensor, ...]:
    """A decoupled model's device work: its responses come from `repeat_responses`."""
    return ()


def _wrap32(value: int) -> int:
    """`value` as INT32 arithmetic leaves it (two's complement wrap-around)."""
    return (value + 2**31) % 2**32 - 2**31


_COMPUTE: dict[str, Callable[[ModelSpec, Mapping[str, Tensor], int], tuple[Tensor, ...]]] = {
    "add_sub": _add_sub,
    "add_sub_string": _add_sub_string,
    "identity": _identity,
    "synthetic": _synthetic,
    "sequence_sum": _sequence_sum,
    "sequence_accumulate": _sequence_accumulate,
    "repeat": _nothing,
    "classifier": _classifier,
}


def run_model(spec: ModelSpec, inputs: Mapping[str, Tensor], rows: int) -> tuple[Tensor, ...]:
    """Compute one request's outputs, in the order `spec.outputs` declares them.

    The caller has already checked the inputs against the spec (`check_input`);
    we only re-check what the computation itself needs.

    Args:
        spec: the model.
        inputs: the request's tensors by input name.
        rows: the request's batch rows (`rows(shape, spec.batch_axis)` of its
            batch input); synthetic outputs use it for every -1 dim.

    Raises:
        InvalidRequest: a missing input, add_sub inputs of different shapes, or
            an add_sub_string element that is not a decimal integer.
    """
    return _COMPUTE[spec.compute](spec, inputs, rows)
