"""The partial decoder against protobuf's own encoder and parser."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from google.protobuf.message import DecodeError as ProtobufDecodeError
from hypothesis import given
from hypothesis import strategies as st

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import DecodeError
from rsgw.scheduling.calls import _wire
from rsgw.scheduling.calls._wire import (
    head_length,
    peek_batch_size,
    peek_header,
    peek_priority,
    peek_routing,
)

names = st.text(max_size=12)
dims = st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=5)


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name=draw(names), model_version=draw(names), id=draw(names)
    )
    for _ in range(draw(st.integers(0, 4))):
        tensor = request.inputs.add(
            name=draw(st.sampled_from(["a", "b", "INPUT0", "é"])), datatype="INT32"
        )
        tensor.shape.extend(draw(dims))
        if draw(st.booleans()):
            tensor.contents.int_contents.extend(draw(st.lists(st.integers(-5, 5), max_size=4)))
        if draw(st.booleans()):
            tensor.parameters["p"].string_param = draw(names)
    for key in draw(st.lists(names, max_size=2)):
        request.parameters[key].int64_param = 7
    request.outputs.add(name="OUT")
    for _ in range(draw(st.integers(0, 2))):
        request.raw_input_contents.append(draw(st.binary(max_size=64)))
    return request


def unpack_shapes(body: bytes) -> bytes:
    """Re-encode every input's shape unpacked (one varint field per dim)."""
    request = pb.ModelInferRequest.FromString(body)
    out = bytearray()
    header = pb.ModelInferRequest()
    header.CopyFrom(request)
    del header.inputs[:]
    out += header.SerializeToString()
    for tensor in request.inputs:
        plain = pb.ModelInferRequest.InferInputTensor()
        plain.CopyFrom(tensor)
        del plain.shape[:]
        inner = bytearray(plain.SerializeToString())
        for dim in tensor.shape:
            inner += b"\x18" + _varint(dim & (2**64 - 1))
        out += b"\x2a" + _varint(len(inner)) + inner
    return bytes(out)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def expected_extent(request: pb.ModelInferRequest, name: str, axis: int) -> int:
    if not name or axis < 1:
        return 0
    for tensor in request.inputs:
        if tensor.name == name:
            return tensor.shape[axis - 1] if axis <= len(tensor.shape) else 0
    return 0


@given(infer_requests(), st.sampled_from(["a", "b", "INPUT0", "é", "", "zz"]), st.integers(-1, 6))
def test_agrees_with_protobuf(request: pb.ModelInferRequest, name: str, axis: int) -> None:
    body = request.SerializeToString()
    assert peek_header(body) == (request.model_name, request.id)
    assert peek_batch_size(body, name, axis) == expected_extent(request, name, axis)
    unpacked = unpack_shapes(body)
    assert pb.ModelInferRequest.FromString(unpacked) == request
    assert peek_batch_size(unpacked, name, axis) == expected_extent(request, name, axis)


@contextmanager
def walk_limit(fields: int) -> Iterator[None]:
    """Hand bodies to protobuf's parser after `fields` top-level fields (tests only)."""
    saved = _wire.WALK_LIMIT
    _wire.WALK_LIMIT = fields
    try:
        yield
    finally:
        _wire.WALK_LIMIT = saved


@given(infer_requests(), st.sampled_from(["a", "INPUT0", "zz"]), st.integers(-1, 6))
def test_past_the_walk_limit_protobuf_reads_the_same(
    request: pb.ModelInferRequest, name: str, axis: int
) -> None:
    body = request.SerializeToString()
    full_head = head_length(body, True)
    with walk_limit(2):
        assert peek_header(body) == (request.model_name, request.id)
        assert peek_routing(body)[0] == request.model_name
        assert peek_batch_size(body, name, axis) == expected_extent(request, name, axis)
        head = head_length(body, True)
    # Past the limit the head is the whole payload; either way it still routes.
    assert head in (full_head, len(body))
    assert peek_routing(body[:head]) == peek_routing(body)


def test_millions_of_tiny_fields_cost_milliseconds() -> None:
    """8 MiB of two-byte fields protobuf skips: the walk stops early and protobuf reads it.

    Timed in CPU seconds (`process_time`), which a busy runner does not stretch: about
    0.13 s here; over a second means the walk itself went through the fields."""
    body = b"\x0a\x06simple" + b"\x10\x00" * (4 * 1024 * 1024 - 4)  # field 2 as a varint
    started = time.process_time()
    assert peek_routing(body) == ("simple", None)
    assert peek_header(body) == ("simple", "")
    assert peek_batch_size(body, "x", 1) == 0
    assert head_length(body[:4096], False) is None  # inflate more: the head is not over
    assert head_length(body, True) == len(body)
    assert time.process_time() - started < 1.0  # the walk alone took over a second


def test_a_larger_body_of_tiny_fields_is_refused_not_walked() -> None:
    body = b"\x0a\x06simple" + b"\x10\x00" * (16 * 1024 * 1024)  # 32 MiB
    started = time.process_time()  # CPU seconds: about half a millisecond here
    with pytest.raises(DecodeError, match="over 1024 top-level fields in a body of"):
        peek_routing(body)
    assert time.process_time() - started < 0.1


