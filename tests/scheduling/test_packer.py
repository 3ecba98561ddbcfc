"""The packer state machine: tick, repack, compaction (docs/original.md §4.6.2-§4.6.5)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.calls._meta import ModelCounters, WorkerCounters, ewma
from rsgw.scheduling.knobs._knobs import CompactionMode, Replicas, SchedulingMode
from rsgw.scheduling.knobs._settings import ModelOverride, SchedulingConfig
from rsgw.scheduling.placement._packer import MAX_DEFERRED_TICKS, Packer, _moves
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._reports import (
    CompactionPlan,
    PollSummary,
    TickOutcome,
    summarize_poll,
)

W = ("http://w0", "http://w1")
W3 = ("http://w0", "http://w1", "http://w2")


def knobs(
    *,
    first: float = 10.0,
    rebalance: float = 100.0,
    halflife: float = 0.0,
    mode: CompactionMode = CompactionMode.OFF,
    interval: int = 1,
    replicas: Mapping[str, Replicas] | None = None,
    default_replicas: Replicas = 1,
    forbid: bool = False,
) -> SchedulingConfig:
    return SchedulingConfig(
        mode=SchedulingMode.LPT_PACKING,
        rebalance_compute_seconds=rebalance,
        first_rebalance_compute_seconds=first,
        ema_halflife_compute_seconds=halflife,
        hysteresis=0.0,
        default_replicas=default_replicas,
        forbid_memory_oversubscription=forbid,
        compaction_mode=mode,
        compaction_interval=interval,
        models={m: ModelOverride(replicas=r) for m, r in (replicas or {}).items()},
    )


def poll(
    fleet: float,
    *,
    workers: Sequence[str] = W,
    models: Mapping[str, Sequence[str]] | None = None,
    sums: Mapping[str, tuple[float, int, int]] | None = None,
    mem: Mapping[str, int] | None = None,
    cap: int = 0,
) -> PollSummary:
    """A summary where every model in `models` (default: "a" everywhere) is reported."""
    reporters = {"a": workers} if models is None else models
    return PollSummary(
        served={workers[0]: {m: (c, r) for m, (c, r, _) in (sums or {}).items()}},
        mem=dict(mem or {}),
        mem_cap=dict.fromkeys(workers, cap),
        workers={m: tuple(urls) for m, urls in reporters.items()},
        polled=tuple(workers),
        fleet_compute=fleet,
    )


def run(packer: Packer, summary: PollSummary, k: SchedulingConfig, now: float = 0.0) -> TickOutcome:
    return packer.tick(summary, k, summary.polled, now)


# -- summarize_poll ---------------------------------------------------------------------


def test_summarize_poll_sums_counters_and_keeps_poll_facts() -> None:
    answers = {
        "http://w0": WorkerCounters(
            {"a": ModelCounters(2.0, 10, 20, 8, "x", 1, 100)}, weight_cache_max_bytes=1000
        ),
        "http://w1": WorkerCounters(
            {
                "a": ModelCounters(3.0, 5, 5, 16, "", 0, 300),
                "b": ModelCounters(1.0, 1, 1, 0, "y", 2, 50),
            },
            weight_cache_max_bytes=2000,
        ),
    }
    summary = summarize_poll(answers)
    assert summary.served == {
        "http://w0": {"a": (2.0, 10)},
        "http://w1": {"a": (3.0, 5), "b": (1.0, 1)},
    }
    assert summary.mem == {"a": 300, "b": 50}
    assert summary.max_batch == {"a": 16, "b": 0}
    assert summary.batch_at == {"a": ("x", 1), "b": ("y", 2)}
    assert summary.mem_cap == {"http://w0": 1000, "http://w1": 2000}
    assert summary.workers == {"a": ("http://w0", "http://w1"), "b": ("http://w1",)}
    assert summary.polled == ("http://w0", "http://w1")
    assert summary.fleet_compute == 6.0
    assert summarize_poll(answers, fleet_compute=42.0).fleet_compute == 42.0


# -- tick: compute accounting and triggers ----------------------------------------------


def test_first_tick_only_baselines_compute() -> None:
    packer = Packer()
    outcome = run(packer, poll(500.0), knobs())
    assert outcome.repack is None
    assert packer.compute_accum == 0.0
    assert outcome.tick.compute_accum == 0.0
    assert outcome.tick.fleet_compute == 500.0
    assert outcome.tick.ready == W


def test_first_budget_then_rebalance_budget() -> None:
    packer = Packer()
    k = knobs(first=10.0, rebalance=100.0)
    run(packer, poll(100.0), k)
    assert run(packer, poll(105.0), k).repack is None
    assert packer.compute_accum == 5.0
    outcome = run(packer, poll(111.0), k)
    assert outcome.repack is not None and outcome.repack.trigger == "compute"
    assert outcome.repack.compute_seconds == 11.0
    assert packer.did_first_tick_repack and packer.compute_accum == 0.0
    # [9] kept: the report shows the threshold this tick compared against.
    assert outcome.tick.threshold == 10.0 and outcome.tick.compute_accum == 0.0
    outcome = run(packer, poll(160.0), k)
    assert outcome.repack is None and outcome.tick.threshold == 100.0
    assert run(packer, poll(210.0), k).repack is None  # 99 < 100
    outcome = run(packer, poll(211.0), k)
    assert outcome.repack is not None and outcome.repack.count == 2


def test_zero_first_budget_uses_rebalance_budget() -> None:
    packer = Packer()
    k = knobs(first=0.0, rebalance=50.0)
    run(packer, poll(1.0), k)
    outcome = run(packer, poll(40.0), k)
    assert outcome.repack is None and outcome.tick.threshold == 50.0
    assert run(packer, poll(51.0), k).repack is not None


@given(st.floats(0.0, 1e6), st.integers(1, 20))
def test_idle_fleet_never_repacks(fleet: float, ticks: int) -> None:
    packer = Packer()
    k = knobs(first=1e-9, rebalance=1e-9)
    for i in range(ticks):
        assert run(packer, poll(fleet), k, now=float(i)).repack is None
    assert packer.compute_accum == 0.0


def test_restart_rebaselines_without_counting() -> None:
    packer = Packer()
    k = knobs()
    run(packer, poll(100.0), k)
    run(packer, poll(104.0), k)
    assert run(packer, poll(50.0), k).tick.compute_accum == 4.0
    assert run(packer, poll(53.0), k).tick.compute_accum == 7.0


@given(st.lists(st.floats(0.0, 1e4), min_size=1, max_size=30))
def test_accumulated_compute_is_the_sum_of_positive_deltas(fleets: list[float]) -> None:
    packer = Packer()
    k = knobs(first=1e12, rebalance=1e12)
    expected = 0.0
    last = 0.0
    for fleet in fleets:
        if last != 0 and fleet > last:
            expected += fleet - last
        last = fleet
        run(packer, poll(fleet), k)
    assert packer.compute_accum == pytest.approx(expected)


def test_operator_requests_coalesce_into_one_forced_repack() -> None:
    packer = Packer()
    k = knobs()
    assert packer.last_tick is None
    assert (packer.request_repack(), packer.request_repack()) == (1, 2)
    assert packer.repack_completed == 0
    outcome = run(packer, poll(100.0), k)  # first tick, no compute at all
    assert outcome.repack is not None and outcome.repack.trigger == "operator"
    assert packer.repack_completed == 2
    assert not packer.did_first_tick_repack  # an operator repack spends no budget
    assert run(packer, poll(100.0), k).repack is None  # served: nothing pending
    assert packer.request_repack() == 3
    assert run(packer, poll(100.0), k).repack is not None
    assert packer.repack_completed == 3


def test_a_tick_with_no_answering_worker_never_repacks() -> None:
    packer = Packer()
    k = knobs()
    run(packer, poll(1.0, models={"a": W}), k)  # baseline
    placed = run(packer, poll(50.0), k).repack  # first budget spent: a compute repack
    assert placed is not None and packer.assignment
    assert packer.request_repack() == 1
    silent = PollSummary(fleet_compute=500.0)  # every poll failed this round
    assert packer.tick(silent, k, W, 1.0).repack is None
    assert packer.assignment == placed.assignment  # kept, not emptied
    assert packer.repack_completed == 0  # still pending
    served = run(packer, poll(500.0), k)
    assert served.repack is not None and served.repack.trigger == "operator"
    assert packer.repack_completed == 1


def test_a_compute_repack_waits_a_few_ticks_for_a_complete_poll() -> None:
    packer = Packer()
    k = knobs()
    run(packer, poll(1.0, workers=W3, models={"a": W3}), k)  # baseline
    partial = poll(50.0, workers=W, models={"a": W})  # w2 is ready but did not answer
    for _ in range(MAX_DEFERRED_TICKS):
        assert packer.tick(partial, k, W3, 1.0).repack is None
    assert packer.tick(partial, k, W3, 1.0).repack is not None  # not forever
    packer = Packer()
    run(packer, poll(1.0, workers=W3, models={"a": W3}), k)
    assert packer.tick(partial, k, W3, 1.0).repack is None
    complete = packer.tick(poll(60.0, workers=W3, models={"a": W3}), k, W3, 2.0)
    assert complete.repack is not None and complete.repack.polled == W3


def test_an_operator_repack_does_not_wait_for_a_complete_poll() -> None:
    packer = Packer()
    packer.request_repack()
    partial = poll(1.0, workers=W, models={"a": W})
    assert packer.tick(partial, knobs(), W3, 1.0).repack is not None


# -- repack: rates, costs, utilization --------------------------------------------------


def test_arrivals_fold_into_rate_on_the_compute_clock() -> None:
    packer = Packer(known_models=["a"])
    k = knobs(first=0.0, rebalance=10.0, halflife=10.0)
    run(packer, poll(100.0), k, now=0.0)
    run(packer, poll(110.0), k, now=5.0)  # first repack: wall 0, rate sample 0
    assert packer.rates() == {}
    for _ in range(20):
        assert packer.record_arrival("a")
    outcome = run(packer, poll(120.0), k, now=15.0)  # 10 s wall, 10 compute-s = halflife
    assert outcome.repack is not None and outcome.repack.wall_seconds == 10.0
    assert packer.rates()["a"] == pytest.approx(2.0)  # the first sample is adopted
    assert packer.pending_arrivals() == {}
    for _ in range(40):
        packer.record_arrival("a")
    run(packer, poll(130.0), k, now=25.0)  # 4/s over 10 s, one halflife of compute
    assert packer.rates()["a"] == pytest.approx(3.0)  # halfway from 2/s to 4/s


def test_zero_compute_repack_discards_arrivals_kept_bug_7() -> None:
    packer = Packer(known_models=["a"])
    k = knobs(halflife=10.0)
    packer.request_repack()
    run(packer, poll(100.0), k, now=0.0)
    for _ in range(50):
        packer.record_arrival("a")
    packer.request_repack()
    outcome = run(packer, poll(100.0), k, now=10.0)  # operator repack, no compute
    assert outcome.repack is not None and outcome.repack.compute_seconds == 0.0
    assert packer.pending_arrivals() == {}
    assert packer.rates().get("a", 0.0) == 0.0  # the 5/s sample was dropped unblended


def test_a_first_rate_sample_is_adopted_even_after_a_repack_without_compute() -> None:
    packer = Packer(known_models=["a"])
    k = knobs(first=0.0, rebalance=1e9, halflife=10.0)
    run(packer, poll(100.0), k, now=0.0)  # baseline
    for _ in range(20):
        packer.record_arrival("a")
    packer.request_repack()
    run(packer, poll(100.0), k, now=5.0)  # no compute since: the counts are dropped
    assert "a" not in packer.rates()
    for _ in range(20):
        packer.record_arrival("a")
    packer.request_repack()
    run(packer, poll(101.0), k, now=15.0)  # 2/s over 10 s, 1 compute-second
    assert packer.rates()["a"] == pytest.approx(2.0)


def test_costs_per_request_from_deltas() -> None:
    packer = Packer()
    k = knobs(first=0.0, rebalance=10.0, halflife=10.0)
    run(packer, poll(100.0), k)
    first = run(packer, poll(110.0, sums={"a": (10.0, 100, 100)}), k)
    assert first.repack is not None and first.repack.cost["a"] == pytest.approx(0.1)
    assert packer.cost_snapshot == {"a": pytest.approx(0.1), "": pytest.approx(0.1)}
    second = run(packer, poll(130.0, sums={"a": (30.0, 200, 200)}), k)
    assert second.repack is not None
    assert second.repack.cost["a"] == pytest.approx(ewma(0.1, 0.2, 20.0, 10.0))
    # A restart (negative delta) re-baselines and leaves the cost alone.
    third = run(packer, poll(140.0, sums={"a": (1.0, 5, 5)}), k)
    assert third.repack is not None and third.repack.cost == second.repack.cost


def test_a_worker_missing_a_poll_keeps_its_cost_baseline() -> None:
    """w0 costs 0.1 s per request, w1 0.2 s; w1 misses the middle repack's poll. With
    baselines per (worker, model), every request's work is counted once: the middle
    sample is w0's alone, the last one w0's new work plus w1's two intervals. (Deltas of
    fleet-wide sums read the miss as a restart, skipped the sample, and then gave 0.175.)
    A halflife of almost nothing makes each cost the latest sample."""
    packer = Packer()
    k = knobs(first=0.0, rebalance=1e9, halflife=1e-9)

    def served(n: int, *, w1: bool = True) -> PollSummary:
        counts = {"http://w0": {"a": (0.1 * n, n)}}
        if w1:
            counts["http://w1"] = {"a": (0.2 * n, n)}
        return dataclasses.replace(poll(0.0), served=counts, fleet_compute=100.0 + n)

    packer.tick(served(0), k, W, 0.0)  # the fleet-compute baseline
    for n, w1, cost in ((100, True, 0.15), (200, False, 0.1), (300, True, 50.0 / 300)):
        packer.request_repack()
        outcome = packer.tick(served(n, w1=w1), k, W, float(n))
        assert outcome.repack is not None
        assert packer.cost_snapshot["a"] == pytest.approx(cost)


def test_utilization_is_rate_times_cost() -> None:
    packer = Packer(known_models=["a", "b"])
    k = knobs(first=0.0, rebalance=10.0, halflife=10.0)
    models = {"a": W, "b": W}
    run(packer, poll(100.0, models=models), k, now=0.0)
    run(packer, poll(110.0, models=models, sums={"a": (0.0, 0, 0)}), k, now=0.0)
    for _ in range(10):
        packer.record_arrival("a")
    outcome = run(packer, poll(120.0, models=models, sums={"a": (5.0, 10, 10)}), k, now=10.0)
    assert outcome.repack is not None
    assert outcome.repack.utilization == {"a": pytest.approx(1.0 * 0.5), "b": 0.0}
    assert set(outcome.repack.assignment) == {"a", "b"}


def test_drifted_model_gets_a_uniform_placement_and_a_warning() -> None:
    packer = Packer()
    packer.request_repack()
    outcome = run(packer, poll(1.0, workers=W3, models={"a": W3, "b": W3[1:]}), knobs())
    report = outcome.repack
    assert report is not None
    assert report.drifted == {"b"}
    assert report.assignment["b"] == Placement(((W3[1], 0.5), (W3[2], 0.5)))
    assert len(report.assignment["a"]) == 1
    assert "b" not in report.utilization
    assert [(w.model, w.replicas, w.ready) for w in report.drift_warnings] == [("b", W3[1:], 3)]
    assert report.models == report.log.models == 2


def test_unknown_model_arrivals_are_not_counted() -> None:
    packer = Packer(known_models=["a"])
    assert packer.record_arrival("a")
    assert not packer.record_arrival("typo")
    assert packer.pending_arrivals() == {"a": 1}
    run(packer, poll(1.0, models={"a": W, "b": W}), knobs())
    assert packer.known_models == {"a", "b"}
    assert packer.record_arrival("b")
    assert not packer.record_arrival("typo")


def test_oversubscription_findings() -> None:
    packer = Packer()
    packer.request_repack()
    outcome = run(
        packer,
        poll(1.0, models={"a": W, "b": W}, mem={"a": 70, "b": 70}, cap=100),
        knobs(default_replicas=2),
    )
    assert outcome.repack is not None
    assert [(o.worker, o.assigned, o.budget) for o in outcome.repack.oversubscribed] == [
        (W[0], 140, 100),
        (W[1], 140, 100),
    ]


def test_repack_log_fields() -> None:
    packer = Packer()
    k = knobs(first=0.0, rebalance=1.0)
    run(packer, poll(1.0), k, now=0.0)
    outcome = run(packer, poll(2.23456), k, now=3.14)
    assert outcome.repack is not None
    log = outcome.repack.log
    assert (log.models, log.moved, log.held_by_hysteresis, log.hysteresis) == (1, 0, 0, 0.0)
    assert log.compute_seconds == 1.23 and log.wall_seconds == 0.0


# -- moves -------------------------------------------------------------------------------


def p(*urls: str) -> Placement:
    return Placement(tuple((u, 1.0 / len(urls)) for u in sorted(urls)))


def test_moves_counts_changed_sets_and_dropped_models() -> None:
    previous = {"a": p("w0"), "b": p("w0", "w1"), "c": p("w2"), "d": p("w1")}
    placed = {"a": p("w1"), "b": p("w1", "w0"), "d": p("w1"), "new": p("w3")}
    moved, changed = _moves(previous, placed)
    assert moved == 1  # a; b is the same set, c dropped, new is an initial placement
    assert changed == {"w0", "w1", "w2"}


def test_repack_reports_moves_from_a_replica_change() -> None:
    packer = Packer()
    packer.request_repack()
    first = run(packer, poll(1.0, workers=W3), knobs())
    assert first.repack is not None and first.repack.moved == 0
    assert first.repack.changed_workers == frozenset()
    packer.request_repack()
    second = run(packer, poll(1.0, workers=W3), knobs(replicas={"a": 2}))
    assert second.repack is not None and second.repack.moved == 1
    (before,) = first.repack.assignment["a"].urls
    after = set(second.repack.assignment["a"].urls)
    assert second.repack.changed_workers == after - {before}
    assert packer.assignment is second.repack.assignment


# -- compaction cadence ------------------------------------------------------------------


def flip(packer: Packer, k: SchedulingConfig, count: int) -> CompactionPlan | None:
    """One operator repack that changes "a" between 1 and 2 replicas."""
    packer.request_repack()
    k = dataclasses.replace(k, models={"a": ModelOverride(replicas=1 + count % 2)})
    outcome = run(packer, poll(1.0, workers=W3), k)
    assert outcome.repack is not None
    return outcome.compaction


@pytest.mark.parametrize(
    ("mode", "interval"),
    [(CompactionMode.OFF, 1), (CompactionMode.EAGER, 0), (CompactionMode.SCHEDULED, 0)],
)
def test_compaction_off_or_interval_zero_never_fires(mode: CompactionMode, interval: int) -> None:
    packer = Packer()
    k = knobs(mode=mode, interval=interval)
    assert all(flip(packer, k, i) is None for i in range(6))
    assert packer.repacks_since_compaction == 0


def test_eager_compaction_fires_every_second_changing_repack() -> None:
    packer = Packer()
    k = knobs(mode=CompactionMode.EAGER, interval=2)
    assert flip(packer, k, 0) is None  # initial placement: counts, changes nothing
    plan = flip(packer, k, 1)
    assert plan is not None and plan.mode is CompactionMode.EAGER
    assert plan.reloads and all(models == () for models in plan.reloads.values())
    assert packer.repacks_since_compaction == 0
    assert flip(packer, k, 2) is None
    assert flip(packer, k, 3) is not None


def test_compaction_waits_for_a_placement_change() -> None:
    packer = Packer()
    k = knobs(mode=CompactionMode.EAGER, interval=1)
    packer.request_repack()
    run(packer, poll(1.0, workers=W3), k)
    for _ in range(3):  # same inputs, same placement: no changed workers
        packer.request_repack()
        assert run(packer, poll(1.0, workers=W3), k).compaction is None
    assert packer.repacks_since_compaction == 4
    assert flip(packer, k, 1) is not None


def test_scheduled_compaction_reloads_each_changed_workers_models() -> None:
    packer = Packer()
    k = knobs(mode=CompactionMode.SCHEDULED, interval=1)
    models = {"a": W3, "b": W3}
    packer.request_repack()
    run(packer, poll(1.0, workers=W3, models=models), k)
    packer.request_repack()
    k2 = dataclasses.replace(k, models={"a": ModelOverride(replicas="all")})
    outcome = run(packer, poll(1.0, workers=W3, models=models), k2)
    assert outcome.repack is not None and outcome.compaction is not None
    assignment = outcome.repack.assignment
    assert set(outcome.compaction.reloads) == outcome.repack.changed_workers
    for worker, reload in outcome.compaction.reloads.items():
        expected = sorted(m for m, placement in assignment.items() if worker in placement.urls)
        assert list(reload) == expected and "a" in reload
