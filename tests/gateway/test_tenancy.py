"""The tenancy shell (issue 52): tenants, bands, quotas and their counts, on real parts.

`Tenancy` is driven with real `CallContext`s and real request bytes, and counts into a
real `GatewayMetrics` registry whose exposition the tests read. The REST door's
`Retry-After` is checked on a real listener with httpx, its ModelInfer a stand-in that
asks a real `Tenancy` for the call's quota, as the gateway's call path does.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
import pytest
import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._auth import Principal, Role
from rsgw.base._call import CallContext
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._tenancy import TenancyConfig, TenantPolicy
from rsgw.gateway.calls._tenancy import (
    ADMITTED,
    ANONYMOUS,
    OUTCOMES,
    PUSHBACK,
    REFUSED_SHARE,
    SWEEP_FROM,
    Tenancy,
)
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.rest._door import RestDoor
from rsgw.rest._listener import RestListener
from rsgw.rest._rest_errors import retry_after
from rsgw.scheduling.calls._quotas import OTHER
from tests.helpers import infer_request

INFER = Method.MODEL_INFER.path


def tenancy(**options: Any) -> Tenancy:
    return Tenancy(TenancyConfig(**options), GatewayMetrics(str), now=0.0)


def call(*metadata: tuple[bytes, bytes], principal: str = "") -> CallContext:
    who = Principal(principal, frozenset({Role.INFER}), "token") if principal else None
    return CallContext(INFER, float("inf"), metadata, "127.0.0.1:1", principal=who)


def head(**parameters: Any) -> bytes:
    """A ModelInferRequest's bytes, with `parameters` set as their kinds say."""
    request = infer_request("m", {"x": np.zeros((1, 4), np.float32)})
    for key, value in parameters.items():
        kind = {bool: "bool_param", int: "int64_param", str: "string_param"}[type(value)]
        setattr(request.parameters[key], kind, value)
    return request.SerializeToString()


def series(metrics_text: str, name: str) -> list[str]:
    return [line for line in metrics_text.splitlines() if line.startswith(name + "{")]


# -- who and which band ---------------------------------------------------------------------


def test_the_tenant_is_the_identity_else_the_header_else_anonymous() -> None:
    t = tenancy(header="x-tenant-id")
    assert t.tenant_of(call((b"x-tenant-id", b"team-a"))) == "team-a"
    assert t.tenant_of(call((b"other", b"x"))) == ""
    # With auth on the identity wins over any header the client sends.
    assert t.tenant_of(call((b"x-tenant-id", b"team-a"), principal="alice")) == "alice"
    assert tenancy().tenant_of(call((b"x-tenant-id", b"team-a"))) == ""


@pytest.mark.parametrize(
    ("value", "problem"),
    [(b"", "is empty"), ("tëam".encode(), "not printable ASCII"), (b"a" * 129, "129 characters")],
)
def test_a_bad_tenant_header_is_invalid_argument_naming_it(value: bytes, problem: str) -> None:
    with pytest.raises(GrpcError) as caught:
        tenancy(header="x-tenant-id").tenant_of(call((b"x-tenant-id", value)))
    assert caught.value.code is StatusCode.INVALID_ARGUMENT
    assert "header 'x-tenant-id' names a tenant" in caught.value.message
    assert problem in caught.value.message


def test_the_band_is_the_calls_priority_else_its_tenants_else_the_default() -> None:
    t = tenancy(
        priority_levels=3,
        tenants={"batch": TenantPolicy(priority=3), "live": TenantPolicy(priority=1)},
    )
    assert t.band(head(priority=1), "batch") == 0  # the call's own wins
    assert t.band(head(), "batch") == 2
    assert t.band(head(priority=0), "live") == 0  # 0 is "the default": the tenant's
    assert t.band(head(), "someone") == 1  # the middle of three
    assert t.band(head(priority=9), "someone") == 2  # a finer scale: the lowest band
    assert tenancy().band(head(priority="high"), "a") == 0  # priorities off: not read


