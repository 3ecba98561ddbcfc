"""The h2 plumbing's own pieces: the memoizing HPACK decoder and the plain encoder."""

from __future__ import annotations

import hpack
from hypothesis import given
from hypothesis import strategies as st

from rsgw.grpc._h2 import _MemoDecoder, _PlainEncoder

BLOCK = [
    (b":method", b"POST"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


def test_repeated_blocks_decode_the_same_from_the_memo() -> None:
    encoder = hpack.Encoder()
    decoder = _MemoDecoder()
    first = encoder.encode(BLOCK)  # literals with indexing: changes the table, not memoized
    assert decoder.decode(first, raw=True) == BLOCK
    again = encoder.encode(BLOCK)  # now fully indexed: the same bytes every time
    assert again != first
    assert decoder.decode(again, raw=True) == BLOCK
    assert again in decoder._memo
    assert decoder.decode(again, raw=True) == BLOCK


def test_a_table_change_invalidates_what_was_remembered() -> None:
    encoder = hpack.Encoder()
    decoder, plain = _MemoDecoder(), hpack.Decoder()
    blocks = [encoder.encode(BLOCK), encoder.encode(BLOCK)]
    # New entries shift the dynamic indexes the remembered (indexed) block refers to,
    # so replaying it must decode against the new table, as hpack itself does.
    blocks += [encoder.encode([(b"x-new", b"1"), (b"x-other", b"2")]), blocks[1]]
    for data in blocks:
        assert decoder.decode(data, raw=True) == plain.decode(data, raw=True)
    assert decoder.decode(blocks[1], raw=True) != BLOCK


@given(
    st.lists(
        st.lists(
            st.sampled_from([*BLOCK, (b"x-a", b"1"), (b"x-b", b"22")]), min_size=1, max_size=5
        ),
        max_size=12,
    )
)
def test_memo_decoder_agrees_with_hpack(blocks: list[list[tuple[bytes, bytes]]]) -> None:
    encoder = _PlainEncoder()
    plain = hpack.Decoder()
    memo = _MemoDecoder()
    for block in blocks:
        data = encoder.encode(block)
        assert memo.decode(data, raw=True) == plain.decode(data, raw=True)
