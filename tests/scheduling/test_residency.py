"""Residency by value (`rsgw.scheduling.placement._residency`): where a cold model is loaded and
what is evicted first. Properties over random fleets: never over budget, never a
copy with calls in flight, within its minimum residency or at its model's floor,
no needless eviction, free room before any eviction, the least valuable first."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.placement._residency import (
    ColdLoad,
    LoadTimes,
    ModelTerms,
    NoRoom,
    ResidentCopy,
    WorkerMemory,
    copies_of,
    evictable,
    over_budget,
    plan_cold_load,
)

NOW = 100.0
MIN_RESIDENCY = 10.0
MODELS = [f"m{i}" for i in range(8)]


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[WorkerMemory], dict[str, ModelTerms]]:
    terms = {
        name: ModelTerms(
            demand=draw(st.floats(0, 100)),
            reload_seconds=draw(st.floats(0.1, 5)),
            min_copies=draw(st.integers(0, 1)),
        )
        for name in MODELS
    }
    workers = []
    for w in range(draw(st.integers(1, 4))):
        budget = draw(st.integers(100, 1000))
        copies: dict[str, ResidentCopy] = {}
        used = 0
        for name in draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=5)):
            size = draw(st.integers(10, 400))
            if used + size > budget:
                continue
            used += size
            copies[name] = ResidentCopy(
                name,
                size,
                loaded_at=draw(st.sampled_from([0.0, NOW - 5, NOW - 50])),
                in_flight=draw(st.sampled_from([0, 0, 1])),
            )
        workers.append(WorkerMemory(f"w{w}", budget, copies))
    return workers, terms


@given(fleets(), st.integers(10, 1200), st.sampled_from(["cold", *MODELS]))
def test_a_cold_load_fits_and_evicts_only_what_may_go(
    fleet: tuple[list[WorkerMemory], dict[str, ModelTerms]], size: int, model: str
) -> None:
    workers, terms = fleet
    plan = plan_cold_load(model, size, workers, terms, NOW, MIN_RESIDENCY)
    if isinstance(plan, NoRoom):
        return
    worker = next(w for w in workers if w.url == plan.url)
    assert model not in worker.copies
    counts = copies_of(workers)
    for name in plan.evict:
        copy = worker.copies[name]
        assert evictable(copy, terms[name], counts[name], NOW, MIN_RESIDENCY)
    remaining = {k: v for k, v in worker.copies.items() if k not in plan.evict}
    after = WorkerMemory(
        worker.url, worker.budget, {**remaining, model: ResidentCopy(model, size, NOW)}
    )
    assert not over_budget([after])
    for name in plan.evict:  # none needless: keeping any one of them, it would not fit
        assert after.used + worker.copies[name].size > worker.budget


@given(fleets(), st.integers(10, 1200))
def test_free_room_anywhere_means_no_eviction(
    fleet: tuple[list[WorkerMemory], dict[str, ModelTerms]], size: int
) -> None:
    workers, terms = fleet
    plan = plan_cold_load("cold", size, workers, terms, NOW, MIN_RESIDENCY)
    if any(w.free >= size for w in workers):
        assert isinstance(plan, ColdLoad) and plan.evict == () and plan.cost == 0


def test_the_least_valuable_per_byte_goes_first() -> None:
    old = NOW - 100
    worker = WorkerMemory(
        "w0",
        300,
        {
            "hot": ResidentCopy("hot", 100, old),
            "warm": ResidentCopy("warm", 100, old),
            "cold_big": ResidentCopy("cold_big", 100, old),
        },
    )
    terms = {
        "hot": ModelTerms(demand=50, reload_seconds=2),
        "warm": ModelTerms(demand=5, reload_seconds=2),
        "cold_big": ModelTerms(demand=0.1, reload_seconds=2),
    }
    plan = plan_cold_load("new", 100, [worker], terms, NOW, MIN_RESIDENCY)
    assert plan == ColdLoad("new", "w0", ("cold_big",), 0.2)


def test_busy_young_and_floored_copies_are_kept_and_the_reason_said() -> None:
    worker = WorkerMemory(
        "w0",
        200,
        {
            "busy": ResidentCopy("busy", 100, 0.0, in_flight=2),
            "young": ResidentCopy("young", 100, NOW - 1),
        },
    )
    plan = plan_cold_load("new", 100, [worker], {}, NOW, MIN_RESIDENCY)
    assert isinstance(plan, NoRoom) and plan.may_wait
    assert "calls in flight" in plan.reason
    floored = WorkerMemory("w0", 100, {"kept": ResidentCopy("kept", 100, 0.0)})
    plan = plan_cold_load("new", 100, [floored], {"kept": ModelTerms(min_copies=1)}, NOW, 0)
    assert isinstance(plan, NoRoom) and not plan.may_wait and "min_copies" in plan.reason
    plan = plan_cold_load("huge", 500, [floored], {}, NOW, 0)
    assert isinstance(plan, NoRoom) and not plan.may_wait and "more than any" in plan.reason


def test_ties_go_to_the_packers_choice_then_to_the_most_room() -> None:
    workers = [WorkerMemory("a", 100), WorkerMemory("b", 300), WorkerMemory("c", 200)]
    assert plan_cold_load("m", 50, workers, {}, NOW, 0).url == "b"  # type: ignore[union-attr]
    chosen = plan_cold_load("m", 50, workers, {}, NOW, 0, preferred=["c", "b"])
    assert isinstance(chosen, ColdLoad) and chosen.url == "c"


def test_load_times_are_learned_and_default_until_then() -> None:
    times = LoadTimes(2.0)
    assert times.expected("m") == 2.0 and not times.known("m")
    times.observe("m", 1.0)
    assert times.expected("m") == 1.0
    times.observe("m", 5.0)
    assert times.expected("m") == 2.0  # 1 + (5 - 1) / 4
    times.observe("m", float("nan"))
    assert times.expected("m") == 2.0


def test_a_tail_model_waits_for_a_cheap_copy_to_come_of_age_rather_than_evict_a_hot_one() -> None:
    # One worker, room for two: a hot copy loaded long ago (evictable, worth 100) and a
    # tail copy loaded a moment ago (young, worth 1). A tail model's load waits for the
    # young one rather than evict the hot one; with no cheaper copy coming, it evicts.
    hot = ResidentCopy("hot", 100, loaded_at=0.0)
    young = ResidentCopy("tail1", 100, loaded_at=NOW - 1)
    worker = WorkerMemory("w0", 200, {"hot": hot, "tail1": young})
    terms = {
        "hot": ModelTerms(demand=100.0),
        "tail1": ModelTerms(demand=1.0),
        "tail2": ModelTerms(demand=1.0),
    }
    plan = plan_cold_load("tail2", 100, [worker], terms, NOW, MIN_RESIDENCY)
    assert isinstance(plan, NoRoom) and plan.may_wait
    aged = WorkerMemory("w0", 200, {"hot": hot, "tail1": ResidentCopy("tail1", 100, 0.0)})
    plan = plan_cold_load("tail2", 100, [aged], terms, NOW, MIN_RESIDENCY)
    assert isinstance(plan, ColdLoad) and plan.evict == ("tail1",)
    # Copies of about the same worth are not waited for; nor anything, by recency (LRU).
    near = {**terms, "hot": ModelTerms(demand=3.0)}
    plan = plan_cold_load("tail2", 100, [worker], near, NOW, MIN_RESIDENCY)
    assert isinstance(plan, ColdLoad) and plan.evict == ("hot",)
    plan = plan_cold_load("tail2", 100, [worker], terms, NOW, MIN_RESIDENCY, wait_ratio=None)
    assert isinstance(plan, ColdLoad) and plan.evict == ("hot",)
