"""Sequence affinity's pure parts: reading the flags from raw bytes, and the holder table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import DecodeError
from rsgw.base._status import StatusCode
from rsgw.scheduling.calls._sequences import SequenceTable, holder_lost
from rsgw.scheduling.calls._wire import SequenceFlags, peek_routing
from tests.scheduling.test_wire import walk_limit


def body(sequence_id: int | str | None = None, **flags: bool) -> bytes:
    request = pb.ModelInferRequest(model_name="seq")
    request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
    request.raw_input_contents.append(b"\x00" * 4)
    if isinstance(sequence_id, str):
        request.parameters["sequence_id"].string_param = sequence_id
    elif sequence_id is not None:
        request.parameters["sequence_id"].int64_param = sequence_id
    for name, value in flags.items():
        request.parameters[f"sequence_{name}"].bool_param = value
    request.parameters["priority"].int64_param = 3  # not a sequence parameter
    return request.SerializeToString()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (body(), None),
        (body(0, start=True), None),  # 0 (and "") mean "no sequence", as in Triton
        (body("", start=True), None),
        (body(42, start=True), SequenceFlags(42, True, False)),
        (body(42), SequenceFlags(42, False, False)),
        (body(42, end=True), SequenceFlags(42, False, True)),
        (body("corr-7", start=True, end=True), SequenceFlags("corr-7", True, True)),
        (body(-5), SequenceFlags(-5, False, False)),
    ],
)
def test_sequence_flags_are_read_from_raw_bytes(raw: bytes, expected: SequenceFlags | None) -> None:
    assert peek_routing(raw) == ("seq", expected)
    with walk_limit(1):  # protobuf's parser reads it instead: the same answer
        assert peek_routing(raw) == ("seq", expected)


def test_a_uint64_sequence_id_is_read() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.parameters["sequence_id"].uint64_param = 2**64 - 1
    assert peek_routing(request.SerializeToString()) == (
        "m",
        SequenceFlags(2**64 - 1, False, False),
    )


@given(
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8)),
    st.booleans(),
    st.booleans(),
)
def test_peek_routing_agrees_with_protobuf(
    sequence_id: int | str | None, start: bool, end: bool
) -> None:
    raw = body(sequence_id, start=start, end=end)
    parsed = pb.ModelInferRequest.FromString(raw)
    params = parsed.parameters
    expected: SequenceFlags | None = None
    if "sequence_id" in params:
        value = getattr(params["sequence_id"], params["sequence_id"].WhichOneof("parameter_choice"))
        if value:
            expected = SequenceFlags(value, start, end)
    assert peek_routing(raw) == (parsed.model_name, expected)


def test_garbage_in_a_parameter_is_a_decode_error() -> None:
    bad = b"\x0a\x01m" + b"\x22\x03\x0a\x05x"  # a parameters entry whose key overruns it
    with pytest.raises(DecodeError):
        peek_routing(bad)


def test_the_holder_table() -> None:
    table = SequenceTable(idle_seconds=10, max_sequences=3)
    assert table.holder("m", 1, now=0) is None
    table.started("m", 1, "w0", now=0)
    table.started("m", 2, "w1", now=1)
    assert table.holder("m", 1, now=5) == "w0"
    assert table.holder("other", 1, now=5) is None  # sequences are per model
    assert table.holder("m", 1, now=14) == "w0"  # idle since 5, not since 0
    assert table.holder("m", 2, now=14) is None  # idle since 1: forgotten
    table.started("m", 1, "w2", now=15)  # a restarted id simply moves
    assert table.holder("m", 1, now=15) == "w2"
    table.ended("m", 1)
    assert table.holder("m", 1, now=15) is None


def test_the_table_is_bounded_least_recently_used_first() -> None:
    table = SequenceTable(idle_seconds=100, max_sequences=2)
    for i, worker in enumerate(("w0", "w1", "w2")):
        table.started("m", i, worker, now=i)
    assert len(table) == 2
    assert table.holder("m", 0, now=3) is None
    assert table.holder("m", 2, now=3) == "w2"


def test_a_lost_holder_is_aborted_with_advice() -> None:
    error = holder_lost("seq", 42, "worker1")
    assert error.code is StatusCode.ABORTED
    assert "worker1" in error.message and "start the sequence again" in error.message
