"""Which models to look for on workers without an index (rsgw.scheduling.fleet._lookups)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.fleet._lookups import ModelLookups


def test_configured_models_are_always_candidates_and_found_ones_join_them() -> None:
    lookups = ModelLookups(["a", "b", "a"], found_ttl=60.0)
    assert lookups.candidates(0.0) == ("a", "b")
    assert lookups.begin("c", 0.0)
    lookups.end("c", True, 0.0)
    assert lookups.candidates(1.0) == ("a", "b", "c")
    lookups.seen({"c"}, 50.0)  # a round found it: kept
    assert lookups.candidates(100.0) == ("a", "b", "c")
    assert lookups.candidates(111.0) == ("a", "b")  # no round found it for 60 s


def test_one_lookup_per_model_at_a_time_and_a_miss_is_remembered() -> None:
    lookups = ModelLookups(miss_ttl=10.0)
    assert lookups.begin("x", 0.0)
    assert lookups.looking("x")
    assert not lookups.begin("x", 0.0)  # the second caller waits for the first
    lookups.end("x", False, 1.0)
    assert not lookups.begin("x", 5.0)  # found nowhere a moment ago
    assert lookups.begin("x", 11.0)
    lookups.abandon("x")  # cut short: nothing learned
    assert lookups.begin("x", 11.5)


def test_lookups_are_rate_limited_per_second() -> None:
    lookups = ModelLookups(per_second=3)
    assert [lookups.begin(f"m{i}", 0.5) for i in range(5)] == [True] * 3 + [False] * 2
    assert lookups.begin("m9", 1.6)
    assert not ModelLookups(per_second=0).begin("m", 0.0)


@given(st.lists(st.tuples(st.text(max_size=3), st.booleans()), max_size=60))
def test_memory_stays_bounded(outcomes: list[tuple[str, bool]]) -> None:
    lookups = ModelLookups(per_second=1000, max_models=8, miss_ttl=1e9, found_ttl=1e9)
    for model, found in outcomes:
        if lookups.begin(model, 0.0):
            lookups.end(model, found, 0.0)
        assert len(lookups._found) + len(lookups._missed) <= 8
        assert not lookups._looking
