"""Tensors as the simulated worker holds them: a KServe V2 datatype, a wire shape, raw bytes.

Pure: no I/O, no logging.

Theory of operation. Every tensor the worker touches is kept in one form, the
form of `raw_input_contents` / `raw_output_contents` on the wire: little-endian
elements in row-major order, and for BYTES each element as a 4-byte little-endian
length followed by its bytes. Typed `*_contents` fields are packed into that form
once, on the way in, so the compute functions and the SHM writer only ever see
one layout. We chose raw bytes over a decoded list because the common case
(raw in, raw out, a 16-element tensor) then never materializes Python objects,
and because the KServe clients send raw contents by default.

Invariants a `Tensor` built by `tensor_from_raw` or `tensor_from_contents` keeps:
every dim of `shape` is >= 0; `len(data)` is `element_count(shape) *
DATATYPE_SIZES[datatype]` for fixed-size types; for BYTES, `data` parses into
exactly `element_count(shape)` length-prefixed elements with nothing left over.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from rsgw.base._errors import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rsgw.worker.models._specs import TensorSpec

# Bytes per element of each fixed-size KServe V2 datatype (the KServe V2 protocol's
# "Tensor Data Types" table). BYTES has no fixed size and is deliberately absent.
DATATYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
}

# Every datatype the worker accepts, in the order the KServe V2 spec lists them
# (this order is also the one error messages show).
DATATYPES: tuple[str, ...] = (*DATATYPE_SIZES, "BYTES")

INTEGER_DATATYPES: frozenset[str] = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
)

# The machine's byte order is fixed for the life of the process; arrays are
# swapped on the way in and out only on a big-endian host, so the common case
# pays nothing.
_BIG_ENDIAN = sys.byteorder == "big"

_LENGTH = struct.Struct("<I")


IntTypecode = Literal["b", "B", "h", "H", "i", "I", "l", "L", "q", "Q"]
FloatTypecode = Literal["f", "d"]


def _typecode(signed: bool, size: int) -> IntTypecode:
    """The integer `array` typecode with exactly `size` bytes per element.

    C's `int` and `long` differ in width between platforms, so we pick by
    measured itemsize instead of hard-coding 'i' or 'l'.
    """
    codes: tuple[IntTypecode, ...] = (
        ("b", "h", "i", "l", "q") if signed else ("B", "H", "I", "L", "Q")
    )
    for code in codes:
        if array(code).itemsize == size:
            return code
    raise RuntimeError(f"no array typecode of {size} bytes")  # pragma: no cover


# The array typecode of each integer datatype. BOOL travels as one byte per
# element (0 or 1). FP16 has no `array` typecode, so it only ever moves as
# opaque raw bytes.
INT_TYPECODES: dict[str, IntTypecode] = {
    "BOOL": "B",
    "UINT8": "B",
    "UINT16": _typecode(False, 2),
    "UINT32": _typecode(False, 4),
    "UINT64": _typecode(False, 8),
    "INT8": "b",
    "INT16": _typecode(True, 2),
    "INT32": _typecode(True, 4),
    "INT64": _typecode(True, 8),
}
FLOAT_TYPECODES: dict[str, FloatTypecode] = {"FP32": "f", "FP64": "d"}

# The `InferTensorContents` field that carries each datatype (KServe V2 gRPC
# protocol: INT8/16/32 share int_contents, UINT8/16/32 share uint_contents).
CONTENTS_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class TensorContents(Protocol):
    """The typed-contents fields we read, as a protobuf `InferTensorContents` has them."""

    @property
    def bool_contents(self) -> Sequence[bool]: ...
    @property
    def int_contents(self) -> Sequence[int]: ...
    @property
    def int64_contents(self) -> Sequence[int]: ...
    @property
    def uint_contents(self) -> Sequence[int]: ...
    @property
    def uint64_contents(self) -> Sequence[int]: ...
    @property
    def fp32_contents(self) -> Sequence[float]: ...
    @property
    def fp64_contents(self) -> Sequence[float]: ...
    @property
    def bytes_contents(self) -> Sequence[bytes]: ...


@dataclass(frozen=True, slots=True)
class Tensor:
    """One named tensor in wire form.

    The constructor does not re-check `data` against `shape`: tensors are built
    on the ModelInfer path, where `tensor_from_raw` / `tensor_from_contents` have
    just done that check, and the compute functions build outputs that hold by
    construction. Re-parsing BYTES payloads here would double the cost of every
    string tensor for no gain.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    # Raw little-endian bytes as in KServe `raw_input_contents`; BYTES elements are
    # each a 4-byte little-endian length followed by the bytes.
    data: bytes


