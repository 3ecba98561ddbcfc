"""The message decoder: vectors, every split point, limits, and a property."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._body import Body, Gathered, joined
from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.grpc.protocol._framing import (
    SMALL_PIECE_BYTES,
    MessageDecoder,
    frame_message,
    message_prefix,
)


def feed_all(decoder: MessageDecoder, chunks: Sequence[bytes | memoryview]) -> list[Body]:
    out: list[Body] = []
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


@given(
    st.lists(st.binary(max_size=5000), max_size=6),
    st.lists(st.integers(min_value=0, max_value=30000), max_size=12),
)
def test_gathering_gives_back_the_same_messages(messages: list[bytes], cuts: list[int]) -> None:
    """A gathering decoder's messages, joined, are the plain decoder's; a message
    that came whole is plain bytes, and the pieces are never more than the chunks."""
    wire = b"".join(frame_message(m) for m in messages)
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    chunks = [memoryview(wire)[a:b] for a, b in itertools.pairwise(points)]
    decoder = MessageDecoder(gather=True)
    out = feed_all(decoder, chunks)  # views, as the core feeds them
    assert [joined(m) for m in out] == messages
    assert decoder.at_boundary
    for message in out:
        if isinstance(message, Gathered):
            assert len(message) == len(bytes(message))
            assert 1 < len(message.pieces) <= len(chunks)
        else:
            assert type(message) is bytes


def test_large_pieces_stay_views_of_the_reads() -> None:
    payload = bytes(range(256)) * 256  # 64 KiB
    wire = frame_message(payload)
    reads = [wire[i : i + 16384] for i in range(0, len(wire), 16384)]
    decoder = MessageDecoder(gather=True)
    (message,) = feed_all(decoder, [memoryview(r) for r in reads])
    assert isinstance(message, Gathered)
    assert all(isinstance(piece, memoryview) for piece in message.pieces)
    assert bytes(message) == payload


def test_tiny_pieces_are_kept_in_one_buffer() -> None:
    """A message sent a byte at a time costs its bytes, not a view object per byte."""
    payload = b"y" * (3 * SMALL_PIECE_BYTES)
    wire = frame_message(payload)
    decoder = MessageDecoder(gather=True)
    out = feed_all(decoder, [wire[i : i + 1] for i in range(len(wire))])
    assert out == [payload]  # one piece: plain bytes
    decoder = MessageDecoder()
    assert feed_all(decoder, [wire[i : i + 1] for i in range(len(wire))]) == [payload]
