"""Tensor data between its three shapes: REST JSON lists, raw bytes, typed gRPC contents.

Pure: no I/O, no logging. The gateway itself does not depend on numpy, so the
conversions are `array` and `struct` ones; each is one C-level pass where the
standard library has one, and Python loops only where the format needs them
(BYTES framing, bfloat16 rounding).

The raw form is the one on the gRPC wire (`raw_input_contents`,
`raw_output_contents`): little-endian elements in row-major order; BOOL one byte
per element (0 or 1); BYTES each element as a 4-byte little-endian unsigned length
and then its bytes. JSON BYTES elements are strings, sent as their UTF-8.

Half precision. Triton's HTTP endpoint refuses FP16 and BF16 in JSON; here they
are numbers, as for FP32. FP16 is IEEE binary16 (`struct`'s 'e'; a value past its
range is an error, not infinity). BF16 is the upper half of a float32: a JSON
number is rounded to float32 and then to bfloat16 by round-to-nearest-even (NaN
stays a quiet NaN), which is what `ml_dtypes.bfloat16`, and so tritonclient, does;
read back, a BF16 element is that float32 exactly.

Typed contents. Only FP16 and BF16 lack a typed field; MLServer sends FP16 in
`bytes_contents`, so for both the concatenated `bytes_contents` are taken as the raw
bytes.

Errors are `TensorError`s worded to follow "for input 'NAME': " (or output): the
codec adds the tensor's name and the HTTP status, since the same mistake is the
client's on the way in and the worker's on the way out.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.rest._json_data import numbers_json

#: Bytes per element of the fixed-size datatypes; BYTES has no fixed size.
ITEM_SIZES: dict[str, int] = {
    "BOOL": 1,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
    "BF16": 2,
}
#: Every datatype, in the order messages list them.
DATATYPES: tuple[str, ...] = (*ITEM_SIZES, "BYTES")

_INT_RANGES: dict[str, tuple[int, int]] = {
    **{f"INT{bits}": (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) for bits in (8, 16, 32, 64)},
    **{f"UINT{bits}": (0, (1 << bits) - 1) for bits in (8, 16, 32, 64)},
}
_FLOATS = frozenset({"FP16", "FP32", "FP64", "BF16"})


def _typecode(size: int, codes: str) -> str:
    # The C types behind array's codes vary by platform; pick by size, not by name.
    return next(code for code in codes if array(code).itemsize == size)


_CODES: dict[str, str] = {
    **{name: _typecode(ITEM_SIZES[name], "bhilq") for name in _INT_RANGES if name[0] == "I"},
    **{name: _typecode(ITEM_SIZES[name], "BHILQ") for name in _INT_RANGES if name[0] == "U"},
    "FP32": "f",
    "FP64": "d",
}
_BIG_ENDIAN = sys.byteorder == "big"

#: The JSON element types each datatype takes: bool is not a number here, nor 1.0 an integer.
_KINDS: dict[str, frozenset[type]] = {
    "BOOL": frozenset({bool}),
    "BYTES": frozenset({str}),
    **dict.fromkeys(_INT_RANGES, frozenset({int})),
    **dict.fromkeys(_FLOATS, frozenset({int, float})),
}
_KIND_WORDS = {"BOOL": "booleans", "BYTES": "strings"} | dict.fromkeys(_FLOATS, "numbers")

#: The typed field that carries each datatype in InferTensorContents.
_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
    "FP16": "bytes_contents",
    "BF16": "bytes_contents",
}

_LENGTH = struct.Struct("<I")


class TensorError(ValueError):
    """Why a tensor's data does not convert; the text follows "for input 'NAME': "."""


class NotUtf8Error(TensorError):
    """A BYTES element that JSON cannot carry: the fix is the client's (ask for binary)."""