def format_shape(shape: Sequence[int]) -> str:
    """A shape as error messages show it: `[1,16]`, the KServe clients' spelling."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def element_count(shape: Sequence[int]) -> int:
    """The number of elements of a tensor of `shape` (1 for a scalar, shape `[]`)."""
    return math.prod(shape)


def ints_from_le(datatype: str, data: bytes) -> array[int]:
    """Little-endian raw bytes of an integer (or BOOL) datatype as a native-order array.

    Raises:
        KeyError: `datatype` is not an integer datatype or BOOL.
    """
    values = array(INT_TYPECODES[datatype], data)
    if _BIG_ENDIAN:  # pragma: no cover - the CI machines are little-endian
        values.byteswap()
    return values


def floats_from_le(datatype: str, data: bytes) -> array[float]:
    """Little-endian raw bytes of FP32 or FP64 as a native-order array.

    Raises:
        KeyError: `datatype` is not FP32 or FP64.
    """
    values = array(FLOAT_TYPECODES[datatype], data)
    if _BIG_ENDIAN:  # pragma: no cover - the CI machines are little-endian
        values.byteswap()
    return values


def array_to_le(values: array[int] | array[float]) -> bytes:
    """A native-order `array` as little-endian raw bytes."""
    if _BIG_ENDIAN:  # pragma: no cover - the CI machines are little-endian
        values = values[:]
        values.byteswap()
    return values.tobytes()


def int_tensor(name: str, datatype: str, shape: tuple[int, ...], values: Sequence[int]) -> Tensor:
    """A tensor of an integer `datatype` holding `values` (which must fit it)."""
    return Tensor(name, datatype, shape, array_to_le(array(INT_TYPECODES[datatype], values)))


def encode_bytes_elements(items: Sequence[bytes]) -> bytes:
    """BYTES elements in wire form: each a 4-byte little-endian length, then the bytes."""
    parts: list[bytes] = []
    for item in items:
        parts.append(_LENGTH.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def _split_bytes_elements(data: bytes, count: int | None, what: str) -> list[bytes]:
    """Parse length-prefixed BYTES elements; `what` prefixes any error message."""
    items: list[bytes] = []
    view = memoryview(data)
    size = len(data)
    pos = 0
    while pos < size and (count is None or len(items) < count):
        if size - pos < 4:
            raise InvalidRequest(
                f"{what}: BYTES element {len(items)} length prefix truncated at byte {pos}"
            )
        (length,) = _LENGTH.unpack_from(view, pos)
        pos += 4
        if size - pos < length:
            raise InvalidRequest(
                f"{what}: BYTES element {len(items)} declares {length} bytes "
                f"but only {size - pos} remain"
            )
        items.append(bytes(view[pos : pos + length]))
        pos += length
    if count is not None:
        if len(items) < count:
            raise InvalidRequest(f"{what}: expected {count} BYTES elements, got {len(items)}")
        if pos != size:
            raise InvalidRequest(
                f"{what}: {size - pos} bytes left over after {count} BYTES elements"
            )
    return items


def decode_bytes_elements(data: bytes, count: int | None = None) -> list[bytes]:
    """Split wire-form BYTES data into its elements.

    Args:
        data: the length-prefixed elements.
        count: the exact number of elements expected, or None to read to the end.

    Raises:
        InvalidRequest: a length prefix or element runs past the end, or (with
            `count`) there are fewer elements or bytes left over.
    """
    return _split_bytes_elements(data, count, "BYTES data")


def _check_request_shape(name: str, datatype: str, shape: Sequence[int]) -> tuple[int, ...]:
    """Reject unknown datatypes and negative dims, which no request tensor may have."""
    if datatype not in DATATYPE_SIZES and datatype != "BYTES":
        raise InvalidRequest(f"input '{name}': unknown datatype '{datatype}'")
    shape = tuple(shape)
    if any(d < 0 for d in shape):
        raise InvalidRequest(
            f"input '{name}': shape {format_shape(shape)} has a negative dimension"
        )
    return shape


def tensor_from_raw(name: str, datatype: str, shape: Sequence[int], raw: bytes) -> Tensor:
    """A tensor from `raw_input_contents` bytes (or an SHM slice), checked against its shape.

    Raises:
        InvalidRequest: unknown datatype, a negative dim, or `raw` that does not
            hold exactly `element_count(shape)` elements; the message names the input.
    """
    wire_shape = _check_request_shape(name, datatype, shape)
    count = element_count(wire_shape)
    if datatype == "BYTES":
        _split_bytes_elements(raw, count, f"input '{name}'")
    else:
        expected = count * DATATYPE_SIZES[datatype]
        if len(raw) != expected:
            raise InvalidRequest(
                f"input '{name}': expected {expected} bytes for {datatype} "
                f"{format_shape(wire_shape)}, got {len(raw)}"
            )
    return Tensor(name, datatype, wire_shape, bytes(raw))


def tensor_from_contents(
    name: str, datatype: str, shape: Sequence[int], contents: TensorContents
) -> Tensor:
    """A tensor from the typed `InferTensorContents` fields, packed into raw bytes.

    Only the field that carries `datatype` is read (KServe V2: INT8/16/32 share
    `int_contents`, UINT8/16/32 share `uint_contents`).

    Raises:
        InvalidRequest: FP16 (which has no typed field), a value count other than
            `element_count(shape)`, or a value that does not fit the datatype; the
            message names the input.
    """
    wire_shape = _check_request_shape(name, datatype, shape)
    if datatype == "FP16":
        raise InvalidRequest(
            f"input '{name}': FP16 has no typed contents field; send raw_input_contents"
        )
    field = CONTENTS_FIELDS[datatype]
    values = getattr(contents, field)
    count = element_count(wire_shape)
    if len(values) != count:
        raise InvalidRequest(
            f"input '{name}': expected {count} {field} values for {datatype} "
            f"{format_shape(wire_shape)}, got {len(values)}"
        )
    if datatype == "BYTES":
        return Tensor(name, datatype, wire_shape, encode_bytes_elements(values))
    if datatype == "BOOL":
        return Tensor(name, datatype, wire_shape, bytes(1 if v else 0 for v in values))
    packed: array[int] | array[float]
    try:
        if datatype in FLOAT_TYPECODES:
            packed = array(FLOAT_TYPECODES[datatype], values)
        else:
            packed = array(INT_TYPECODES[datatype], values)
    except (OverflowError, TypeError) as exc:
        raise InvalidRequest(
            f"input '{name}': {field} holds a value that does not fit {datatype}"
        ) from exc
    return Tensor(name, datatype, wire_shape, array_to_le(packed))


def check_input(spec: TensorSpec, datatype: str, shape: Sequence[int], *, model: str) -> None:
    """Check a request input's datatype and shape against the model's declared input.

    A -1 in the spec accepts any size; every other dim must match exactly.

    Raises:
        InvalidRequest: wrong datatype, wrong rank, a negative dim, or a fixed-dim
            mismatch; the message names the model, the input, the expected and the got.
    """
    if datatype != spec.datatype:
        raise InvalidRequest(
            f"model '{model}' input '{spec.name}': expected datatype {spec.datatype}, "
            f"got {datatype}"
        )
    if len(shape) != len(spec.shape) or any(
        got < 0 or (want != -1 and got != want) for want, got in zip(spec.shape, shape, strict=True)
    ):
        raise InvalidRequest(
            f"model '{model}' input '{spec.name}': expected shape {format_shape(spec.shape)}, "
            f"got {format_shape(shape)}"
        )


def rows(shape: Sequence[int], axis: int) -> int:
    """The number of batch rows: the dim at 1-based `axis`, or 1 with no (or no such) axis."""
    if 1 <= axis <= len(shape):
        return shape[axis - 1]
    return 1
