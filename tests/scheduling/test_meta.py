"""Routing metadata: cost derivation from cumulative counters, locators, item counts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.scheduling.calls._meta import (
    DEFAULT_ITEM_COST,
    ModelCounters,
    ModelMeta,
    RoutingMeta,
    RoutingMetaTracker,
    WorkerCounters,
    ewma,
)

A, B = "w0:1", "w1:1"


def poll(**workers: dict[str, ModelCounters]) -> dict[str, WorkerCounters]:
    """Worker answers keyed by `a`/`b` -> URLs A/B, in that order."""
    urls = {"a": A, "b": B}
    return {urls[k]: WorkerCounters(models=v) for k, v in workers.items()}


def c(
    compute: float,
    requests: int,
    rows: int,
    *,
    max_batch_size: int = 0,
    batch_input_name: str = "",
    batch_axis: int = 0,
    weight_nbytes: int = 0,
) -> ModelCounters:
    return ModelCounters(
        compute, requests, rows, max_batch_size, batch_input_name, batch_axis, weight_nbytes
    )


def body(shape: list[int], name: str = "x") -> bytes:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add()
    tensor.name = name
    tensor.shape.extend(shape)
    return request.SerializeToString()


# --- acceptance 2: the cost derivation --------------------------------------------------


def test_first_sample_is_adopted() -> None:
    tracker = RoutingMetaTracker(halflife=10.0)
    meta = tracker.refresh(poll(a={"m": c(8.0, 4, 16)}))
    assert meta.models["m"].cost_per_request == 2.0
    assert meta.models["m"].cost_per_item == 0.5
    # The first observation only sets the decay clock's baseline.
    assert meta.fleet_compute_seconds == 0.0
    assert meta.generation == 1


def test_ewma_halflife_is_in_fleet_compute_seconds() -> None:
    tracker = RoutingMetaTracker(halflife=10.0)
    tracker.refresh(poll(a={"m": c(10.0, 10, 10)}))  # 1.0 per item
    # One halflife (10 s) of fleet compute at 2.0 per item: the cost moves halfway.
    meta = tracker.refresh(poll(a={"m": c(20.0, 15, 15)}))
    assert meta.models["m"].cost_per_item == pytest.approx(1.5)
    assert meta.models["m"].cost_per_request == pytest.approx(1.5)
    assert meta.fleet_compute_seconds == 10.0
    # An idle round (no compute) does not age anything.
    idle = tracker.refresh(poll(a={"m": c(20.0, 15, 15)}))
    assert idle.models["m"] == meta.models["m"]


def test_a_step_moves_the_same_whatever_the_poll_spacing() -> None:
    coarse, fine = RoutingMetaTracker(4.0), RoutingMetaTracker(4.0)
    for tracker in (coarse, fine):
        tracker.refresh(poll(a={"m": c(1.0, 1, 1)}))  # 1.0 per item
    # 8 compute-seconds (two halflives) at 2.0 per item, in one poll or in four.
    coarse_meta = coarse.refresh(poll(a={"m": c(9.0, 5, 5)}))
    for step in range(1, 5):
        fine_meta = fine.refresh(poll(a={"m": c(1.0 + 2 * step, 1 + step, 1 + step)}))
    # Two halflives leave a quarter of the old value: 1.0 + (2.0 - 1.0) * 0.75.
    assert coarse_meta.models["m"].cost_per_item == pytest.approx(1.75)
    assert fine_meta.models["m"].cost_per_item == pytest.approx(1.75)
    assert coarse_meta.fleet_compute_seconds == fine_meta.fleet_compute_seconds == 8.0


def test_other_models_compute_ages_every_model() -> None:
    # The clock is the fleet's compute, so a busy neighbour ages an idle model's cost
    # only when that model has its own new sample to blend in.
    tracker = RoutingMetaTracker(halflife=5.0)
    tracker.refresh(poll(a={"m": c(1.0, 1, 1), "n": c(0.0, 0, 0)}))
    meta = tracker.refresh(poll(a={"m": c(3.0, 2, 2), "n": c(3.0, 1, 1)}))
    # dt = 2 + 3 = 5 = one halflife: m moves halfway from 1.0 to 2.0, n adopts 3.0.
    assert meta.models["m"].cost_per_item == pytest.approx(1.5)
    assert meta.models["n"].cost_per_item == 3.0


def test_restart_rebaselines_without_changing_the_cost() -> None:
    tracker = RoutingMetaTracker(halflife=10.0)
    tracker.refresh(poll(a={"m": c(10.0, 10, 20)}))
    restarted = tracker.refresh(poll(a={"m": c(1.0, 3, 3)}))  # counters went back
    assert restarted.models["m"].cost_per_request == 1.0
    assert restarted.models["m"].cost_per_item == 0.5
    assert restarted.fleet_compute_seconds == 0.0
    # The new baseline is the post-restart counters: the next delta counts from them.
    after = tracker.refresh(poll(a={"m": c(11.0, 8, 8)}))  # 10 s over 5 requests: 2.0
    assert after.models["m"].cost_per_request == pytest.approx(ewma(1.0, 2.0, 10.0, 10.0))
    assert after.models["m"].cost_per_request == pytest.approx(1.5)
    assert after.fleet_compute_seconds == 10.0


def test_cold_model_borrows_the_fleet_mean() -> None:
    tracker = RoutingMetaTracker(halflife=10.0)
    meta = tracker.refresh(
        poll(a={"m": c(2.0, 2, 2), "n": c(8.0, 4, 4), "cold": c(0.0, 0, 0, max_batch_size=8)})
    )
    assert meta.mean_cost_per_item == 1.5  # unweighted: (1.0 + 2.0) / 2
    assert meta.models["cold"].cost_per_item == 0.0
    assert meta.models["cold"].max_batch == 8
    assert meta.item_cost("cold") == 1.5
    assert meta.item_cost("never-polled") == 1.5
    assert meta.item_cost("m") == 1.0


def test_item_cost_is_never_zero() -> None:
    assert RoutingMeta().item_cost("m") == DEFAULT_ITEM_COST == 1.0
    tracker = RoutingMetaTracker(halflife=10.0)
    # Served rows but measured no compute: a zero cost is published, yet not used.
    meta = tracker.refresh(poll(a={"m": c(0.0, 5, 5)}))
    assert meta.models["m"].cost_per_item == 0.0
    assert meta.mean_cost_per_item == 0.0
    assert meta.item_cost("m") == 1.0


@given(
    st.lists(
        st.tuples(
            st.floats(0, 1e6, allow_nan=False),
            st.integers(0, 10**9),
            st.integers(0, 10**9),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_item_cost_is_positive_and_finite_for_any_counters(
    counters: list[tuple[float, int, int]],
) -> None:
    tracker = RoutingMetaTracker(halflife=3.0)
    for compute, requests, rows in counters:
        meta = tracker.refresh(poll(a={"m": c(compute, requests, rows)}))
        for model in ("m", "other"):
            cost = meta.item_cost(model)
            assert cost > 0 and math.isfinite(cost)


# --- halflife math -------------------------------------------------------------------


@pytest.mark.parametrize("halflives", [0.5, 1.0, 2.0, 3.0])
def test_ewma_closed_form(halflives: float) -> None:
    # After k halflives a step from 0 to 1 has covered 1 - 2**-k of the way.
    assert ewma(0.0, 1.0, halflives * 7.0, 7.0) == pytest.approx(1 - 2**-halflives)


def test_ewma_with_no_time_is_unchanged() -> None:
    assert ewma(3.0, 100.0, 0.0, 1.0) == 3.0


def test_halflife_must_be_positive() -> None:
    with pytest.raises(ValueError, match="halflife"):
        RoutingMetaTracker(halflife=0.0)


# --- workers joining and leaving ----------------------------------------------------


def test_a_worker_missing_a_poll_is_not_a_restart() -> None:
    tracker = RoutingMetaTracker(halflife=10.0)
    tracker.refresh(poll(a={"m": c(10.0, 10, 10)}, b={"m": c(30.0, 10, 10)}))  # 2.0 mean
    first = tracker.snapshot.models["m"].cost_per_item
    assert first == 2.0
    # B times out. Summing over workers would read m's drop from 40 s to 12 s as a
    # restart; per worker, A's 2 s over 2 items is a real sample and the clock runs.
    gone = tracker.refresh(poll(a={"m": c(12.0, 12, 12)}))
    assert gone.fleet_compute_seconds == 2.0
    assert gone.models["m"].cost_per_item == pytest.approx(ewma(2.0, 1.0, 2.0, 10.0))
    assert gone.polled == (A,)
    # B comes back having done 10 s over 5 items since it was last seen: only that
    # counts, not its whole history again.
    back = tracker.refresh(poll(a={"m": c(12.0, 12, 12)}, b={"m": c(40.0, 15, 15)}))
    assert back.fleet_compute_seconds == 12.0
    expected = ewma(gone.models["m"].cost_per_item, 2.0, 10.0, 10.0)
    assert back.models["m"].cost_per_item == pytest.approx(expected)


def test_a_joining_worker_does_not_advance_the_clock() -> None:
    tracker = RoutingMetaTracker(halflife=1.0)
    tracker.refresh(poll(a={"m": c(1.0, 1, 1)}))
    # B joins with a long history at 5.0 per item; A did nothing. Its history is not
    # compute since the last poll, so it cannot flush m's cost in one step.
    meta = tracker.refresh(poll(a={"m": c(1.0, 1, 1)}, b={"m": c(5000.0, 1000, 1000)}))
    assert meta.fleet_compute_seconds == 0.0
    assert meta.models["m"].cost_per_item == 1.0
    assert meta.workers["m"] == (A, B)
    # A model first seen on the joining worker adopts its lifetime average.
    meta = tracker.refresh(poll(a={"m": c(1.0, 1, 1)}, b={"n": c(6.0, 2, 3)}))
    assert meta.models["n"].cost_per_item == 2.0


def test_one_worker_restarting_leaves_the_others_counting() -> None:
    tracker = RoutingMetaTracker(halflife=4.0)
    tracker.refresh(poll(a={"m": c(10.0, 10, 10)}, b={"m": c(10.0, 10, 10)}))
    meta = tracker.refresh(poll(a={"m": c(14.0, 12, 12)}, b={"m": c(0.5, 1, 1)}))
    assert meta.fleet_compute_seconds == 4.0
    assert meta.models["m"].cost_per_item == pytest.approx(ewma(1.0, 2.0, 4.0, 4.0))


# --- locators, max batch, item counts -----------------------------------------------


def test_locator_is_kept_when_a_poll_reports_none() -> None:
    tracker = RoutingMetaTracker(halflife=1.0)
    tracker.refresh(
        poll(a={"m": c(0, 0, 0, max_batch_size=32, batch_input_name="x", batch_axis=2)})
    )
    meta = tracker.refresh(poll(a={"m": c(0, 0, 0, max_batch_size=32)}))  # mid-reload
    assert (meta.models["m"].batch_input, meta.models["m"].batch_axis) == ("x", 2)
    meta = tracker.refresh(
        poll(a={"m": c(0, 0, 0, max_batch_size=32, batch_input_name="y", batch_axis=1)})
    )
    assert (meta.models["m"].batch_input, meta.models["m"].batch_axis) == ("y", 1)


def test_first_nonempty_locator_in_poll_order_and_largest_max_batch() -> None:
    tracker = RoutingMetaTracker(halflife=1.0)
    meta = tracker.refresh(
        poll(
            a={"m": c(0, 0, 0, max_batch_size=8, weight_nbytes=100)},
            b={"m": c(0, 0, 0, max_batch_size=16, batch_input_name="x", batch_axis=1)},
        )
    )
    assert meta.models["m"] == ModelMeta(max_batch=16, batch_input="x", batch_axis=1)
    assert meta.weight_nbytes == {"m": 100}


def test_a_model_with_a_cost_stays_published_when_no_worker_reports_it() -> None:
    tracker = RoutingMetaTracker(halflife=1.0)
    tracker.refresh(poll(a={"m": c(4.0, 2, 2, max_batch_size=8, batch_input_name="x")}))
    meta = tracker.refresh(poll(a={}))
    assert meta.models["m"].max_batch == 8
    assert meta.models["m"].batch_input == "x"
    assert meta.models["m"].cost_per_item == 2.0


def test_memory_facts_of_this_poll() -> None:
    tracker = RoutingMetaTracker(halflife=1.0)
    polled = {
        A: WorkerCounters({"m": c(0, 0, 0, weight_nbytes=5)}, weight_cache_max_bytes=10),
        B: WorkerCounters({"m": c(0, 0, 0, weight_nbytes=7)}, weight_cache_max_bytes=20),
    }
    meta = tracker.refresh(polled)
    assert meta.weight_nbytes == {"m": 7}
    assert meta.weight_cache_max_bytes == {A: 10, B: 20}
    assert meta.polled == (A, B)


@pytest.fixture
def batched() -> RoutingMeta:
    tracker = RoutingMetaTracker(halflife=1.0)
    return tracker.refresh(
        poll(
            a={
                "batched": c(0, 0, 0, max_batch_size=32, batch_input_name="x", batch_axis=2),
                "unbatched": c(0, 0, 0, max_batch_size=0),
                # A meta reports no axis even if its client inputs have one.
                "meta": c(0, 0, 0, max_batch_size=0),
            }
        )
    )


@pytest.mark.parametrize(
    ("model", "payload", "items"),
    [
        ("batched", body([3, 32]), 32),
        ("batched", body([3, 0]), 1),  # zero extent
        ("batched", body([3]), 1),  # too few dimensions
        ("batched", body([3, 32], name="other"), 1),  # input absent
        ("unbatched", body([3, 32]), 1),
        ("meta", body([32, 3]), 1),
        ("meta", body([3, 32]), 1),
        ("never-polled", body([3, 32]), 1),
    ],
)
def test_request_items(batched: RoutingMeta, model: str, payload: bytes, items: int) -> None:
    assert batched.request_items(model, payload) == items


def test_snapshots_are_immutable(batched: RoutingMeta) -> None:
    with pytest.raises(AttributeError):
        batched.generation = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        batched.models["x"] = ModelMeta()  # type: ignore[index]


# --- agreement with docs/original.md §4.3 when the polled set is stable -------------------


def reference_costs(
    polls: list[dict[str, dict[str, tuple[float, int, int]]]], halflife: float
) -> dict[str, tuple[float, float]]:
    """the original's summed-over-workers derivation, written out directly."""
    previous: dict[str, tuple[float, int, int]] = {}
    per_request: dict[str, float] = {}
    per_item: dict[str, float] = {}
    fleet = 0.0
    for answers in polls:
        sums: dict[str, tuple[float, int, int]] = {}
        for models in answers.values():
            for m, (comp, req, rows) in models.items():
                s = sums.get(m, (0.0, 0, 0))
                sums[m] = (s[0] + comp, s[1] + req, s[2] + rows)
        now = sum(s[0] for s in sums.values())
        dt = 0.0 if fleet == 0 or now - fleet <= 0 else now - fleet
        fleet = now
        for m, (comp, req, rows) in sums.items():
            pc, pr, pw = previous.get(m, (0.0, 0, 0))
            previous[m] = (comp, req, rows)
            dc, dr, dw = comp - pc, req - pr, rows - pw
            if dc < 0 or dr < 0 or dw < 0:
                continue
            if dr > 0:
                old = per_request.get(m, 0.0)
                per_request[m] = ewma(old or dc / dr, dc / dr, dt, halflife)
            if dw > 0:
                old = per_item.get(m, 0.0)
                per_item[m] = ewma(old or dc / dw, dc / dw, dt, halflife)
    costed = set(per_request) | set(per_item)
    return {m: (per_request.get(m, 0.0), per_item.get(m, 0.0)) for m in costed}