@pytest.mark.parametrize("bad", ["high", -1, True])
def test_a_bad_priority_is_invalid_argument(bad: object) -> None:
    with pytest.raises(GrpcError) as caught:
        tenancy(priority_levels=2).band(head(priority=bad), "a")
    assert caught.value.code is StatusCode.INVALID_ARGUMENT
    assert "parameter 'priority' must be a non-negative integer" in caught.value.message


# -- quotas -----------------------------------------------------------------------------------


def test_over_its_rate_a_tenant_is_told_when_to_come_back() -> None:
    t = tenancy(tenants={"a": TenantPolicy(rate=2.0, burst=2.0)})
    t.admit_quota("a", 0.0)
    t.admit_quota("a", 0.0)
    with pytest.raises(GrpcError) as caught:
        t.admit_quota("a", 0.0, band=0)
    error = caught.value
    assert error.code is StatusCode.RESOURCE_EXHAUSTED
    assert error.message == "tenant 'a' is over its rate quota of 2/s (burst 2); retry later"
    assert error.trailers == ((PUSHBACK, b"500"),)
    assert retry_after(error.trailers) == [(b"retry-after", b"1")]
    t.admit_quota("b", 0.0)  # no quota: never refused
    t.admit_quota("a", 0.5)  # a token came back
    text = t.status(0.5)
    assert [(s.tenant, s.inflight, s.over_quota) for s in text.tenants] == [
        ("a", 3, 1),
        ("b", 1, 0),
    ]


def test_a_concurrency_quota_counts_calls_until_released() -> None:
    t = tenancy(default=TenantPolicy(max_concurrent=1))
    t.admit_quota("", 0.0)
    with pytest.raises(GrpcError) as caught:
        t.admit_quota("", 0.0)
    assert "the anonymous tenant is over its concurrency quota of 1 calls" in str(caught.value)
    assert caught.value.trailers == ()
    t.release_quota("")
    t.admit_quota("", 0.0)
    t.admit_quota("b", 0.0)  # each tenant not listed has the default quota of its own
    (anonymous,) = [s for s in t.status(0.0).tenants if s.tenant == ANONYMOUS]
    assert anonymous.inflight == 1 and not anonymous.listed


def test_a_changed_quota_keeps_the_buckets_fill() -> None:
    t = tenancy(tenants={"a": TenantPolicy(rate=1.0, burst=3.0)})
    for _ in range(3):
        t.admit_quota("a", 0.0)
    t.apply(TenancyConfig(tenants={"a": TenantPolicy(rate=100.0, burst=50.0)}), now=0.0)
    with pytest.raises(GrpcError):  # no fresh burst from the change
        t.admit_quota("a", 0.0)
    t.admit_quota("a", 0.01)  # but the new rate from now on
    t.apply(TenancyConfig(tenants={"a": TenantPolicy(weight=2.0)}), now=0.01)
    for _ in range(100):
        t.admit_quota("a", 0.01)  # the quota lifted
    assert t.shares.weights == {"a": 2.0}


def test_made_up_names_leave_memory_and_series_bounded() -> None:
    metrics = GatewayMetrics(str)
    config = TenancyConfig(
        max_tenant_series=10, tenants={"listed": TenantPolicy()}, default=TenantPolicy(rate=5.0)
    )
    t = Tenancy(config, metrics, now=0.0)
    now = 0.0
    for i in range(10_000):
        now += 0.001
        name = f"tenant-{i}"
        t.admit_quota(name, now, band=0)
        t.counted(name, 0, ADMITTED if i % 2 else REFUSED_SHARE)
        t.release_quota(name)
    text = metrics.render().decode()
    calls = series(text, "gateway_tenant_calls_total")
    inflight = series(text, "gateway_tenant_inflight_calls")
    labels = {line.split('tenant="')[1].split('"')[0] for line in calls}
    assert len(labels) == 10 and OTHER in labels  # nine seen, then the rest as one
    assert len(calls) == 9 + 2 and len(inflight) == 10  # one call each; _other_ both
    assert len(t.quotas) <= 2 * SWEEP_FROM  # idle accounts of the default quota swept
    (other,) = [s for s in t.status(now).tenants if s.tenant == OTHER]
    assert other.admitted + other.refused == 10_000 - 9 and other.inflight == 0


