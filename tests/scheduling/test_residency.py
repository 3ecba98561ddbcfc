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
    first_for_room,
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


def test_by_recency_the_least_recently_used_go_first_whatever_their_size() -> None:
    """The LRU baseline (`eviction: lru`) is size-blind, as ModelMesh's and Seldon
    Core's caches are: a small old copy goes before a large newer one, and the worker
    chosen is the one whose newest eviction is the oldest."""
    old = NOW - 100
    w0 = WorkerMemory(
        "w0",
        300,
        {"small_old": ResidentCopy("small_old", 50, old), "big": ResidentCopy("big", 250, old)},
    )
    w1 = WorkerMemory("w1", 300, {"mid": ResidentCopy("mid", 300, old)})
    last_use = {"small_old": 1.0, "big": 2.0, "mid": 1.5}
    terms = {m: ModelTerms(demand=clock, reload_seconds=1.0) for m, clock in last_use.items()}
    plan = plan_cold_load("new", 100, [w0, w1], terms, NOW, MIN_RESIDENCY, by_recency=True)
    # On w0 room takes small_old then big (newest 2); on w1, mid alone (newest 1.5).
    assert plan == ColdLoad("new", "w1", ("mid",), 1.5)
    by_value = plan_cold_load("new", 50, [w0], terms, NOW, MIN_RESIDENCY)
    assert isinstance(by_value, ColdLoad) and by_value.evict == ("big",)  # per byte: 2/250
    assert plan_cold_load("new", 50, [w0], terms, NOW, MIN_RESIDENCY, by_recency=True) == (
        ColdLoad("new", "w0", ("small_old",), 1.0)
    )


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


def test_no_waiting_when_the_cheap_copies_could_make_room_now() -> None:
    """Greedy by value per byte picks one large copy worth more than four times the
    small ones; the small ones could make room now, so there is nothing to wait for:
    the plan evicts whichever gives up less in all (here the large one), and never
    answers "wait" (it stalled every cold model behind it on the long-tail bench)."""
    old = NOW - 100
    copies = {"big": ResidentCopy("big", 200, old)}
    copies |= {f"s{i}": ResidentCopy(f"s{i}", 12, old) for i in range(9)}
    worker = WorkerMemory("w0", 308, copies)
    terms = {"big": ModelTerms(demand=1.0, reload_seconds=1.0)}
    terms |= {f"s{i}": ModelTerms(demand=0.2, reload_seconds=1.0) for i in range(9)}
    plan = plan_cold_load("new", 100, [worker], terms, NOW, MIN_RESIDENCY)
    assert plan == ColdLoad("new", "w0", ("big",), 1.0)
    # Cheaper in all: the small ones go.
    terms |= {f"s{i}": ModelTerms(demand=0.05, reload_seconds=1.0) for i in range(9)}
    plan = plan_cold_load("new", 100, [worker], terms, NOW, MIN_RESIDENCY)
    assert isinstance(plan, ColdLoad) and "big" not in plan.evict
    assert plan.cost < 1.0


def test_cold_models_take_turns_by_demand_but_a_long_wait_goes_first() -> None:
    waiting = ["tail", "warm", "hot"]  # the order they began to wait
    demand = {"hot": 5.0, "warm": 1.0, "tail": 0.01}
    since = {"tail": 9.0, "warm": 9.5, "hot": 9.9}

    def load(model: str) -> float:
        return 0.5

    assert first_for_room(waiting, demand, since, load, now=9.95) == "hot"
    # tail has waited 2 of its loads (1 s): it goes first, whatever its demand.
    assert first_for_room(waiting, demand, since, load, now=10.0) == "tail"
    # Among the overdue, the longest waiting.
    assert first_for_room(waiting, demand, since, load, now=10.6) == "tail"
    assert first_for_room(["warm", "hot"], demand, since, load, now=10.6) == "warm"


def test_a_model_held_everywhere_it_could_go_waits_rather_than_is_refused() -> None:
    """Its copy is loading (start-up's placement) or loaded where the routing table does
    not list it yet: not "cannot be loaded" (a node's first call was refused so)."""
    loading = ResidentCopy("m0", 100, NOW, in_flight=1)
    workers = [WorkerMemory("w0", 10**12, {"m0": loading})]
    plan = plan_cold_load("m0", 100, workers, {}, NOW, MIN_RESIDENCY)
    assert isinstance(plan, NoRoom) and plan.may_wait