increments = st.tuples(
    st.floats(0.0, 100.0, allow_nan=False), st.integers(0, 50), st.integers(0, 500)
)


@given(
    st.lists(
        st.fixed_dictionaries({"a": increments, "b": increments, "c": increments}),
        min_size=1,
        max_size=6,
    ),
    st.floats(0.1, 100.0),
)
def test_agrees_with_reference_when_every_worker_answers_every_poll(
    steps: list[dict[str, tuple[float, int, int]]], halflife: float
) -> None:
    # Workers A and B serve m; A also serves n. Counters only grow, A starts busy.
    pairs = {(A, "m"): "a", (B, "m"): "b", (A, "n"): "c"}
    totals = {pair: (1.0, 1, 1) for pair in pairs}
    polls: list[dict[str, dict[str, tuple[float, int, int]]]] = []
    for step in steps:
        answers: dict[str, dict[str, tuple[float, int, int]]] = {A: {}, B: {}}
        for (url, model), key in pairs.items():
            comp, req, rows = totals[(url, model)]
            dc, dr, dw = step[key]
            totals[(url, model)] = (comp + dc, req + dr, rows + dw)
            answers[url][model] = totals[(url, model)]
        polls.append(answers)
    tracker = RoutingMetaTracker(halflife)
    for answers in polls:
        meta = tracker.refresh(
            {
                url: WorkerCounters({m: c(*counts) for m, counts in models.items()})
                for url, models in answers.items()
            }
        )
    expected = reference_costs(polls, halflife)
    assert set(meta.models) == set(expected)
    for model, (per_request, per_item) in expected.items():
        assert meta.models[model].cost_per_request == pytest.approx(per_request)
        assert meta.models[model].cost_per_item == pytest.approx(per_item)
