"""The fluid device (`rsgw.simulate._fluid`): its closed-form round against its rules."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw.simulate._fluid import (
    FluidDevice,
    LatencyHistogram,
    batches_per_cycle,
    serve_round,
)
from rsgw.worker.models._specs import ModelSpec

parts_strategy = st.lists(
    st.tuples(
        st.floats(0.01, 5_000),  # calls
        st.sampled_from([1.0, 8.0, 32.0]),  # max batch
        st.floats(1e-4, 0.05),  # visit s
        st.floats(1e-5, 0.005),  # item s
    ),
    min_size=1,
    max_size=12,
)


@given(parts_strategy, st.floats(0.1, 60), st.sampled_from([math.inf, 64.0, 8.0]))
@settings(max_examples=300, deadline=None)
def test_a_round_serves_no_more_than_asked_within_its_time(
    parts: list[tuple[float, float, float, float]], dt: float, cap: float
) -> None:
    served = serve_round(dt, parts, cap)
    assert served.busy_s <= dt * (1 + 1e-6)
    for (q, batch, _, _), calls, batches in zip(parts, served.calls, served.batches, strict=True):
        assert -1e-9 <= calls <= q * (1 + 1e-9)
        # At most one batch per call, at least full ones.
        assert calls / batch * (1 - 1e-6) <= batches <= max(q, calls) * (1 + 1e-6)
    # The time spent is the cost model's: launches per batch, items per call.
    cost = sum(
        b * v + c * i
        for (_, _, v, i), b, c in zip(parts, served.batches, served.calls, strict=True)
    )
    assert math.isclose(cost, served.busy_s, rel_tol=1e-6, abs_tol=1e-9)


@given(parts_strategy, st.floats(0.1, 30))
@settings(max_examples=200, deadline=None)
def test_more_time_never_serves_less(
    parts: list[tuple[float, float, float, float]], dt: float
) -> None:
    shorter = sum(serve_round(dt, parts).calls)
    longer = sum(serve_round(dt * 2, parts).calls)
    assert longer >= shorter * (1 - 1e-6)


def test_the_regimes() -> None:
    one = [(10.0, 32.0, 0.01, 0.001)]
    alone = serve_round(1.0, one)  # 10 calls of 11 ms each fit in a second: run alone
    assert alone.calls == (10.0,) and alone.batches == (10.0,) and math.isinf(alone.cycles)
    full = serve_round(1.0, [(10_000.0, 32.0, 0.01, 0.001)])  # too many even in full batches
    assert math.isclose(full.busy_s, 1.0) and full.calls[0] < 10_000
    assert math.isclose(full.batches[0] * 32, full.calls[0])
    busy = serve_round(1.0, [(300.0, 32.0, 0.01, 0.001)] * 2)  # batching keeps up
    assert busy.calls == (300.0, 300.0) and math.isclose(busy.busy_s, 1.0)
    assert 300 / 32 < busy.batches[0] < 300


def test_batches_per_cycle() -> None:
    assert math.isclose(batches_per_cycle(1.0, 32), 1 - math.exp(-1))
    assert batches_per_cycle(64.0, 32) == 2.0


def spec(name: str, weight: int = 0) -> ModelSpec:
    return ModelSpec(
        name=name,
        inputs=(),
        outputs=(),
        max_batch_size=32,
        batch_input="INPUT0",
        batch_axis=1,
        launch_seconds=0.01,
        item_seconds=0.0005,
        weight_bytes=weight,
        compute="identity",
        load_seconds=0.3,
    )


def test_a_device_keeps_up_thrashes_and_sheds() -> None:
    specs = {m: spec(m, 400) for m in ("a", "b", "c")}
    hist = LatencyHistogram()
    fits = FluidDevice("w", specs, 1000)
    first = fits.step({"a": 100.0, "b": 100.0}, 0.0, 10.0, 0.1, 5.0, 64, True, hist)
    assert first.loads == 2 and first.served == 200 and first.good == 200
    again = fits.step({"a": 100.0, "b": 100.0}, 10.0, 10.0, 0.1, 5.0, 64, True, hist)
    assert again.loads == 0  # resident now
    thrash = FluidDevice("w", specs, 1000)  # three models of 400 B in 1000 B: every visit loads
    over = thrash.step({m: 1000.0 for m in specs}, 0.0, 10.0, 0.1, 5.0, 64, True, hist)
    assert over.loads > 10 and over.good < over.served
    assert over.shed > 0 and sum(thrash.backlog.values()) <= 64 + 1e-6
    waits = FluidDevice("w", specs, 1000)  # the spread modes: excess waits, then gives up
    late = waits.step({m: 1000.0 for m in specs}, 0.0, 10.0, 0.1, 5.0, 64, False, hist)
    kept = sum(waits.backlog.values())
    assert late.shed == 0 and math.isclose(late.arrived, late.served + late.late + kept)
    assert 0.3 < hist.quantile(0.99) < math.inf
