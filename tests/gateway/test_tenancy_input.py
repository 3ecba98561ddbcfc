"""Hostile tenants and priorities through a real gateway (issue 52, acceptance 3).

A malformed `priority` parameter or tenant header is a clear INVALID_ARGUMENT over gRPC
and 400 over REST, never a crash: the next call is served. Ten thousand made-up tenant
names leave the tenant series bounded (`tenancy.max_tenant_series`, then `_other_`).
"""

from __future__ import annotations

import httpx
import pytest
import trio
from trio.testing import MockClock

from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._tenancy import TenancyConfig
from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import infer_request, simple_inputs

TENANCY = TenancyConfig(header="x-tenant", priority_levels=3, max_tenant_series=20)


async def call(fleet: Fleet, tenant: bytes, priority: object = None, seed: int = 0) -> None:
    request = infer_request("simple", simple_inputs(seed))
    if isinstance(priority, str):
        request.parameters["priority"].string_param = priority
    elif isinstance(priority, int):
        request.parameters["priority"].int64_param = priority
    await fleet.channel().unary(
        Method.MODEL_INFER.wire,
        request.SerializeToString(),
        metadata=((b"x-tenant", tenant),),
    )


@pytest.mark.parametrize(
    ("tenant", "priority", "words"),
    [
        (b"team-a", "high", "parameter 'priority' must be a non-negative integer"),
        (b"team-a", -2, "parameter 'priority' must be a non-negative integer"),
        (b"t\x01b", None, "header 'x-tenant'"),
        (b"x" * 200, None, "header 'x-tenant'"),
    ],
)
async def test_a_bad_priority_or_tenant_is_invalid_argument_and_the_next_call_is_served(
    autojump_clock: MockClock, tenant: bytes, priority: object, words: str
) -> None:
    async with open_fleet(1, memory=True, tenancy=TENANCY) as fleet:
        with pytest.raises(GrpcError) as caught:
            await call(fleet, tenant, priority)
        assert caught.value.code is StatusCode.INVALID_ARGUMENT
        assert words in caught.value.message
        await call(fleet, b"team-a", 1)


async def test_rest_answers_a_bad_priority_400_naming_it() -> None:
    async with open_fleet(1, tenancy=TENANCY) as fleet, httpx.AsyncClient() as http:
        url = f"http://127.0.0.1:{fleet.gateway.http_port}/v2/models/simple/infer"
        body = {
            "inputs": [
                {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                for n in ("INPUT0", "INPUT1")
            ],
            "parameters": {"priority": "urgent"},
        }
        bad = await http.post(url, json=body, headers={"x-tenant": "team-a"})
        assert bad.status_code == 400
        assert "parameter 'priority' must be a non-negative integer" in bad.json()["error"]
        body["parameters"] = {"priority": 1}
        good = await http.post(url, json=body, headers={"x-tenant": "team-a"})
        assert good.status_code == 200, good.text


async def test_ten_thousand_made_up_tenants_leave_the_series_bounded(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(1, memory=True, tenancy=TENANCY) as fleet:
        for batch in range(100):
            async with trio.open_nursery() as nursery:
                for i in range(100):
                    name = f"tenant-{batch * 100 + i}".encode()
                    nursery.start_soon(call, fleet, name, None, i)
        text = fleet.gateway._service.metrics.render().decode()
    tenants = {
        line.split('tenant="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("gateway_tenant_calls_total{")
    }
    assert len(tenants) <= TENANCY.max_tenant_series + 1
    assert "_other_" in tenants
