"""The pure limits: how a saturated server shares its running-call cap (`StreamShare`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._limits import ACKNOWLEDGMENTS_PER_MESSAGE, PREFIX_BYTES, FloodGuard, StreamShare


def test_the_cap_is_shared_among_busy_connections() -> None:
    share = StreamShare(running_cap=64, full_streams=256)
    assert share.saturated(busy_connections=16) == 4
    assert share.sharing
    assert share.saturated(busy_connections=16) is None  # unchanged
    assert share.sample(0.0, running=64, busy_connections=10) == 7  # ceil(64 / 10)


def test_the_full_limit_returns_after_a_quiet_spell() -> None:
    share = StreamShare(running_cap=64, full_streams=256, relax_seconds=2.0)
    share.saturated(busy_connections=8)
    assert share.sample(10.0, running=20, busy_connections=8) is None  # quiet from 10 s
    assert share.sample(11.0, running=32, busy_connections=8) is None
    assert share.sample(11.5, running=40, busy_connections=8) is None  # busy again: restart
    assert share.sample(12.0, running=10, busy_connections=8) is None
    assert share.sample(13.9, running=10, busy_connections=8) is None
    assert share.sample(14.0, running=10, busy_connections=8) == 256
    assert not share.sharing
    assert share.sample(20.0, running=0, busy_connections=0) is None


def test_one_busy_connection_gets_the_whole_cap_never_more_than_the_full_limit() -> None:
    assert StreamShare(64, 256).saturated(1) == 64
    assert StreamShare(1000, 256).saturated(1) is None  # the cap is above the full limit
    assert StreamShare(64, 256).saturated(0) == 64


@given(
    cap=st.integers(1, 10_000),
    full=st.integers(1, 10_000),
    busy=st.integers(0, 100_000),
)
def test_shares_cover_the_cap_within_the_full_limit(cap: int, full: int, busy: int) -> None:
    share = StreamShare(cap, full)
    share.saturated(busy)
    assert 1 <= share.current <= full
    if share.current < full:
        assert share.current * max(1, busy) >= cap  # together, enough to keep the cap busy
        assert (share.current - 1) * max(1, busy) < cap  # and no more than that


def test_window_updates_that_acknowledge_our_replies_are_free() -> None:
    """grpc-core's pattern on a stream (perf_analyzer at concurrency 4): each reply
    acknowledged on the stream and on the connection, each in two pieces."""
    guard = FloodGuard(10)
    for _ in range(10_000):
        guard.sent(231)
        for _window in range(2):
            assert guard.window_update(PREFIX_BYTES)
            assert guard.window_update(231)
    assert guard.budget == 10


def test_window_updates_past_what_we_sent_cost_like_control_frames() -> None:
    guard = FloodGuard(10)
    guard.sent(100)
    assert guard.window_update(2 * (100 + PREFIX_BYTES))  # all of it, at once: free
    assert guard.budget == 10
    assert guard.window_update(1)  # nothing left to acknowledge: paid for
    assert guard.budget == 9
    trickled = FloodGuard(10)
    trickled.sent(100_000)
    for _ in range(ACKNOWLEDGMENTS_PER_MESSAGE):  # a trickle: a few frames free, no more
        assert trickled.window_update(1)
    assert trickled.budget == 10
    outcomes = [trickled.window_update(1) for _ in range(11)]
    assert trickled.budget == -1 and not outcomes[-1]


@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 1 << 21)), max_size=200))
def test_free_acknowledgments_never_exceed_what_was_sent(
    exchanges: list[tuple[int, int]],
) -> None:
    guard = FloodGuard(1_000_000)
    sent = free_bytes = free_frames = 0
    for size, delta in exchanges:
        guard.sent(size)
        sent += 1
        before = guard.budget
        guard.window_update(delta)
        if guard.budget == before:
            free_bytes += delta
            free_frames += 1
    assert free_frames <= ACKNOWLEDGMENTS_PER_MESSAGE * sent
    assert free_bytes <= sum(2 * (size + PREFIX_BYTES) for size, _ in exchanges)
