"""Tests for what simulated models compute (rsgw.worker.models._compute)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rsgw.base._errors import InvalidRequest
from rsgw.worker.models._catalogue import builtin_catalogue
from rsgw.worker.models._compute import run_model
from rsgw.worker.models._specs import ModelSpec, TensorSpec
from rsgw.worker.models._tensors import (
    Tensor,
    decode_bytes_elements,
    encode_bytes_elements,
    tensor_from_raw,
)

NUMPY_DTYPES = {
    "UINT8": "u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP32": "<f4",
    "FP64": "<f8",
}


def add_sub_model(datatype: str, shape: tuple[int, ...] = (-1, 16)) -> ModelSpec:
    return ModelSpec(
        name=f"add_sub_{datatype.lower()}",
        inputs=(TensorSpec("INPUT0", datatype, shape), TensorSpec("INPUT1", datatype, shape)),
        outputs=(TensorSpec("OUTPUT0", datatype, shape), TensorSpec("OUTPUT1", datatype, shape)),
        max_batch_size=8,
        batch_input="INPUT0",
        batch_axis=1,
        launch_seconds=0.001,
        item_seconds=0.0001,
        weight_bytes=0,
        compute="add_sub",
    )


def tensor(name: str, array: np.ndarray) -> Tensor:
    datatype = next(k for k, v in NUMPY_DTYPES.items() if np.dtype(v) == array.dtype)
    return tensor_from_raw(name, datatype, array.shape, array.tobytes())


def strings(name: str, items: list[bytes], shape: tuple[int, ...]) -> Tensor:
    return tensor_from_raw(name, "BYTES", shape, encode_bytes_elements(items))


def test_simple_computes_sum_and_difference() -> None:
    spec = builtin_catalogue().get("simple")
    assert spec is not None
    a = np.arange(16, dtype="<i4").reshape(1, 16)
    b = np.ones((1, 16), dtype="<i4")
    out0, out1 = run_model(spec, {"INPUT0": tensor("INPUT0", a), "INPUT1": tensor("INPUT1", b)}, 1)
    assert (out0.name, out0.datatype, out0.shape) == ("OUTPUT0", "INT32", (1, 16))
    assert (out1.name, out1.datatype, out1.shape) == ("OUTPUT1", "INT32", (1, 16))
    assert out0.data == (a + b).tobytes()
    assert out1.data == (a - b).tobytes()


def test_simple_int8_wraps_around() -> None:
    spec = builtin_catalogue().get("simple_int8")
    assert spec is not None
    a = np.full((1, 16), 127, dtype="i1")
    b = np.full((1, 16), -128, dtype="i1")
    out0, out1 = run_model(spec, {"INPUT0": tensor("INPUT0", a), "INPUT1": tensor("INPUT1", b)}, 1)
    assert np.frombuffer(out0.data, dtype="i1").tolist() == [-1] * 16
    assert np.frombuffer(out1.data, dtype="i1").tolist() == [-1] * 16  # 127 + 128 wraps


@st.composite
def add_sub_operands(draw: st.DrawFn) -> tuple[str, np.ndarray, np.ndarray]:
    datatype = draw(st.sampled_from(sorted(NUMPY_DTYPES)))
    rows = draw(st.integers(1, 4))
    dtype = np.dtype(NUMPY_DTYPES[datatype])
    # Integers: every bit pattern. Floats: anything but NaN, infinities included.
    width: Literal[32, 64] = 32 if dtype.itemsize == 4 else 64
    elements = st.floats(width=width, allow_nan=False) if dtype.kind == "f" else None
    arrays = hnp.arrays(dtype, (rows, 16), elements=elements)
    return datatype, draw(arrays), draw(arrays)


@given(add_sub_operands())
def test_add_sub_agrees_with_numpy(operands: tuple[str, np.ndarray, np.ndarray]) -> None:
    datatype, a, b = operands
    spec = add_sub_model(datatype)
    out0, out1 = run_model(spec, {"INPUT0": tensor("INPUT0", a), "INPUT1": tensor("INPUT1", b)}, 1)
    with np.errstate(over="ignore", invalid="ignore"):
        total, diff = a + b, a - b
    if a.dtype.kind == "f":
        # NaN payloads (inf - inf) are not ours to pin down; values, signs and infs are.
        np.testing.assert_array_equal(np.frombuffer(out0.data, a.dtype).reshape(a.shape), total)
        np.testing.assert_array_equal(np.frombuffer(out1.data, a.dtype).reshape(a.shape), diff)
    else:
        assert out0.data == total.tobytes()
        assert out1.data == diff.tobytes()
    assert out0.shape == out1.shape == a.shape


def test_add_sub_rejects_mismatched_shapes() -> None:
    spec = add_sub_model("INT32")
    a = np.zeros((1, 16), dtype="<i4")
    b = np.zeros((2, 16), dtype="<i4")
    with pytest.raises(InvalidRequest) as info:
        run_model(spec, {"INPUT0": tensor("INPUT0", a), "INPUT1": tensor("INPUT1", b)}, 1)
    message = str(info.value)
    assert "'INPUT1'" in message
    assert "[2,16]" in message
    assert "[1,16]" in message


def test_missing_input_is_named() -> None:
    spec = add_sub_model("INT32")
    a = np.zeros((1, 16), dtype="<i4")
    with pytest.raises(InvalidRequest, match=r"model 'add_sub_int32': missing input 'INPUT1'"):
        run_model(spec, {"INPUT0": tensor("INPUT0", a)}, 1)


def test_simple_string_sums_decimal_strings() -> None:
    spec = builtin_catalogue().get("simple_string")
    assert spec is not None
    a = [str(i).encode() for i in range(16)]
    b = [b"1"] * 15 + [b"-20"]
    out0, out1 = run_model(
        spec, {"INPUT0": strings("INPUT0", a, (1, 16)), "INPUT1": strings("INPUT1", b, (1, 16))}, 1
    )
    assert (out0.name, out0.datatype, out0.shape) == ("OUTPUT0", "BYTES", (1, 16))
    assert decode_bytes_elements(out0.data, 16) == [str(i + 1).encode() for i in range(15)] + [
        b"-5"
    ]
    assert decode_bytes_elements(out1.data, 16) == [str(i - 1).encode() for i in range(15)] + [
        b"35"
    ]


@given(
    st.lists(st.integers(-(10**30), 10**30), min_size=1, max_size=8),
    st.lists(st.integers(-(10**30), 10**30), min_size=8, max_size=8),
)
def test_add_sub_string_is_exact(xs: list[int], ys: list[int]) -> None:
    spec = builtin_catalogue().get("simple_string")
    assert spec is not None
    ys = ys[: len(xs)]
    shape = (len(xs), 1)
    inputs = {
        "INPUT0": strings("INPUT0", [str(x).encode() for x in xs], shape),
        "INPUT1": strings("INPUT1", [str(y).encode() for y in ys], shape),
    }
    out0, out1 = run_model(spec, inputs, len(xs))
    assert [int(v) for v in decode_bytes_elements(out0.data)] == [
        x + y for x, y in zip(xs, ys, strict=True)
    ]
    assert [int(v) for v in decode_bytes_elements(out1.data)] == [
        x - y for x, y in zip(xs, ys, strict=True)
    ]


@pytest.mark.parametrize("bad", [b"abc", b"", b" 1", b"1_000", b"1.5", b"\xd9\xa1", b"+"])
def test_add_sub_string_rejects_non_decimal(bad: bytes) -> None:
    spec = builtin_catalogue().get("simple_string")
    assert spec is not None
    a = [b"1"] * 15 + [bad]
    inputs = {
        "INPUT0": strings("INPUT0", a, (1, 16)),
        "INPUT1": strings("INPUT1", [b"1"] * 16, (1, 16)),
    }
    with pytest.raises(InvalidRequest) as info:
        run_model(spec, inputs, 1)
    message = str(info.value)
    assert "input 'INPUT0'" in message
    assert "element 15" in message
    assert repr(bad) in message


def test_add_sub_string_rejects_too_many_digits() -> None:
    spec = builtin_catalogue().get("simple_string")
    assert spec is not None
    inputs = {
        "INPUT0": strings("INPUT0", [b"9" * 5000], (1, 1)),
        "INPUT1": strings("INPUT1", [b"1"], (1, 1)),
    }
    with pytest.raises(InvalidRequest, match=r"input 'INPUT0': element 0 has too many digits"):
        run_model(spec, inputs, 1)


def test_simple_identity_echoes_input() -> None:
    spec = builtin_catalogue().get("simple_identity")
    assert spec is not None
    t = strings("INPUT0", [b"hello", b"", b"\x00\xff"], (1, 3))
    (out,) = run_model(spec, {"INPUT0": t}, 1)
    assert out == Tensor("OUTPUT0", "BYTES", (1, 3), t.data)


def test_synthetic_fills_zeros_with_rows_for_every_dynamic_dim() -> None:
    spec = ModelSpec(
        name="encoder",
        inputs=(TensorSpec("ids", "INT64", (-1, 128)),),
        outputs=(
            TensorSpec("hidden", "FP32", (-1, 4, -1)),
            TensorSpec("labels", "BYTES", (-1,)),
            TensorSpec("flag", "BOOL", (2,)),
        ),
        max_batch_size=16,
        batch_input="ids",
        batch_axis=1,
        launch_seconds=0.002,
        item_seconds=0.001,
        weight_bytes=1 << 20,
        compute="synthetic",
    )
    ids = tensor("ids", np.zeros((3, 128), dtype="<i8"))
    hidden, labels, flag = run_model(spec, {"ids": ids}, 3)
    assert hidden == Tensor("hidden", "FP32", (3, 4, 3), bytes(4 * 36))
    assert labels.shape == (3,)
    assert decode_bytes_elements(labels.data, 3) == [b"", b"", b""]
    assert flag == Tensor("flag", "BOOL", (2,), b"\x00\x00")
