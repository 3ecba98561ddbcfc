"""Tests for the pure tensor codec of the simulated worker (rsgw.worker.models._tensors)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import InvalidRequest
from rsgw.worker.models._specs import TensorSpec
from rsgw.worker.models._tensors import (
    DATATYPE_SIZES,
    DATATYPES,
    check_input,
    decode_bytes_elements,
    element_count,
    encode_bytes_elements,
    rows,
    tensor_from_contents,
    tensor_from_raw,
)

FIXED_DATATYPES = sorted(DATATYPE_SIZES)

# numpy's little-endian dtype for each fixed-size datatype: the reference packing.
NUMPY_DTYPES = {
    "BOOL": "?",
    "UINT8": "u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}

small_shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3)


def test_datatype_sizes_match_numpy() -> None:
    assert "BYTES" not in DATATYPE_SIZES
    assert DATATYPES[-1] == "BYTES"
    assert set(DATATYPES) == set(NUMPY_DTYPES) | {"BYTES"}
    for datatype, size in DATATYPE_SIZES.items():
        assert np.dtype(NUMPY_DTYPES[datatype]).itemsize == size


@pytest.mark.parametrize(
    ("shape", "count"), [((), 1), ((0,), 0), ((16,), 16), ((1, 16), 16), ((2, 3, 4), 24)]
)
def test_element_count(shape: tuple[int, ...], count: int) -> None:
    assert element_count(shape) == count


# -- BYTES elements -------------------------------------------------------------------------


def test_encode_bytes_elements_layout() -> None:
    assert encode_bytes_elements([b"ab", b"", b"xyz"]) == (
        b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x03\x00\x00\x00xyz"
    )
    assert encode_bytes_elements([]) == b""


@given(st.lists(st.binary(max_size=40), max_size=20))
def test_bytes_elements_round_trip(items: list[bytes]) -> None:
    data = encode_bytes_elements(items)
    assert decode_bytes_elements(data) == items
    assert decode_bytes_elements(data, len(items)) == items


@given(st.lists(st.binary(max_size=20), min_size=1, max_size=10), st.data())
def test_truncated_bytes_elements_are_rejected(items: list[bytes], data: st.DataObject) -> None:
    encoded = encode_bytes_elements(items)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(InvalidRequest):
        decode_bytes_elements(encoded[:cut], len(items))


@pytest.mark.parametrize(
    ("data", "count", "needle"),
    [
        (b"\x01\x00", None, "length prefix truncated"),
        (b"\x05\x00\x00\x00abc", None, "declares 5 bytes but only 3 remain"),
        (b"\x01\x00\x00\x00a", 2, "expected 2 BYTES elements, got 1"),
        (b"\x01\x00\x00\x00ab", 1, "1 bytes left over"),
    ],
)
def test_decode_bytes_elements_errors(data: bytes, count: int | None, needle: str) -> None:
    with pytest.raises(InvalidRequest, match=needle):
        decode_bytes_elements(data, count)


# -- tensor_from_raw ------------------------------------------------------------------------


def test_tensor_from_raw_message_names_input_sizes_and_shape() -> None:
    with pytest.raises(InvalidRequest) as info:
        tensor_from_raw("INPUT0", "INT32", [1, 16], b"\x00" * 60)
    assert str(info.value) == "input 'INPUT0': expected 64 bytes for INT32 [1,16], got 60"


@given(st.sampled_from(FIXED_DATATYPES), small_shapes, st.integers(-3, 3))
def test_tensor_from_raw_accepts_exactly_the_right_length(
    datatype: str, shape: list[int], delta: int
) -> None:
    expected = element_count(shape) * DATATYPE_SIZES[datatype]
    size = expected + delta
    if size < 0:
        return
    raw = bytes(range(256)) * (size // 256 + 1)
    raw = raw[:size]
    if delta == 0:
        tensor = tensor_from_raw("X", datatype, shape, raw)
        assert (tensor.name, tensor.datatype, tensor.shape, tensor.data) == (
            "X",
            datatype,
            tuple(shape),
            raw,
        )
    else:
        with pytest.raises(InvalidRequest, match=rf"input 'X': expected {expected} bytes"):
            tensor_from_raw("X", datatype, shape, raw)


def test_tensor_from_raw_bytes() -> None:
    data = encode_bytes_elements([b"1", b"22", b"333"])
    tensor = tensor_from_raw("S", "BYTES", (3,), data)
    assert tensor.shape == (3,)
    assert tensor.data == data
    with pytest.raises(InvalidRequest, match=r"input 'S': expected 4 BYTES elements, got 3"):
        tensor_from_raw("S", "BYTES", (2, 2), data)
    with pytest.raises(InvalidRequest, match=r"input 'S': .* left over after 2 BYTES elements"):
        tensor_from_raw("S", "BYTES", (2,), data)


def test_tensor_from_raw_rejects_bad_datatype_and_negative_dims() -> None:
    with pytest.raises(InvalidRequest, match=r"input 'A': unknown datatype 'INT3'"):
        tensor_from_raw("A", "INT3", (1,), b"\x00")
    with pytest.raises(InvalidRequest, match=r"input 'A': shape \[-1,4\] has a negative"):
        tensor_from_raw("A", "INT8", (-1, 4), b"\x00" * 4)


# -- tensor_from_contents -------------------------------------------------------------------

CONTENTS_CASES = [
    ("BOOL", "bool_contents", [True, False, True, True]),
    ("UINT8", "uint_contents", [0, 1, 255, 7]),
    ("UINT16", "uint_contents", [0, 1, 65535, 7]),
    ("UINT32", "uint_contents", [0, 1, 2**32 - 1, 7]),
    ("UINT64", "uint64_contents", [0, 1, 2**64 - 1, 7]),
    ("INT8", "int_contents", [-128, -1, 127, 0]),
    ("INT16", "int_contents", [-(2**15), -1, 2**15 - 1, 0]),
    ("INT32", "int_contents", [-(2**31), -1, 2**31 - 1, 0]),
    ("INT64", "int64_contents", [-(2**63), -1, 2**63 - 1, 0]),
    ("FP32", "fp32_contents", [0.5, -1.25, 3.0e38, 0.0]),
    ("FP64", "fp64_contents", [0.1, -1e300, 2.5, 0.0]),
]


@pytest.mark.parametrize(("datatype", "field", "values"), CONTENTS_CASES)
def test_tensor_from_contents_packs_like_numpy(
    datatype: str, field: str, values: list[Any]
) -> None:
    contents = pb.InferTensorContents(**{field: values})
    tensor = tensor_from_contents("IN", datatype, (2, 2), contents)
    assert tensor.shape == (2, 2)
    assert tensor.data == np.array(values, dtype=NUMPY_DTYPES[datatype]).tobytes()
    # The same bytes sent as raw contents give the same tensor.
    assert tensor_from_raw("IN", datatype, (2, 2), tensor.data) == tensor


def test_tensor_from_contents_bytes() -> None:
    contents = pb.InferTensorContents(bytes_contents=[b"a", b"", b"bc"])
    tensor = tensor_from_contents("S", "BYTES", (3,), contents)
    assert tensor.data == encode_bytes_elements([b"a", b"", b"bc"])


def test_tensor_from_contents_count_mismatch_names_input_and_field() -> None:
    contents = pb.InferTensorContents(int_contents=list(range(15)))
    with pytest.raises(InvalidRequest) as info:
        tensor_from_contents("INPUT0", "INT32", (1, 16), contents)
    message = str(info.value)
    assert "'INPUT0'" in message
    assert "expected 16 int_contents values for INT32 [1,16], got 15" in message


def test_tensor_from_contents_reads_only_the_datatypes_field() -> None:
    contents = pb.InferTensorContents(fp32_contents=[1.0, 2.0])
    with pytest.raises(InvalidRequest, match=r"input 'X': expected 2 int_contents values"):
        tensor_from_contents("X", "INT32", (2,), contents)


def test_tensor_from_contents_value_out_of_range() -> None:
    contents = pb.InferTensorContents(int_contents=[1, 300])
    with pytest.raises(InvalidRequest, match=r"input 'X': int_contents .* does not fit INT8"):
        tensor_from_contents("X", "INT8", (2,), contents)


def test_tensor_from_contents_fp16_has_no_field() -> None:
    with pytest.raises(InvalidRequest, match=r"input 'H': FP16 has no typed contents field"):
        tensor_from_contents("H", "FP16", (1,), pb.InferTensorContents())


@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=32))
def test_int32_contents_agree_with_struct(values: list[int]) -> None:
    contents = pb.InferTensorContents(int_contents=values)
    tensor = tensor_from_contents("X", "INT32", (len(values),), contents)
    assert tensor.data == struct.pack(f"<{len(values)}i", *values)


# -- check_input ----------------------------------------------------------------------------

SPEC = TensorSpec("INPUT0", "INT32", (-1, 16))


@pytest.mark.parametrize("shape", [(1, 16), (8, 16), (0, 16)])
def test_check_input_accepts(shape: tuple[int, ...]) -> None:
    check_input(SPEC, "INT32", shape, model="simple")


@pytest.mark.parametrize(
    ("datatype", "shape", "expected", "got"),
    [
        ("FP32", (1, 16), "expected datatype INT32", "got FP32"),
        ("INT32", (16,), "expected shape [-1,16]", "got [16]"),
        ("INT32", (1, 1, 16), "expected shape [-1,16]", "got [1,1,16]"),
        ("INT32", (1, 15), "expected shape [-1,16]", "got [1,15]"),
        ("INT32", (-1, 16), "expected shape [-1,16]", "got [-1,16]"),
    ],
)
def test_check_input_rejects(
    datatype: str, shape: tuple[int, ...], expected: str, got: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_input(SPEC, datatype, shape, model="simple")
    message = str(info.value)
    assert "model 'simple'" in message
    assert "input 'INPUT0'" in message
    assert expected in message
    assert got in message


@pytest.mark.parametrize(
    ("shape", "axis", "expected"),
    [((4, 16), 1, 4), ((4, 16), 2, 16), ((4, 16), 0, 1), ((4, 16), 3, 1), ((), 1, 1)],
)
def test_rows(shape: tuple[int, ...], axis: int, expected: int) -> None:
    assert rows(shape, axis) == expected
