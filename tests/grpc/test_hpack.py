"""rsgw's HPACK against the hpack library as the oracle (RFC 7541).

Both directions: blocks hpack encodes (with Huffman, with indexing, with table size
changes) must decode the same in rsgw's decoder as in hpack's, and blocks rsgw encodes
must decode in hpack's to the headers that went in. Malformed blocks are refused with
an `HpackError`, never another exception.
"""

from __future__ import annotations

import contextlib

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw.http2._hpack import (
    HeaderDecoder,
    HeaderEncoder,
    HpackError,
    encode_headers,
    encode_integer,
)

BLOCK = [
    (b":method", b"POST"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
    (b"grpc-timeout", b"9999m"),
]

header_bytes = st.binary(min_size=0, max_size=40)
headers = st.tuples(
    st.one_of(st.sampled_from([b":path", b"content-type", b"grpc-status", b"x-a"]), header_bytes),
    header_bytes,
)
header_lists = st.lists(st.one_of(st.sampled_from(BLOCK), headers), max_size=8)


def test_repeated_blocks_come_from_memory_until_the_table_changes() -> None:
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    first = encoder.encode(BLOCK)  # literals with indexing: the table changes
    assert decoder.decode(first) == BLOCK
    assert first not in decoder._remembered
    again = encoder.encode(BLOCK)  # now all indexed: the same bytes every time
    assert decoder.decode(again) == BLOCK
    assert again in decoder._remembered
    assert decoder.decode(again) == BLOCK
    # New entries shift the dynamic indexes the remembered block refers to.
    oracle = hpack.Decoder()
    for block in (first, again):
        oracle.decode(block, raw=True)
    newer = encoder.encode([(b"x-new", b"1"), (b"x-other", b"2")])
    assert decoder.decode(newer) == oracle.decode(newer, raw=True)
    assert decoder.decode(again) == oracle.decode(again, raw=True) != BLOCK


@settings(max_examples=300)
@given(
    st.lists(header_lists, max_size=10),
    st.booleans(),
    st.lists(st.integers(0, 4096), max_size=3),
)
def test_what_hpack_encodes_rsgw_decodes_the_same(
    blocks: list[list[tuple[bytes, bytes]]], huffman: bool, sizes: list[int]
) -> None:
    encoder, oracle, decoder = hpack.Encoder(), hpack.Decoder(), HeaderDecoder(2**20)
    for index, block in enumerate(blocks):
        if index < len(sizes):
            encoder.header_table_size = sizes[index]  # a size update leads the next block
        data = encoder.encode(block, huffman=huffman)
        assert decoder.decode(data) == oracle.decode(data, raw=True)


@settings(max_examples=300)
@given(st.lists(header_lists, max_size=10))
def test_what_rsgw_encodes_hpack_decodes(blocks: list[list[tuple[bytes, bytes]]]) -> None:
    encoder, oracle = HeaderEncoder(), hpack.Decoder()
    for block in blocks:
        assert oracle.decode(encoder.encode(block), raw=True) == block


@settings(max_examples=300)
@given(header_lists, header_lists)
def test_blocks_encoded_apart_join_into_the_block_of_both(
    first: list[tuple[bytes, bytes]], second: list[tuple[bytes, bytes]]
) -> None:
    """What a channel relies on: a constant part encoded once, the rest per call."""
    joined = encode_headers(first) + encode_headers(second)
    assert joined == encode_headers(first + second)
    assert hpack.Decoder().decode(joined, raw=True) == first + second


def test_the_encoder_uses_the_static_table_and_never_indexes() -> None:
    encoder = HeaderEncoder()
    assert encoder.encode([(b":method", b"POST")]) == b"\x83"  # static index 3
    assert encoder.encode([(b"te", b"trailers")]) == b"\x00\x02te\x08trailers"
    content_type = encoder.encode([(b"content-type", b"application/grpc")])
    assert content_type == bytes([0x0F, 31 - 15]) + b"\x10application/grpc"  # name index 31


@settings(max_examples=500)
@given(st.binary(max_size=64))
def test_garbage_is_refused_with_an_hpack_error(data: bytes) -> None:
    with contextlib.suppress(HpackError):
        HeaderDecoder().decode(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x80", "header index 0"),
        (b"\xbf\x7f", "not in the table"),  # index 190: past static and dynamic
        (b"\x40\x05ab", "runs past"),
        (b"\x40", "ends inside a field"),
        (b"\x3f\xe1\x7f", "over what we allow"),  # size update to 16,384
        (b"\x82\x20", "after the first field"),
        (b"\x40\x81\xff\x01a", "Huffman"),
        (b"\xff\xff\xff\xff\xff\xff\x01", "too large"),
    ],
)
def test_malformed_blocks_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(HpackError, match=message):
        HeaderDecoder().decode(data)


def test_a_header_list_over_the_limit_is_refused_with_enhance_your_calm() -> None:
    block = hpack.Encoder().encode([(b"x-big", b"v" * 200)])
    with pytest.raises(HpackError) as refused:
        HeaderDecoder(max_header_list_size=100).decode(block)
    assert refused.value.error_code == 0xB


@given(st.integers(0, 2**28), st.integers(1, 8))
def test_integers_round_trip(value: int, prefix: int) -> None:
    from rsgw.http2._hpack import _integer

    assert _integer(encode_integer(value, prefix, 0), 0, prefix) == (
        value,
        len(encode_integer(value, prefix, 0)),
    )