def test_counts_by_band_and_outcome_reach_the_metrics_and_the_status() -> None:
    metrics = GatewayMetrics(str)
    config = TenancyConfig(priority_levels=2, tenants={"a": TenantPolicy(weight=3.0)})
    t = Tenancy(config, metrics, now=0.0)
    for outcome in OUTCOMES:
        t.counted("a", 1, outcome)
    t.counted("b", 0, ADMITTED)
    text = metrics.render().decode()
    assert 'gateway_tenant_calls_total{band="2",outcome="refused_band",tenant="a"} 1.0' in text
    status = t.status(0.0)
    assert (status.priority_levels, status.default_priority) == (2, 1)
    a, b = status.tenants
    assert (a.tenant, a.listed, a.admitted, a.refused, a.over_quota) == ("a", True, 1, 3, 2)
    assert (a.share, b.share) == (0.75, 0.25)
    assert (b.tenant, b.listed, b.policy.weight) == ("b", False, 1.0)


# -- REST: 429 with Retry-After ---------------------------------------------------------------


@asynccontextmanager
async def rest_door(t: Tenancy) -> AsyncIterator[int]:
    """A REST listener whose ModelInfer takes the call's place in its tenant's quota."""

    async def infer(request: Any, call: CallContext) -> bytes:
        tenant = t.tenant_of(call)
        t.admit_quota(tenant, trio.current_time())
        t.release_quota(tenant)
        return pb.ModelInferResponse(model_name="m").SerializeToString()

    door = RestDoor({}, {INFER: infer}, time_limits={}, max_body_bytes=1 << 20)
    listener = RestListener(door)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(listener.serve, "127.0.0.1", 0))
        try:
            yield port
        finally:
            nursery.cancel_scope.cancel()


async def test_rest_answers_a_tenant_over_its_rate_429_with_retry_after() -> None:
    config = TenancyConfig(header="x-tenant-id", default=TenantPolicy(rate=0.25))
    t = Tenancy(config, GatewayMetrics(str), now=trio.current_time())
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    async with rest_door(t) as port, httpx.AsyncClient() as http:
        url = f"http://127.0.0.1:{port}/v2/models/m/infer"
        first = await http.post(url, json=body, headers={"X-Tenant-Id": "a"})
        assert first.status_code == 200, first.text
        over = await http.post(url, json=body, headers={"X-Tenant-Id": "a"})
        assert over.status_code == 429
        assert over.json() == {
            "error": "tenant 'a' is over its rate quota of 0.25/s (burst 1); retry later"
        }
        assert over.headers["retry-after"] == "4"
        other = await http.post(url, json=body, headers={"X-Tenant-Id": "b"})
        assert other.status_code == 200  # the others' calls are theirs
        bad = await http.post(url, json=body, headers={b"X-Tenant-Id": "tëam".encode()})
        assert bad.status_code == 400 and "header 'x-tenant-id'" in bad.json()["error"]
        assert "retry-after" not in bad.headers


def test_retry_after_reads_only_a_count_of_milliseconds() -> None:
    assert retry_after([(PUSHBACK, b"1")]) == [(b"retry-after", b"1")]
    assert retry_after([(PUSHBACK, b"2000"), (b"x", b"y")]) == [(b"retry-after", b"2")]
    assert retry_after([(PUSHBACK, b"-1")]) == [] and retry_after([]) == []


def test_the_policy_table_is_immutable_and_checked_on_replace() -> None:
    config = TenancyConfig(tenants={"a": TenantPolicy(rate=1.0)})
    with pytest.raises(TypeError):
        config.tenants["b"] = TenantPolicy()  # type: ignore[index]
    tenants: dict[str, object] = {**config.tenants, "b": {"weight": 2}}
    replaced = dataclasses.replace(config, tenants=tenants)  # type: ignore[arg-type]
    assert replaced.tenants["b"] == TenantPolicy(weight=2.0)
