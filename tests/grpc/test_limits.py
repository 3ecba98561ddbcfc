"""The pure limits: how a saturated server shares its running-call cap (`StreamShare`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsgw.grpc._limits import StreamShare


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