@given(st.lists(infer_requests(), min_size=1, max_size=3))
def test_concatenated_encodings_last_name_wins(requests: list[pb.ModelInferRequest]) -> None:
    body = b"".join(r.SerializeToString() for r in requests)
    merged = pb.ModelInferRequest.FromString(body)
    assert peek_header(body) == (merged.model_name, merged.id)
    for name in ("a", "INPUT0"):
        assert peek_batch_size(body, name, 1) == expected_extent(merged, name, 1)


@given(st.binary(max_size=200))
def test_any_bytes_give_a_value_or_decode_error(body: bytes) -> None:
    try:
        parsed: pb.ModelInferRequest | None = pb.ModelInferRequest.FromString(body)
    except (ProtobufDecodeError, RuntimeError):
        parsed = None
    try:
        header = peek_header(body)
        extent = peek_batch_size(body, "a", 1)
    except DecodeError:
        assert parsed is None  # we may only fail where protobuf fails too
        return
    if parsed is not None:
        assert header == (parsed.model_name, parsed.id)
        assert extent == expected_extent(parsed, "a", 1)


@pytest.mark.parametrize(
    "body",
    [
        b"\x0a\x05abc",  # truncated string
        b"\x0a",  # missing length
        b"\x0a\x02\xff\xfe",  # model_name not UTF-8
        b"\x00\x01",  # field number 0
        b"\x0f",  # wire type 7
        b"\x08" + b"\xff" * 11,  # varint too long
        b"\x0c",  # end group with no start
        b"\x0b\x10\x01",  # unterminated group
    ],
)
def test_malformed_bodies(body: bytes) -> None:
    with pytest.raises(DecodeError):
        peek_header(body)
    with pytest.raises(ProtobufDecodeError):
        pb.ModelInferRequest.FromString(body)


def test_groups_and_wrong_wire_types_are_skipped_like_protobuf() -> None:
    body = (
        b"\x08\x05"  # field 1 as a varint: unknown to protobuf, skipped
        + b"\x23\x08\x01\x24"  # an unknown group (field 4... as group 4) with a varint inside
        + b"\x0a\x03abc"
    )
    parsed = pb.ModelInferRequest.FromString(body)
    assert peek_header(body) == (parsed.model_name, parsed.id) == ("abc", "")


def test_payload_is_never_read() -> None:
    request = pb.ModelInferRequest(model_name="m", id="7")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[32, 3])
    del tensor
    request.raw_input_contents.append(b"\x00" * (8 * 1024 * 1024))
    body = request.SerializeToString()
    assert peek_header(body) == ("m", "7")
    assert peek_batch_size(body, "x", 1) == 32
    assert peek_batch_size(body, "x", 2) == 3
    assert peek_batch_size(body, "x", 3) == 0
    assert peek_batch_size(body, "y", 1) == 0


def test_a_ten_byte_varint_with_bits_past_64_reads_as_protobuf_reads_it() -> None:
    # Found by the any-bytes property once it asserted: protobuf accepts such a varint
    # (dropping the extra bits), so the header walk must not reject the body.
    overflow = b"\x80" * 9 + b"\x02"
    body = b"\x08" + overflow + b"\x0a\x01m"  # field 1 as a varint (unknown), then the name
    assert peek_header(body) == (pb.ModelInferRequest.FromString(body).model_name, "")
    shape = b"\x0a\x01a\x18" + b"\xff" * 9 + b"\x03"  # input "a", shape [2**64 - 1 + extra]
    body = b"\x2a" + bytes([len(shape)]) + shape
    (tensor,) = pb.ModelInferRequest.FromString(body).inputs
    assert peek_batch_size(body, "a", 1) == tensor.shape[0] == -1


priorities = st.one_of(
    st.none(),
    st.tuples(st.just("int64_param"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("uint64_param"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("bool_param"), st.booleans()),
    st.tuples(st.just("string_param"), st.text(max_size=4)),
    st.tuples(st.just("double_param"), st.floats(allow_nan=False)),
    st.just(("unset", None)),
)


def with_priority(request: pb.ModelInferRequest, priority: tuple[str, object] | None) -> bytes:
    if priority is not None:
        kind, value = priority
        parameter = request.parameters["priority"]
        if kind == "unset":
            parameter.SetInParent()
        else:
            setattr(parameter, kind, value)
    return request.SerializeToString()


def expected_priority(body: bytes) -> object:
    parameters = pb.ModelInferRequest.FromString(body).parameters
    if "priority" not in parameters:
        return None
    kind = parameters["priority"].WhichOneof("parameter_choice")
    return getattr(parameters["priority"], kind) if kind else 0


@given(infer_requests(), st.lists(priorities, min_size=1, max_size=3))
def test_peek_priority_agrees_with_protobuf(
    request: pb.ModelInferRequest, chosen: list[tuple[str, object] | None]
) -> None:
    """Each encoding carries one priority (or none); concatenated, the last one wins."""
    body = b"".join(with_priority(pb.ModelInferRequest(), p) for p in chosen[:-1])
    body += with_priority(request, chosen[-1])
    expected = expected_priority(body)
    assert peek_priority(body) == expected
    assert type(peek_priority(body)) is type(expected)
    with walk_limit(1):  # protobuf's parser reads it instead: the same answer
        assert peek_priority(body) == expected


def test_a_request_without_parameters_has_no_priority() -> None:
    assert peek_priority(pb.ModelInferRequest(model_name="m").SerializeToString()) is None
    with pytest.raises(DecodeError):
        peek_priority(b"\x0a\x01m\x22\x03\x0a\x05x")  # a parameters entry overrunning it
