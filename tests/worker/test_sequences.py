"""The sequence book (pure): which requests of a stateful model may run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._errors import InvalidRequest
from rsgw.worker._sequences import SWEEP_EVERY, SequenceBook

IDLE = 1.0


def test_a_sequence_from_start_to_end() -> None:
    book = SequenceBook()
    first = book.step("m", 7, start=True, end=False, now=0.0, idle_seconds=IDLE)
    assert (first.start, first.accumulator) == (True, 0)
    book.finish("m", first, 5, now=0.1)
    middle = book.step("m", 7, start=False, end=False, now=0.2, idle_seconds=IDLE)
    assert middle.accumulator == 5
    book.finish("m", middle, 9, now=0.3)
    last = book.step("m", 7, start=False, end=True, now=0.4, idle_seconds=IDLE)
    assert last.accumulator == 9
    book.finish("m", last, 12, now=0.5)
    assert len(book) == 0
    # The id may be used again at once, from a START.
    again = book.step("m", 7, start=True, end=False, now=0.6, idle_seconds=IDLE)
    assert again.accumulator == 0


def test_refusals_in_tritons_words() -> None:
    book = SequenceBook()
    with pytest.raises(InvalidRequest, match="must specify a non-zero or non-empty correlation"):
        book.step("m", 0, start=True, end=False, now=0.0, idle_seconds=IDLE)
    with pytest.raises(InvalidRequest, match="must specify a non-zero or non-empty correlation"):
        book.step("m", "", start=True, end=False, now=0.0, idle_seconds=IDLE)
    with pytest.raises(InvalidRequest) as caught:
        book.step("m", 3, start=False, end=False, now=0.0, idle_seconds=IDLE)
    assert caught.value.message == (
        "inference request for sequence 3 to model 'm' must specify the START flag on the "
        "first request of the sequence"
    )
    assert len(book) == 0


def test_an_idle_sequence_is_released() -> None:
    book = SequenceBook()
    step = book.step("m", "abc", start=True, end=False, now=0.0, idle_seconds=IDLE)
    book.finish("m", step, 1, now=0.0)
    with pytest.raises(InvalidRequest, match="START flag"):
        book.step("m", "abc", start=False, end=False, now=IDLE + 0.01, idle_seconds=IDLE)
    assert len(book) == 0


def test_a_failed_start_leaves_nothing_and_models_are_apart() -> None:
    book = SequenceBook()
    step = book.step("a", 1, start=True, end=False, now=0.0, idle_seconds=IDLE)
    book.step("b", 1, start=True, end=False, now=0.0, idle_seconds=IDLE)
    book.abandon("a", step)
    assert len(book) == 1
    assert book.forget_model("b") == 1
    assert len(book) == 0


def test_abandoned_sequences_are_swept() -> None:
    book = SequenceBook()
    for i in range(1, SWEEP_EVERY):
        book.step("m", i, start=True, end=False, now=0.0, idle_seconds=IDLE)
    assert len(book) == SWEEP_EVERY - 1
    book.step("m", "late", start=True, end=False, now=10.0, idle_seconds=IDLE)
    assert len(book) == 1


@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.booleans(), st.booleans(), st.floats(0, 2)), max_size=40
    )
)
def test_any_order_of_requests_is_decided_consistently(
    requests: list[tuple[int, bool, bool, float]],
) -> None:
    """A request runs iff its sequence is live (and not idle) or it STARTs one."""
    book = SequenceBook()
    now = 0.0
    live: dict[int, float] = {}
    for correlation_id, start, end, gap in requests:
        now += gap
        expected = start or (correlation_id in live and now - live[correlation_id] <= IDLE)
        try:
            step = book.step("m", correlation_id, start=start, end=end, now=now, idle_seconds=IDLE)
        except InvalidRequest:
            assert not expected
            live.pop(correlation_id, None)
            continue
        assert expected
        book.finish("m", step, None, now=now)
        if end:
            live.pop(correlation_id, None)
        else:
            live[correlation_id] = now
    assert len(book) <= len(live)
