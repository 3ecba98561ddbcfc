"""Triton's classification extension: an output answered as its top classes.

Pure. A client asks for it per requested output (`parameters["classification"]`,
an int64 k); instead of the tensor it gets, per batch row, the k largest
elements as BYTES strings `"<value>:<index>"`, followed by `":<label>"` when the
output has a label file. Values print as C++'s `std::to_string` prints them
(six decimals for floating point), so clients that parse Triton's strings read
ours the same way. Ties keep index order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rsgw.base._errors import InvalidRequest
from rsgw.worker.models._tensors import (
    FLOAT_TYPECODES,
    INT_TYPECODES,
    Tensor,
    element_count,
    encode_bytes_elements,
    floats_from_le,
    ints_from_le,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rsgw._proto import grpc_predict_v2_pb2 as pb

#: The parameter of a requested output that asks for its top classes.
CLASSIFICATION = "classification"
#: Triton refuses to rank larger outputs (pathological memory and CPU).
MAX_ELEMENTS = 1_000_000


def requested_classes(name: str, parameters: Mapping[str, pb.InferParameter]) -> int:
    """How many classes a requested output asks for (0: the tensor itself)."""
    if CLASSIFICATION not in parameters:
        return 0
    value = parameters[CLASSIFICATION]
    if value.WhichOneof("parameter_choice") != "int64_param":
        raise InvalidRequest(
            f"invalid value type for 'classification' parameter of output '{name}', "
            "expected int64_param"
        )
    if value.int64_param < 0:
        raise InvalidRequest(
            f"invalid value for 'classification' parameter of output '{name}', expected >= 0"
        )
    return value.int64_param


def classify(tensor: Tensor, count: int, labels: Sequence[str], *, batched: bool) -> Tensor:
    """`tensor` as its top `count` classes per batch row (the whole tensor if not batched).

    Raises:
        InvalidRequest: the output is not numeric, or too large to rank.
    """
    if tensor.datatype in FLOAT_TYPECODES:
        values: Sequence[float] = floats_from_le(tensor.datatype, tensor.data)
        text = "{:f}".format
    elif tensor.datatype in INT_TYPECODES and tensor.datatype != "BOOL":
        values = ints_from_le(tensor.datatype, tensor.data)
        text = "{:d}".format
    else:
        raise InvalidRequest(
            f"class result not available for output '{tensor.name}' due to unsupported "
            f"type '{tensor.datatype}'"
        )
    if len(values) > MAX_ELEMENTS:
        raise InvalidRequest("classification output tensor too large")
    rows = tensor.shape[0] if batched and tensor.shape else 1
    per_row = element_count(tensor.shape) // rows if rows else 0
    k = min(count, per_row)
    items: list[bytes] = []
    for row in range(rows):
        scores = values[row * per_row : (row + 1) * per_row]
        ranked = sorted(range(per_row), key=lambda i: (-scores[i], i))[:k]
        for index in ranked:
            item = f"{text(scores[index])}:{index}"
            if index < len(labels):
                item += f":{labels[index]}"
            items.append(item.encode())
    shape = (rows, k) if batched and tensor.shape else (k,)
    return Tensor(tensor.name, "BYTES", shape, encode_bytes_elements(items))
