"""The demand meter of residency by value: decayed call counts, for every model at once."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.placement._demand import FORGET_BELOW, DecayedDemand
from rsgw.scheduling.placement._packer import Packer


def test_a_steady_rate_reads_as_itself_once_the_meter_is_old() -> None:
    meter = DecayedDemand(halflife=10.0, now=0.0)
    for second in range(1, 201):  # 2 calls a second for 200 s (20 half-lives)
        meter.count("hot", 2)
        if second % 50 == 0:
            meter.count("tail")
        meter.rates(float(second))
    rates = meter.rates(200.0)
    assert rates["hot"] == pytest.approx(2.0, rel=0.05)
    assert rates["tail"] < 0.1


def test_a_model_not_called_decays_and_is_forgotten() -> None:
    """The packer's rate EWMA kept a tail model's one-call rate until its next call;
    the meter halves it each half-life, called or not."""
    meter = DecayedDemand(halflife=10.0, now=-1000.0)  # old: its age correction is 1
    meter.count("once")
    first = meter.rates(0.0)["once"]
    assert meter.rates(10.0)["once"] == pytest.approx(first / 2, rel=0.01)
    assert meter.rates(20.0)["once"] == pytest.approx(first / 4, rel=0.01)
    assert meter.snapshot()["once"] == pytest.approx(0.25)
    assert "once" not in meter.rates(10.0 * (1 + math.log2(1 / FORGET_BELOW)))


def test_a_young_meter_does_not_inflate_one_call() -> None:
    """The age correction is the meter's, not each model's: one call in the first
    instant reads as at most one call a second, and a newcomer to an old meter reads
    as one call's worth, far below a model called steadily."""
    meter = DecayedDemand(halflife=60.0)
    meter.count("early")
    assert meter.rates(5.0)["early"] <= 1.01
    for second in range(6, 600):
        meter.count("steady")
        meter.rates(float(second))
    meter.count("newcomer")
    rates = meter.rates(600.0)
    assert rates["newcomer"] < rates["steady"] / 50


def test_a_clock_read_out_of_order_does_not_grow_counts_back() -> None:
    meter = DecayedDemand(halflife=10.0, now=0.0)
    meter.count("m")
    later = meter.rates(10.0)["m"]
    assert meter.rates(5.0)["m"] == pytest.approx(later)


def test_the_halflife_must_be_positive() -> None:
    with pytest.raises(ValueError, match="halflife"):
        DecayedDemand(halflife=0.0)


@given(
    calls=st.lists(
        st.tuples(st.sampled_from("abcd"), st.floats(0, 100, allow_nan=False)), max_size=60
    )
)
def test_more_calls_never_read_as_less_demand(calls: list[tuple[str, float]]) -> None:
    """Two meters fed the same calls, one of them with an extra call of `a`: `a` reads
    at least as high there, and every other model the same."""
    plain, extra = DecayedDemand(5.0, now=0.0), DecayedDemand(5.0, now=0.0)
    extra.count("a")
    for model, at in sorted(calls, key=lambda c: c[1]):
        for meter in (plain, extra):
            meter.count(model)
            meter.rates(at)
    once, twice = plain.rates(100.0), extra.rates(100.0)
    assert twice.get("a", 0.0) >= once.get("a", 0.0)
    for model in "bcd":
        assert twice.get(model, 0.0) == pytest.approx(once.get(model, 0.0))


def test_the_packer_reads_demand_from_its_meter() -> None:
    packer = Packer(["m1", "m2"], demand=DecayedDemand(60.0, now=0.0))
    for _ in range(30):
        packer.record_arrival("m1")
    packer.record_arrival("m2")
    packer.record_arrival("unknown")  # not a model the fleet serves: not counted
    demand = packer.demand(1.0)
    assert set(demand) == {"m1", "m2"}
    assert demand["m1"] == pytest.approx(30 * demand["m2"])
