"""The message decoder: vectors, every split point, limits, and a property."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw._errors import GrpcError
from rsgw._status import StatusCode
from rsgw.grpc._framing import MessageDecoder, frame_message, message_prefix


def feed_all(decoder: MessageDecoder, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out


def test_prefix_is_flag_then_big_endian_length() -> None:
    assert message_prefix(0) == b"\x00\x00\x00\x00\x00"
    assert message_prefix(258) == b"\x00\x00\x00\x01\x02"
    assert frame_message(b"ab") == b"\x00\x00\x00\x00\x02ab"


def test_one_chunk_many_messages() -> None:
    wire = frame_message(b"one") + frame_message(b"") + frame_message(b"three")
    decoder = MessageDecoder()
    assert decoder.feed(wire) == [b"one", b"", b"three"]
    assert decoder.at_boundary


@pytest.mark.parametrize("split", range(1, 17))
def test_every_split_point(split: int) -> None:
    wire = frame_message(b"hello") + frame_message(b"world!")
    decoder = MessageDecoder()
    assert feed_all(decoder, [wire[:split], wire[split:]]) == [b"hello", b"world!"]
    assert decoder.at_boundary


def test_byte_at_a_time() -> None:
    wire = frame_message(b"x" * 300)
    decoder = MessageDecoder()
    out = feed_all(decoder, [wire[i : i + 1] for i in range(len(wire))])
    assert out == [b"x" * 300]


def test_partial_message_is_not_at_boundary() -> None:
    decoder = MessageDecoder()
    assert decoder.feed(frame_message(b"abc")[:6]) == []
    assert not decoder.at_boundary
    decoder2 = MessageDecoder()
    assert decoder2.feed(b"\x00\x00") == []
    assert not decoder2.at_boundary


def test_over_limit_fails_on_the_prefix_alone() -> None:
    decoder = MessageDecoder(max_message_bytes=10)
    assert decoder.feed(frame_message(b"x" * 10)) == [b"x" * 10]
    with pytest.raises(GrpcError) as caught:
        decoder.feed(message_prefix(11))  # no payload byte needed
    assert caught.value.code is StatusCode.RESOURCE_EXHAUSTED
    assert "11 vs. 10" in caught.value.message


def test_compressed_flag_is_refused() -> None:
    with pytest.raises(GrpcError) as caught:
        MessageDecoder().feed(b"\x01\x00\x00\x00\x01x")
    assert caught.value.code is StatusCode.INTERNAL


@given(
    st.lists(st.binary(max_size=200), max_size=8),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
)
def test_any_chunking_gives_back_the_messages(messages: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(frame_message(m) for m in messages)
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    chunks = [wire[a:b] for a, b in itertools.pairwise(points)]
    decoder = MessageDecoder()
    assert feed_all(decoder, chunks) == messages
    assert decoder.at_boundary