def show(value: object) -> str:
    """A JSON value as a message quotes it, cut short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def kinds(datatype: str) -> frozenset[type]:
    """The JSON element types `datatype` takes (as `json.loads` types them)."""
    return _KINDS[datatype]


def element_count(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def json_to_raw(datatype: str, data: object, count: int) -> bytes:
    """JSON `data` (flat or nested) of `count` elements as raw bytes.

    Raises:
        TensorError: `data` is not an array, or the element count, an element's
            type or its range is wrong.
    """
    if type(data) is not list:
        raise TensorError(f"expected an array, got {show(data)}")
    kinds = set(map(type, data))  # one C-level pass types every element of a flat list
    if list in kinds:
        data = _flatten(data)
        kinds = set(map(type, data))
    if len(data) != count:
        raise TensorError(f"expected {count} elements, got {len(data)}")
    if not kinds <= _KINDS[datatype]:
        raise _wrong_kind(datatype, data)
    if datatype == "BYTES":
        return _frame(data)
    return pack(datatype, data)


def _flatten(data: list[Any]) -> list[Any]:
    """The leaves of nested lists in row-major order; iterative, so no nesting depth
    can exhaust the stack."""
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _wrong_kind(datatype: str, flat: list[Any]) -> TensorError:
    kinds = _KINDS[datatype]
    index, value = next((i, v) for i, v in enumerate(flat) if type(v) not in kinds)
    words = _KIND_WORDS.get(datatype, "integers")
    return TensorError(
        f"expected {datatype} values ({words}), got {show(value)} at element {index}"
    )


def _frame(items: Sequence[str]) -> bytes:
    parts: list[bytes] = []
    for index, item in enumerate(items):
        try:
            encoded = item.encode()
        except UnicodeEncodeError:
            raise TensorError(f"element {index} is not a valid Unicode string") from None
        parts.append(_LENGTH.pack(len(encoded)))
        parts.append(encoded)
    return b"".join(parts)


def pack(datatype: str, values: Sequence[int | float | bool]) -> bytes:
    """Numbers (or booleans) of a fixed-size `datatype` as raw bytes.

    Raises:
        TensorError: a value outside the datatype's range.
    """
    try:
        if datatype == "BOOL":
            return bytes(map(bool, values))
        if datatype == "UINT8":
            return bytes(values)  # type: ignore[arg-type]  # ints; out of range: ValueError
        if datatype == "FP16":
            return struct.pack(f"<{len(values)}e", *values)
        if datatype == "BF16":
            return _bf16(values)
        elements = array(_CODES[datatype], values)
    except (OverflowError, ValueError):
        raise _out_of_range(datatype, values) from None
    except TypeError:  # only typed contents get here unchecked; JSON was checked already
        raise TensorError(f"expected {datatype} values") from None
    if _BIG_ENDIAN:
        elements.byteswap()
    return elements.tobytes()


def _out_of_range(datatype: str, values: Sequence[int | float | bool]) -> TensorError:
    low, high = _INT_RANGES.get(datatype, (None, None))
    for index, value in enumerate(values):
        if low is not None and high is not None:
            bad = not low <= value <= high
        else:
            try:
                struct.pack("<e" if datatype == "FP16" else "<d", value)
                bad = False
            except OverflowError:
                bad = True
        if bad:
            return TensorError(f"{show(value)} is out of range for {datatype} at element {index}")
    return TensorError(f"a value is out of range for {datatype}")


def _bf16(values: Sequence[int | float | bool]) -> bytes:
    words = array("I")
    words.frombytes(array("f", values).tobytes())
    halves = array("H", [_round_bf16(word) for word in words])
    if _BIG_ENDIAN:
        halves.byteswap()
    return halves.tobytes()


def _round_bf16(word: int) -> int:
    if word & 0x7FFFFFFF > 0x7F800000:  # NaN: keep it a NaN whatever the low bits were
        return (word >> 16) | 0x0040
    return (word + 0x7FFF + ((word >> 16) & 1)) >> 16


def raw_to_json(datatype: str, raw: bytes | memoryview, count: int) -> list[Any]:
    """Raw bytes of `count` elements as a flat JSON list.

    Raises:
        NotUtf8Error: a BYTES element is not UTF-8.
        TensorError: the bytes do not hold `count` elements (or datatype is unknown).
    """
    if datatype == "BYTES":
        return _decode_strings(split_bytes(raw, count))
    size = ITEM_SIZES.get(datatype)
    if size is None:
        raise TensorError(f"unknown datatype '{datatype}'")
    if len(raw) != count * size:
        raise TensorError(f"expected {count * size} bytes for {count} elements, got {len(raw)}")
    if datatype == "BOOL":
        return [byte != 0 for byte in raw]
    if datatype == "FP16":
        return list(struct.unpack(f"<{count}e", raw))
    data: bytes | bytearray | memoryview = raw
    if datatype == "BF16":
        data = bytearray(4 * count)  # each bfloat16 becomes the high half of a float32
        data[2::4] = raw[0::2]
        data[3::4] = raw[1::2]
    elements = array("f" if datatype == "BF16" else _CODES[datatype])
    elements.frombytes(data)
    if _BIG_ENDIAN:
        elements.byteswap()
    return elements.tolist()


#: Each 8-bit value's JSON text, by the byte that holds it.
_BYTE_TEXT: dict[str, list[str]] = {
    "UINT8": [str(i) for i in range(256)],
    "INT8": [str(i - 256 if i > 127 else i) for i in range(256)],
    "BOOL": ["false", *["true"] * 255],
}


def raw_json_text(datatype: str, raw: bytes | memoryview, count: int) -> str | None:
    """An 8-bit tensor's raw bytes as a JSON array's text, as `raw_to_json` and
    json.dumps would write it (None for other datatypes, or bytes that do not hold
    `count` elements: `raw_to_json` says what is wrong)."""
    table = _BYTE_TEXT.get(datatype)
    if table is None or len(raw) != count:
        return None
    return f"[{','.join(map(table.__getitem__, raw))}]"


def numbers_json_pieces(datatype: str, raw: bytes | memoryview, count: int) -> list[bytes] | None:
    """A large numeric tensor's raw bytes as a JSON array's text, in encoded pieces of
    a slice of elements each (`rsgw.rest._json_data.numbers_json`): what `raw_to_json`
    and json.dumps would write, without a Python object per element at once. None
    for datatypes this does not write (BYTES, BOOL, FP16, BF16), or bytes that do not
    hold `count` elements."""
    code = _CODES.get(datatype)
    if code is None or len(raw) != count * ITEM_SIZES[datatype]:
        return None
    elements = array(code)
    elements.frombytes(raw)
    if _BIG_ENDIAN:
        elements.byteswap()
    return [piece.encode() for piece in numbers_json(elements)]


def split_bytes(raw: bytes | memoryview, count: int) -> list[bytes]:
    """The `count` elements of raw BYTES data, which they must fill exactly.

    Raises:
        TensorError: the framing is cut short, or bytes are left over.
    """
    items: list[bytes] = []
    view = memoryview(raw)
    end = len(view)
    pos = 0
    for index in range(count):
        if pos + 4 > end:
            raise TensorError(f"BYTES data ends before element {index} of {count}")
        (length,) = _LENGTH.unpack_from(view, pos)
        pos += 4
        if pos + length > end:
            raise TensorError(f"BYTES element {index} is cut short")
        items.append(bytes(view[pos : pos + length]))
        pos += length
    if pos != end:
        raise TensorError(f"{end - pos} bytes left over after {count} BYTES elements")
    return items


def _decode_strings(items: list[bytes]) -> list[Any]:
    try:
        return [item.decode() for item in items]
    except UnicodeDecodeError:
        index = next(i for i, item in enumerate(items) if not _is_utf8(item))
        raise NotUtf8Error(
            f"BYTES element {index} is not valid UTF-8, so JSON cannot carry it; "
            "ask for this output with binary_data: true"
        ) from None


def _is_utf8(item: bytes) -> bool:
    try:
        item.decode()
    except UnicodeDecodeError:
        return False
    return True


def contents_values(datatype: str, contents: pb.InferTensorContents, count: int) -> list[Any]:
    """Typed contents as a flat JSON list.

    Raises:
        NotUtf8Error: a BYTES element is not UTF-8.
        TensorError: the element count is wrong, a value is out of range, or the
            datatype has no typed field.
    """
    field = _FIELDS.get(datatype)
    if field is None:
        raise TensorError(f"unknown datatype '{datatype}'")
    if field == "bytes_contents" and datatype != "BYTES":
        return raw_to_json(datatype, b"".join(contents.bytes_contents), count)
    values = list(getattr(contents, field))
    if len(values) != count:
        raise TensorError(f"expected {count} elements in {field}, got {len(values)}")
    if datatype == "BYTES":
        return _decode_strings(values)
    if datatype in _INT_RANGES and ITEM_SIZES[datatype] < 4:
        pack(datatype, values)  # the wider field may hold values this datatype cannot
    return values


def contents_to_raw(datatype: str, contents: pb.InferTensorContents, count: int) -> bytes:
    """Typed contents as raw bytes, for an output the client wants in binary.

    Raises:
        TensorError: as `contents_values`.
    """
    field = _FIELDS.get(datatype)
    if field is None:
        raise TensorError(f"unknown datatype '{datatype}'")
    if field == "bytes_contents" and datatype != "BYTES":
        raw = b"".join(contents.bytes_contents)
        if len(raw) != count * ITEM_SIZES[datatype]:
            raise TensorError(
                f"expected {count * ITEM_SIZES[datatype]} bytes in bytes_contents, got {len(raw)}"
            )
        return raw
    values = list(getattr(contents, field))
    if len(values) != count:
        raise TensorError(f"expected {count} elements in {field}, got {len(values)}")
    if datatype == "BYTES":
        return b"".join(part for item in values for part in (_LENGTH.pack(len(item)), item))
    return pack(datatype, values)
