"""gRPC message compression (pure): codecs, limits, and inflating only a request's head."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import DecodeError, GrpcError
from rsgw.base._status import StatusCode
from rsgw.grpc.protocol._compression import (
    Compressed,
    Deflated,
    Gzipped,
    codec,
    compress,
    decompress,
    inflate_prefix,
    parse_accept,
)
from rsgw.grpc.protocol._framing import MessageDecoder, frame_message
from rsgw.scheduling.calls._wire import head_length, peek_batch_size, peek_routing
from tests.scheduling.test_wire import infer_requests

CODECS = [Gzipped, Deflated]


@pytest.mark.parametrize("kind", CODECS)
@given(payload=st.binary(max_size=4096))
def test_round_trip(kind: type[Compressed], payload: bytes) -> None:
    packed = compress(payload, kind)
    assert type(packed) is kind
    assert decompress(packed, len(payload)) == payload


def test_the_encodings_are_grpcs() -> None:
    """gzip is a gzip stream; deflate a zlib stream, as grpc-core writes them."""
    assert decompress(Gzipped(gzip.compress(b"abc")), 10) == b"abc"
    assert decompress(Deflated(zlib.compress(b"abc")), 10) == b"abc"
    assert gzip.decompress(compress(b"abc", Gzipped)) == b"abc"
    assert zlib.decompress(compress(b"abc", Deflated)) == b"abc"


def test_a_bomb_costs_the_limit_and_no_more() -> None:
    bomb = compress(bytes(64 * 1024 * 1024), Gzipped)  # 64 MiB of zeros, ~64 KiB packed
    with pytest.raises(GrpcError) as caught:
        decompress(bomb, 1024 * 1024)
    assert caught.value.code is StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max when decompressed" in caught.value.message
    with pytest.raises(GrpcError):
        inflate_prefix(bomb, lambda prefix, complete: None, 1024 * 1024)


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (Gzipped(b"not gzip at all"), "incorrect header check"),
        (Gzipped(gzip.compress(b"abc")[:-4]), "truncated"),
        (Gzipped(gzip.compress(b"abc") + b"junk"), "followed by garbage"),
        (Deflated(gzip.compress(b"abc")), "incorrect header check"),
    ],
)
def test_corrupt_messages_are_internal(message: Compressed, why: str) -> None:
    with pytest.raises(GrpcError) as caught:
        decompress(message, 100)
    assert caught.value.code is StatusCode.INTERNAL
    assert why in caught.value.message


def test_settings_and_accept_lists() -> None:
    assert codec("gzip") is Gzipped
    assert codec("deflate") is Deflated
    assert codec("none") is None
    with pytest.raises(ValueError, match="unknown gRPC compression 'br'"):
        codec("br")
    assert parse_accept(b" identity ,GZIP,, deflate") == {b"identity", b"gzip", b"deflate"}


# -- the framing carries compressed messages compressed ---------------------------------------


def test_a_compressed_message_comes_out_wrapped() -> None:
    packed = compress(b"hello", Gzipped)
    wire = frame_message(packed) + frame_message(b"plain")
    assert wire[0] == 1 and wire[5 + len(packed)] == 0
    messages = MessageDecoder(compressed=Gzipped).feed(wire)
    assert [type(m) for m in messages] == [Gzipped, bytes]
    assert messages == [packed, b"plain"]
    # Byte by byte too (the slow path).
    decoder = MessageDecoder(compressed=Gzipped)
    chunked = [m for i in range(len(wire)) for m in decoder.feed(wire[i : i + 1])]
    assert [type(m) for m in chunked] == [Gzipped, bytes]


@pytest.mark.parametrize(("compressed", "flag"), [(None, 1), (Gzipped, 2)])
def test_unnegotiated_or_unknown_flags_fail(compressed: type[Compressed] | None, flag: int) -> None:
    wire = bytes([flag]) + frame_message(b"x")[1:]
    with pytest.raises(GrpcError) as caught:
        MessageDecoder(compressed=compressed).feed(wire)
    assert caught.value.code is StatusCode.INTERNAL


# -- routing reads only the head of a compressed request --------------------------------------


@settings(max_examples=200)
@given(request=infer_requests(), kind=st.sampled_from(CODECS))
def test_the_head_routes_as_the_whole_body(
    request: pb.ModelInferRequest, kind: type[Compressed]
) -> None:
    body = request.SerializeToString()
    head = inflate_prefix(compress(body, kind), head_length, len(body))
    assert body.startswith(head)
    assert peek_routing(head) == peek_routing(body)
    for tensor in request.inputs:
        assert peek_batch_size(head, tensor.name, 1) == peek_batch_size(body, tensor.name, 1)
    without_tensors = pb.ModelInferRequest()
    without_tensors.CopyFrom(request)
    del without_tensors.raw_input_contents[:]
    assert pb.ModelInferRequest.FromString(head) == without_tensors


def test_a_large_tensor_is_never_inflated() -> None:
    request = pb.ModelInferRequest(model_name="simple")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.append(bytes(range(256)) * 4096)  # 1 MiB, compressible
    packed = compress(request.SerializeToString(), Gzipped)
    seen: list[int] = []

    def length_of(prefix: bytes, complete: bool) -> int | None:
        seen.append(len(prefix))
        return head_length(prefix, complete)

    head = inflate_prefix(packed, length_of, 1 << 30)
    assert peek_routing(head) == ("simple", None)
    assert seen == [1024]  # one first step found the head


def test_head_length_needs_more_or_refuses() -> None:
    body = pb.ModelInferRequest(model_name="m" * 300).SerializeToString()
    assert head_length(body[:100], complete=False) is None
    assert head_length(body, complete=True) == len(body)
    with pytest.raises(DecodeError):
        head_length(body[:100], complete=True)
