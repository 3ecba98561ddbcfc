"""Per-tenant quotas and tenant names as labels: bounded, whatever the clients send."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.calls._quotas import (
    CONCURRENCY,
    OTHER,
    RATE,
    Quota,
    Quotas,
    QuotaVerdict,
    TenantLabels,
    TokenBucket,
    tenant_name,
)

rates = st.floats(0.01, 1000.0)
bursts = st.floats(1.0, 100.0)
steps = st.lists(st.floats(0.0, 2.0), max_size=300)


@given(rates, bursts, steps)
def test_a_bucket_never_grants_more_than_its_burst_and_rate(
    rate: float, burst: float, gaps: list[float]
) -> None:
    bucket = TokenBucket(rate, burst, now=0.0)
    now = 0.0
    granted = 0
    for gap in gaps:
        now += gap
        wait = bucket.take(now)
        if wait is None:
            granted += 1
        else:
            assert 0.0 < wait <= 1.0 / rate + 1e-9
        assert granted <= burst + rate * now + 1e-6


@given(rates, bursts)
def test_the_wait_told_is_when_a_token_is_there(rate: float, burst: float) -> None:
    bucket = TokenBucket(rate, burst, now=0.0)
    while bucket.take(0.0) is None:
        pass
    wait = bucket.take(0.0)
    assert wait is not None
    assert bucket.take(wait * (1 + 1e-9) + 1e-12) is None


def test_a_reconfigured_bucket_keeps_its_fill_capped() -> None:
    bucket = TokenBucket(rate=10.0, burst=20.0, now=0.0)
    for _ in range(15):
        assert bucket.take(0.0) is None
    bucket.configure(rate=1.0, burst=2.0, now=0.0)  # 5 saved: capped at 2
    assert bucket.take(0.0) is None
    assert bucket.take(0.0) is None
    assert bucket.take(0.0) == pytest.approx(1.0)
    bucket.configure(rate=1.0, burst=50.0, now=0.0)  # a larger burst is not a gift
    assert bucket.take(0.0) == pytest.approx(1.0)
    assert bucket.take(3.0) is None


def test_quotas_limit_rate_and_concurrency_and_name_the_limit() -> None:
    quotas = Quotas()
    quotas.configure("x", Quota(rate=10.0, burst=20.0), now=0.0)
    quotas.configure("y", Quota(concurrency=2), now=0.0)
    for _ in range(20):
        assert quotas.admit("x", 0.0) is None
    verdict = quotas.admit("x", 0.0)
    assert verdict is not None and verdict.retry_after == pytest.approx(0.1)
    assert verdict == QuotaVerdict("x", RATE, Quota(rate=10.0, burst=20.0), verdict.retry_after)
    assert verdict.message == "tenant 'x' is over its rate quota of 10/s (burst 20); retry later"

    assert quotas.admit("y", 0.0) is None
    assert quotas.admit("y", 0.0) is None
    verdict = quotas.admit("y", 0.0)
    assert verdict is not None and verdict.limit == CONCURRENCY and verdict.retry_after is None
    assert verdict.message == (
        "tenant 'y' is over its concurrency quota of 2 calls at once; retry later"
    )
    quotas.release("y")
    assert quotas.held("y") == 1
    assert quotas.admit("y", 0.0) is None

    assert quotas.admit("anyone", 0.0) is None  # no quota: no limit, nothing counted
    quotas.release("anyone")
    assert quotas.held("anyone") == 0


def test_a_refusal_for_concurrency_spends_no_token() -> None:
    quotas = Quotas()
    quotas.configure("z", Quota(rate=1.0, burst=1.0, concurrency=1), now=0.0)
    assert quotas.admit("z", 0.0) is None
    verdict = quotas.admit("z", 0.0)
    assert verdict is not None and verdict.limit == CONCURRENCY
    quotas.release("z")
    verdict = quotas.admit("z", 0.5)
    assert verdict is not None and verdict.limit == RATE
    assert verdict.retry_after == pytest.approx(0.5)
    assert quotas.admit("z", 1.0) is None


def test_quotas_change_at_run_time() -> None:
    quotas = Quotas()
    quotas.configure("x", Quota(rate=1.0, burst=3.0, concurrency=5), now=0.0)
    assert quotas.admit("x", 0.0) is None
    quotas.configure("x", Quota(rate=100.0), now=0.0)  # burst: one second's worth
    assert quotas.quota("x") == Quota(rate=100.0)
    assert quotas.held("x") == 1  # its calls still count
    granted = sum(quotas.admit("x", 0.0) is None for _ in range(200))
    assert granted == 2  # the 2 tokens it had saved, not a fresh burst of 100
    quotas.configure("x", Quota(concurrency=1), now=0.0)  # the rate lifted
    assert quotas.admit("x", 0.0) is not None  # 3 held, at most 1
    quotas.configure("x", None, now=0.0)
    assert quotas.quota("x") is None
    assert quotas.admit("x", 0.0) is None


calls = st.lists(
    st.tuples(
        st.sampled_from(["admit", "release", "sweep"]),
        st.sampled_from(["a", "b", "c", "listed"]),
        st.floats(0.0, 1.0),
    ),
    max_size=200,
)


@given(st.floats(0.5, 20.0), st.integers(1, 3), calls)
def test_sweeping_idle_accounts_changes_no_verdict(
    rate: float, concurrency: int, steps: list[tuple[str, str, float]]
) -> None:
    """Accounts opened on demand and swept whenever idle answer as if kept forever."""
    quota = Quota(rate=rate, burst=2.0, concurrency=concurrency)
    kept, swept = Quotas(), Quotas()
    for quotas in (kept, swept):
        quotas.configure("listed", quota, 0.0)
    now = 0.0
    for action, tenant, gap in steps:
        now += gap
        if action == "sweep":
            swept.sweep({"listed"}, now)
            assert "listed" in swept.tenants()
            continue
        for quotas in (kept, swept):
            if quotas.quota(tenant) is None:
                quotas.configure(tenant, quota, now)
        if action == "admit":
            assert kept.admit(tenant, now) == swept.admit(tenant, now)
        else:
            kept.release(tenant)
            swept.release(tenant)
    assert len(swept) <= len(kept)


def test_a_sweep_keeps_accounts_in_use() -> None:
    quotas = Quotas()
    for tenant in ("holding", "spent", "idle", "listed"):
        quotas.configure(tenant, Quota(rate=1.0, burst=1.0), 0.0)
    assert quotas.admit("holding", 0.0) is None and quotas.admit("spent", 0.0) is None
    quotas.release("spent")
    assert quotas.sweep({"listed"}, 0.5) == 1  # idle: full, holding nothing
    assert sorted(quotas.tenants()) == ["holding", "listed", "spent"]
    assert quotas.sweep({"listed"}, 1.0) == 1  # spent's token is back
    assert sorted(quotas.tenants()) == ["holding", "listed"]


def test_quota_bounds() -> None:
    for kwargs, message in [
        ({"rate": 0.0}, "rate is calls per second, above 0"),
        ({"rate": float("nan")}, "rate is calls per second, above 0"),
        ({"rate": 1.0, "burst": 0.5}, "burst is at least 1 call"),
        ({"concurrency": 0}, "concurrency is at least 1 call"),
    ]:
        with pytest.raises(ValueError, match=message):
            Quota(**kwargs)  # type: ignore[arg-type]


@given(st.integers(0, 50), st.lists(st.text(max_size=6), max_size=400))
def test_labels_stay_bounded(max_tenants: int, names: list[str]) -> None:
    configured = ["gold", "silver"]
    labels = TenantLabels(max_tenants, configured)
    seen = {labels.label(name) for name in names}
    assert labels.label("gold") == "gold"
    assert len(seen - {"gold", "silver", OTHER}) <= max(0, max_tenants - len(configured))
    assert all(labels.label(name) in (name, OTHER) for name in names)


def test_ten_thousand_names_make_a_bounded_set_of_series() -> None:
    labels = TenantLabels(100, ["gold"])
    series = {labels.label(f"tenant-{i}") for i in range(10_000)}
    assert len(series) == 100  # 99 first names and OTHER (gold has its own place)
    assert labels.label("gold") == "gold"
    assert labels.label("tenant-5") == "tenant-5"  # a name keeps its label
    assert labels.label("tenant-9999") == OTHER


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is empty"),
        ("x" * 129, "has 129 characters"),
        ("tab\there", "is not printable ASCII: 'tab\\\\there'"),
        ("café", "is not printable ASCII: 'caf\\\\xe9'"),
    ],
)
def test_a_tenant_header_must_be_printable_ascii(value: str, problem: str) -> None:
    with pytest.raises(ValueError, match=f"x-tenant names a tenant in 1 to 128 .*{problem}"):
        tenant_name(value, "x-tenant")


def test_a_good_tenant_name_is_itself() -> None:
    assert tenant_name("team a/batch-7", "x-tenant") == "team a/batch-7"
    assert tenant_name("x" * 128, "x-tenant") == "x" * 128
