"""The stall watch: ping a silent worker with calls waiting; eject it if nothing answers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.fleet._stalls import StallWatch, Verdict

W = "w0:1"


def test_a_silent_worker_is_pinged_then_ejected() -> None:
    watch = StallWatch(stall_seconds=0.5, ping_timeout=1.0)
    assert watch.look(W, 0.0, pending=3, reads=7) is Verdict.FINE
    assert watch.look(W, 0.25, pending=3, reads=7) is Verdict.FINE  # silent...
    assert watch.look(W, 0.75, pending=3, reads=7) is Verdict.PING  # ...0.5 s
    assert watch.look(W, 1.0, pending=3, reads=7) is Verdict.FINE  # one PING only
    assert watch.look(W, 1.5, pending=3, reads=7) is Verdict.FINE
    assert watch.stalled_for(W, 1.75) == 1.5
    assert watch.look(W, 1.75, pending=3, reads=7) is Verdict.EJECT


def test_an_answered_ping_ends_the_stall() -> None:
    watch = StallWatch(stall_seconds=0.5, ping_timeout=1.0)
    watch.look(W, 0.0, pending=1, reads=1)
    watch.look(W, 0.1, pending=1, reads=1)
    assert watch.look(W, 0.6, pending=1, reads=1) is Verdict.PING
    assert watch.look(W, 0.7, pending=1, reads=2) is Verdict.FINE  # the ack
    assert watch.stalled_for(W, 0.7) == 0
    # A long batch: silent again, pinged again, answered again; never ejected.
    assert watch.look(W, 0.8, pending=1, reads=2) is Verdict.FINE
    assert watch.look(W, 1.3, pending=1, reads=2) is Verdict.PING


def test_no_waiting_calls_no_stall() -> None:
    watch = StallWatch(stall_seconds=0.5, ping_timeout=1.0)
    for tick in range(100):
        assert watch.look(W, tick * 0.25, pending=0, reads=5) is Verdict.FINE


def test_time_the_gateway_was_busy_does_not_count() -> None:
    """The gateway's own loop was busy: the acknowledgement may be unread, not missing."""
    watch = StallWatch(stall_seconds=0.5, ping_timeout=1.0)
    watch.look(W, 0.0, pending=1, reads=1)
    watch.look(W, 0.1, pending=1, reads=1)
    assert watch.look(W, 0.6, pending=1, reads=1) is Verdict.PING
    assert watch.look(W, 3.0, pending=1, reads=1, lag=2.2) is Verdict.FINE  # 0.2 s live
    assert watch.look(W, 3.5, pending=1, reads=1) is Verdict.FINE  # 0.7 s
    assert watch.look(W, 3.85, pending=1, reads=1) is Verdict.EJECT  # 1.05 s


def test_disabled() -> None:
    assert not StallWatch(stall_seconds=0).enabled
    assert StallWatch().enabled


looks = st.lists(
    st.tuples(
        st.floats(0.01, 2.0),  # time since the previous look
        st.integers(0, 4),  # calls waiting
        st.booleans(),  # did bytes arrive since the previous look
        st.floats(0.0, 1.0),  # how late the look is
    ),
    max_size=60,
)


@given(looks)
def test_ejection_needs_live_silence(steps: list[tuple[float, int, bool, float]]) -> None:
    """EJECT only after `stall + ping_timeout` of live silence with calls waiting."""
    watch = StallWatch(stall_seconds=0.5, ping_timeout=1.0)
    now, reads = 0.0, 0
    silent_since: float | None = None
    pinged = False
    lagged = 0.0
    for gap, pending, spoke, lag in steps:
        now += gap
        reads += spoke
        verdict = watch.look(W, now, pending=pending, reads=reads, lag=lag)
        if pending == 0 or spoke:
            silent_since, pinged = None, False
            assert verdict is Verdict.FINE
            continue
        silent_since = now if silent_since is None else silent_since
        if pinged:
            lagged += lag
        if verdict is Verdict.PING:
            assert not pinged and now - silent_since >= 0.5
            pinged, lagged = True, 0.0
        elif verdict is Verdict.EJECT:
            assert pinged and now - silent_since - lagged >= 1.5
            watch.forget(W)
            silent_since, pinged = None, False
