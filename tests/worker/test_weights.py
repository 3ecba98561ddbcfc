"""The weight cache: pins, the LRU of on-demand loads, unpinning and compaction."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.worker.device._weights import Load, Residency, WeightCache

MIB = 1 << 20


def cache(max_bytes: int = 250 * MIB, **floors: Residency) -> WeightCache:
    sizes = {"a": 100 * MIB, "b": 100 * MIB, "c": 100 * MIB, "big": 400 * MIB, "p": 50 * MIB}
    return WeightCache(sizes, max_bytes, floors)


def test_pinned_models_start_resident_and_outside_the_budget() -> None:
    weights = cache(p=Residency.PINNED_DEVICE)
    assert weights.is_resident("p") and weights.is_pinned("p")
    assert not weights.is_resident("a")
    assert weights.floor("a") is Residency.PINNED_SYSTEM
    assert (weights.pinned_bytes, weights.resident_bytes) == (50 * MIB, 0)


def test_loads_evict_the_least_recently_used() -> None:
    weights = cache(p=Residency.PINNED_DEVICE)
    assert weights.load("a", now=1) == Load("a", 100 * MIB)
    assert weights.load("b", now=2) == Load("b", 100 * MIB)
    assert weights.load("a", now=3) is None  # resident: bumped, not loaded
    assert weights.load("c", now=4) == Load("c", 100 * MIB, evicted=("b",))
    assert list(weights.resident_models()) == ["p", "a", "c"]
    assert weights.resident_bytes == 200 * MIB
    assert weights.is_resident("p")  # never a victim


def test_touch_counts_as_use() -> None:
    weights = cache()
    weights.load("a", now=1)
    weights.load("b", now=2)
    weights.touch("a", now=3)
    load = weights.load("c", now=4)
    assert load is not None and load.evicted == ("b",)


def test_a_model_bigger_than_the_budget_evicts_everything_and_loads() -> None:
    weights = cache()
    weights.load("a", now=1)
    weights.load("b", now=2)
    load = weights.load("big", now=3)
    assert load == Load("big", 400 * MIB, evicted=("a", "b"), over_budget=True)
    assert list(weights.resident_models()) == ["big"]


def test_pin_loads_without_evicting_and_promotes_a_resident() -> None:
    weights = cache(max_bytes=100 * MIB)
    weights.load("a", now=1)
    assert weights.pin("a") is None  # already on the device: promoted in place
    assert (weights.pinned_bytes, weights.resident_bytes) == (100 * MIB, 0)
    assert weights.pin("b") == Load("b", 100 * MIB)
    assert weights.pin("b") is None
    assert weights.floor("b") is Residency.PINNED_DEVICE
    assert weights.load("c", now=2) == Load("c", 100 * MIB)  # pins leave the budget alone
    assert set(weights.resident_models()) == {"a", "b", "c"}


def test_unpin_frees_the_device_weights() -> None:
    weights = cache(a=Residency.PINNED_DEVICE)
    assert weights.unpin("a", Residency.UNPINNED)
    assert not weights.is_resident("a") and weights.floor("a") is Residency.UNPINNED
    assert weights.pinned_bytes == 0
    assert not weights.unpin("a", Residency.PINNED_SYSTEM)
    assert weights.floor("a") is Residency.PINNED_SYSTEM
    weights.load("b", now=1)
    assert weights.unpin("b", Residency.PINNED_SYSTEM) and weights.resident_bytes == 0
    with pytest.raises(ValueError, match="below PINNED_DEVICE"):
        weights.unpin("a", Residency.PINNED_DEVICE)


def test_free_unpinned_keeps_the_pins() -> None:
    weights = cache(p=Residency.PINNED_DEVICE)
    weights.load("a", now=1)
    weights.load("b", now=2)
    assert weights.free_unpinned() == ("a", "b")
    assert list(weights.resident_models()) == ["p"]
    assert weights.resident_bytes == 0
    assert weights.free_unpinned() == ()


def test_residency_orders_least_resident_first() -> None:
    assert min(Residency) is Residency.UNPINNED
    assert Residency.PINNED_SYSTEM < Residency.PINNED_DEVICE


OPS = st.lists(
    st.tuples(
        st.sampled_from(["load", "pin", "unpin", "free", "touch"]),
        st.sampled_from(["a", "b", "c", "big", "p"]),
    ),
    max_size=60,
)


@given(OPS, st.integers(0, 500).map(lambda n: n * MIB))
def test_the_budget_and_the_byte_counts_always_hold(
    ops: list[tuple[str, str]], max_bytes: int
) -> None:
    weights = cache(max_bytes, p=Residency.PINNED_DEVICE)
    for now, (op, model) in enumerate(ops):
        if op == "load":
            load = weights.load(model, now)
            assert weights.is_resident(model)
            if load is not None:
                assert model not in load.evicted
                assert not any(weights.is_resident(m) for m in load.evicted)
                assert load.over_budget == (weights.sizes[model] > max_bytes)
                if load.over_budget:
                    assert weights.resident_bytes == weights.sizes[model]
        elif op == "pin":
            weights.pin(model)
        elif op == "unpin":
            weights.unpin(model, Residency.PINNED_SYSTEM)
        elif op == "free":
            weights.free_unpinned()
        else:
            weights.touch(model, now)
        resident = list(weights.resident_models())
        pinned = [m for m in resident if weights.is_pinned(m)]
        on_demand = [m for m in resident if not weights.is_pinned(m)]
        assert len(resident) == len(set(resident))
        assert weights.pinned_bytes == sum(weights.sizes[m] for m in pinned)
        assert weights.resident_bytes == sum(weights.sizes[m] for m in on_demand)
        assert weights.resident_bytes <= max_bytes or len(on_demand) == 1
        for m in weights.sizes:
            assert weights.is_pinned(m) == (weights.floor(m) is Residency.PINNED_DEVICE)
