"""Large JSON tensor data read without a Python object per element
(`rsgw.rest._json_data`), against `json.loads` as the oracle: whatever a body says,
cutting its arrays out and packing them a slice at a time must mean what parsing it
whole meant, and a malformed array must be refused where `json.loads` refuses it."""

from __future__ import annotations

import json
import struct
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.rest._json_data import (
    NumbersError,
    cut_data,
    numbers_json,
    pack_numbers,
    span_of,
)
from rsgw.rest._tensors import TensorError, json_to_raw, kinds, pack

NUMBERS = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
SPACE = st.sampled_from(["", " ", "\n", "\t ", "  "])


def spaced(values: list[object], space: str) -> str:
    return "[" + f",{space}".join(json.dumps(v) for v in values) + f"{space}]"


def nested(values: list[object], row: int, space: str) -> str:
    rows = [values[i : i + row] for i in range(0, len(values), row)]
    return "[" + f",{space}".join(spaced(r, space) for r in rows) + "]"


def packed(datatype: str, body: bytes, count: int, min_bytes: int, slice_bytes: int) -> bytes:
    skeleton = cut_data(body, min_bytes)
    document = json.loads(skeleton.text)
    data = document["inputs"][0]["data"]
    span = span_of(data, skeleton)
    if span is None:  # not cut: the ordinary path
        return json_to_raw(datatype, data, count)
    text = memoryview(body)[span[0] : span[1]]
    return bytes(
        pack_numbers(text, count, kinds(datatype), lambda v: pack(datatype, v), slice_bytes)  # type: ignore[arg-type]
    )


def body_of(data: str, datatype: str = "FP64", prefix: str = "") -> bytes:
    return (
        f'{{"id":"{prefix}","inputs":[{{"name":"IN","datatype":"{datatype}",'
        f'"shape":[1],"data":{data}}}],"outputs":[{{"name":"OUT"}}]}}'
    ).encode()


@given(
    st.lists(NUMBERS, min_size=1, max_size=300),
    st.integers(1, 16),
    SPACE,
    st.integers(1, 64),
    st.sampled_from(["FP64", "FP32"]),
)
def test_cut_and_packed_a_slice_at_a_time_means_what_json_loads_means(
    values: list[object], row: int, space: str, slice_bytes: int, datatype: str
) -> None:
    body = body_of(nested(values, row, space), datatype)
    oracle = json_to_raw(datatype, json.loads(body)["inputs"][0]["data"], len(values))
    assert packed(datatype, body, len(values), 8, slice_bytes) == oracle


@given(st.lists(st.integers(-128, 127), min_size=1, max_size=200), st.integers(1, 32))
def test_integers_out_of_range_or_of_the_wrong_kind_are_refused(
    values: list[int], slice_bytes: int
) -> None:
    body = body_of(spaced([*values, 1000], ""), "INT8")
    with pytest.raises((NumbersError, TensorError), match="range"):
        packed("INT8", body, len(values) + 1, 8, slice_bytes)
    floats = body_of(spaced([*values, 1.5], ""), "INT8")  # cut, or short and not
    with pytest.raises((NumbersError, TensorError), match=r"1\.5 at element"):
        packed("INT8", floats, len(values) + 1, 8, slice_bytes)


@pytest.mark.parametrize(
    "text",
    ["[1,,2]", "[1,2,]", "[,1]", "[1 2]", "[[1,2][3,4]]", "[1,2,3]", "[1]", "[1,-]", "[1e,2]"],
)
@pytest.mark.parametrize("slice_bytes", [1, 2, 3, 1000])
def test_what_json_refuses_is_refused(text: str, slice_bytes: int) -> None:
    with pytest.raises(NumbersError):
        pack_numbers(text.encode(), 2, kinds("FP64"), lambda v: pack("FP64", v), slice_bytes)  # type: ignore[arg-type]


def test_a_data_array_inside_a_string_is_not_cut() -> None:
    fake = '\\"data\\": [' + ",".join(["1"] * 100) + "]"
    body = body_of(spaced([1.5] * 100, ""), prefix=fake)
    skeleton = cut_data(body, 8)
    assert len(skeleton.spans) == 1
    document = json.loads(skeleton.text)
    assert document["id"] == fake.replace("\\", "")
    assert span_of(document["inputs"][0]["data"], skeleton) is not None


def test_arrays_of_strings_and_short_arrays_stay_for_json_loads() -> None:
    strings = body_of(json.dumps(["a"] * 1000), "BYTES")
    assert cut_data(strings, 8).spans == ()
    short = body_of("[1,2]")
    assert cut_data(short, 64).spans == ()


def test_a_47_mib_body_costs_its_packed_size_not_its_python_objects() -> None:
    """The issue's body: 12.5 million FP32 `1.5`s. Parsed whole it made 257 MB of
    Python objects; cut and packed it peaks at its 50 MB of packed numbers and a
    slice (traced with tracemalloc, which counts every Python allocation)."""
    import tracemalloc

    count = 12_500_000
    body = body_of("[" + ",".join(["1.5"] * count) + "]", "FP32")
    tracemalloc.start()
    try:
        skeleton = cut_data(body)
        span = span_of(json.loads(skeleton.text)["inputs"][0]["data"], skeleton)
        assert span is not None
        out = pack_numbers(
            memoryview(body)[span[0] : span[1]],
            count,
            kinds("FP32"),
            lambda v: pack("FP32", v),  # type: ignore[arg-type]
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(out) == 4 * count and out[:4] == struct.pack("<f", 1.5)
    assert peak < 4 * count + 16 * 1024 * 1024, peak


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=500))
def test_numbers_json_writes_what_json_dumps_writes(values: list[float]) -> None:
    elements = array("f", values)
    text = "".join(numbers_json(elements))
    assert json.loads(text) == elements.tolist()
    assert text == json.dumps(elements.tolist(), separators=(",", ":"))
