"""The pure decisions of placing models by load and unload (`_repository_moves`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._repository_moves import plan_moves, settle, uniform

WORKERS = ("a", "b", "c", "d")
MODELS = ("m1", "m2", "m3")

worker_sets = st.sets(st.sampled_from(WORKERS), min_size=1).map(uniform)
assignments = st.dictionaries(st.sampled_from(MODELS), worker_sets)
loaded_sets = st.dictionaries(st.sampled_from(MODELS), st.sets(st.sampled_from(WORKERS)))
handed_sets = st.sets(st.sampled_from(MODELS))
controlled_sets = st.sets(st.sampled_from(WORKERS))


def test_a_move_loads_first_and_unloads_the_old_holder_after() -> None:
    target = {"m1": uniform(["b"])}
    routing = {"m1": uniform(["a"])}
    plan = plan_moves(target, routing, {"m1"}, {"a", "b"}, {"m1": ("a",)})
    assert plan.loads == (("m1", "b"),)
    assert plan.routing == {"m1": uniform(["a"])}  # where it is loaded, meanwhile
    done = settle(plan, {"m1"}, {"a", "b"}, {"m1": ("a", "b")}, set())
    assert done.routing == target
    assert done.unloads == (("m1", "a"),)


def test_a_failed_load_keeps_the_model_where_it_is() -> None:
    loaded = {"m1": ("a",)}
    plan = plan_moves({"m1": uniform(["b"])}, {"m1": uniform(["a"])}, {"m1"}, {"a", "b"}, loaded)
    done = settle(plan, {"m1"}, {"a", "b"}, {"m1": ("a",)}, {("m1", "b")})
    assert done.routing == {"m1": uniform(["a"])}
    assert done.unloads == ()


def test_models_not_handed_are_routed_by_the_target_and_never_touched() -> None:
    target = {"m1": uniform(["b"])}
    plan = plan_moves(target, {}, set(), {"a", "b"}, {"m1": ("a",)})
    assert plan.loads == ()
    assert plan.routing == target
    assert settle(plan, set(), {"a", "b"}, {"m1": ("a",)}, set()).unloads == ()


@given(assignments, assignments, handed_sets, controlled_sets, loaded_sets, st.data())
def test_no_move_unloads_a_models_last_routed_copy(
    target: dict[str, Placement],
    routing: dict[str, Placement],
    handed: set[str],
    controlled: set[str],
    loaded: dict[str, set[str]],
    data: st.DataObject,
) -> None:
    plan = plan_moves(target, routing, handed, controlled, loaded)
    for model, url in plan.loads:
        assert model in handed and url in controlled
        assert url in target[model].urls and url not in loaded.get(model, set())
    for model, placement in plan.routing.items():
        if model in handed and any(m == model for m, _ in plan.loads):
            # Still loading: routed where it is now, never to a holder waiting for a load.
            waiting = {u for m, u in plan.loads if m == model}
            assert not waiting & set(placement.urls)
        else:
            assert placement == target[model]
    failed = data.draw(st.sets(st.sampled_from(plan.loads))) if plan.loads else set()
    after = {m: set(loaded.get(m, set())) for m in MODELS}
    for model, url in plan.loads:
        if (model, url) not in failed:
            after[model].add(url)
    done = settle(plan, handed, controlled, after, failed)
    unloaded: dict[str, set[str]] = {}
    for model, url in done.unloads:
        assert model in handed and url in controlled and url in after[model]
        assert url not in done.routing[model].urls
        unloaded.setdefault(model, set()).add(url)
    for model, urls in unloaded.items():
        # Something routed still serves it: a loaded holder, or one not placed by loading.
        remaining = (after[model] - urls) | (set(WORKERS) - controlled)
        assert remaining & set(done.routing[model].urls)
    for model, placement in done.routing.items():
        if model in handed:
            for url in placement.urls:
                assert (model, url) not in failed


@given(assignments, handed_sets, controlled_sets, loaded_sets)
def test_with_every_load_done_routing_is_the_target_and_only_strays_are_unloaded(
    target: dict[str, Placement],
    handed: set[str],
    controlled: set[str],
    loaded: dict[str, set[str]],
) -> None:
    plan = plan_moves(target, {}, handed, controlled, loaded)
    after = {m: set(loaded.get(m, set())) for m in MODELS}
    for model, url in plan.loads:
        after[model].add(url)
    done = settle(plan, handed, controlled, after, set())
    assert done.routing == target
    expected = sorted(
        (m, u)
        for m in target
        if m in handed
        for u in after[m]
        if u in controlled and u not in target[m].urls
    )
    assert sorted(done.unloads) == expected
