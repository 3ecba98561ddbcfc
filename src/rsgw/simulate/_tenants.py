"""Tenants and priorities in the simulated gateway (issue 52), and their figures.

`SimTenancy` asks the gateway's own pure cores at the points the real gateway asks
them (`rsgw.gateway.calls._tenancy.Tenancy` and `_infer`'s `_take_place`): a call's
band (`band_of`) from its `priority` parameter, else its tenant's, else the default;
its tenant's quota (`Quotas`) once it has an admission slot, before it is routed; then,
for the worker chosen and after issue 38's deadline rule has passed it, a place by
band and share (`Shares.arrived`, `depth_for`, `Shares.judge`, `Shares.hold`), given
back with the quota when the gateway is done with the call. What the simulation
leaves out: authentication (a call's tenant is what it sends in `tenancy.header`, so
with no header every call is the anonymous tenant's, as at a real gateway), the
folding of made-up tenant names (a scenario names its few), and runtime changes.

`tenant_rows` turns a run's calls into one row per (tenant, band) for the measured
window, and `tenants_table` prints them: offered, answered within the SLO (goodput),
refused by reason, late, and the answered calls' p50 / p99.

Pure: no trio, no clock (the engine passes `now`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rsgw.config._tenancy import TenancyConfig
from rsgw.scheduling.calls._forecast import AdmissionRule
from rsgw.scheduling.calls._quotas import RATE, Quotas
from rsgw.scheduling.calls._shares import Shares, band_of, depth_for
from rsgw.simulate._device import SimCall
from rsgw.simulate._results import OK, RunResult, cell, percentile, table

OVER_RATE = "over_rate"
OVER_CONCURRENCY = "over_concurrency"
DEADLINE = "deadline"
#: Refused at the admission queue or at full replicas, before any tenant's rule.
SHED = "shed"
#: Why a call is refused (`SimCall.refused`), as the real gateway counts them
#: (`gateway_tenant_calls_total{outcome}` without its `refused_`), and `SHED`.
REASONS = ("share", "band", DEADLINE, OVER_RATE, OVER_CONCURRENCY, SHED)
#: The status every refusal ends with (`_gateway.SHED`).
_REFUSED_STATUS = "RESOURCE_EXHAUSTED"


class SimTenancy:
    """The tenancy of one simulated gateway; see the module docstring."""

    def __init__(self, config: TenancyConfig) -> None:
        self.config = config
        self.shares = Shares({name: policy.weight for name, policy in config.tenants.items()})
        self.quotas = Quotas()
        for tenant, policy in config.tenants.items():
            self.quotas.configure(tenant, policy.quota, 0.0)

    def tenant_of(self, call: SimCall) -> str:
        """Who the gateway sees: the call's tenant when `tenancy.header` carries it."""
        return call.tenant if self.config.header else ""

    def band(self, call: SimCall) -> int:
        """The call's band, as `Tenancy.band` finds it (0 when priorities are off)."""
        config = self.config
        if config.priority_levels == 1:
            return 0
        priority: int | None = call.priority or None
        if priority is None:
            policy = config.tenants.get(self.tenant_of(call))
            priority = policy.priority if policy is not None and policy.priority else None
        return band_of(priority, config.priority_levels, config.default_level)

    def seat(self, call: SimCall, now: float) -> str:
        """A place in the call's tenant's quota; "" if it got one, else why not."""
        tenant = self.tenant_of(call)
        quotas, default = self.quotas, self.config.default.quota
        listed = tenant in self.config.tenants
        if default is not None and not listed and quotas.quota(tenant) is None:
            quotas.configure(tenant, default, now)  # a tenant not listed: its own account
        verdict = quotas.admit(tenant, now)
        if verdict is not None:
            return OVER_RATE if verdict.limit == RATE else OVER_CONCURRENCY
        call.seated = True
        return ""

    def place(
        self, call: SimCall, url: str, per_call: float, held: int, rule: AdmissionRule, now: float
    ) -> str:
        """A place at `url` by band and share (`_infer._take_place`); "" if it got one,
        else the reason it was refused."""
        shares, tenant = self.shares, self.tenant_of(call)
        shares.arrived(url, call.band, tenant, now)
        depth = depth_for(per_call, call.deadline - now, rule)
        verdict = shares.judge(url, call.band, tenant, held, depth, per_call, now)
        if verdict is not None:
            return verdict.reason
        shares.hold(url, call.band, tenant, now)
        call.placed = url
        return ""

    def release(self, call: SimCall) -> None:
        """The gateway is done with `call`: its places go back."""
        if call.placed:
            self.shares.unhold(call.placed, call.band, self.tenant_of(call))
            call.placed = ""
        if call.seated:
            self.quotas.release(self.tenant_of(call))
            call.seated = False


def tenant_rows(
    calls: Sequence[SimCall], slo_s: float, warmup: float, window: float
) -> list[dict[str, Any]]:
    """Per (tenant, band), the calls sent in the measured window: what became of them.

    A JSON row each (bench/fleet's `--json` takes them as they are): `priority` is the
    band as a priority (1 the highest), latencies in ms (None when none was answered).
    """
    groups: dict[tuple[str, int], list[SimCall]] = {}
    for call in calls:
        if warmup <= call.sent < warmup + window:
            groups.setdefault((call.tenant, call.band), []).append(call)
    rows = []
    for (tenant, band), group in sorted(groups.items()):
        answered = sorted(1000 * (c.done - c.sent) for c in group if c.code == OK)
        in_slo = sum(1 for ms in answered if ms <= 1000 * slo_s)
        refused = dict.fromkeys(REASONS, 0)
        for c in group:
            if c.code != OK and (c.refused or c.code == _REFUSED_STATUS):
                refused[c.refused or SHED] += 1
        late = len(group) - len(answered) - sum(refused.values())
        rows.append(
            {
                "tenant": tenant,
                "priority": band + 1,
                "offered": len(group),
                "in_slo": in_slo,
                "goodput_rps": in_slo / window,
                "refused": refused,
                "late": late,
                "p50_ms": percentile(answered, 50) if answered else None,
                "p99_ms": percentile(answered, 99) if answered else None,
            }
        )
    return rows


def tenants_table(runs: Sequence[RunResult]) -> str:
    """One row per load, mode, tenant and band (median (min-max) over the runs):
    offered, share answered within the SLO, goodput, refusals by reason, late, p50/p99."""
    groups: dict[tuple[float, str, str, int], list[dict[str, Any]]] = {}
    for run in runs:
        for row in run.tenants or ():
            groups.setdefault((run.load, run.mode, row["tenant"], row["priority"]), []).append(row)
    header = ["load, mode", "tenant", "priority", "offered", "in SLO %", "SLO goodput req/s"]
    header += [f"refused {reason}" for reason in REASONS] + ["late", "p50 ms", "p99 ms"]
    lines = []
    for (load, mode, tenant, priority), rows in sorted(groups.items()):
        figures = [
            [r["offered"] for r in rows],
            [100 * r["in_slo"] / r["offered"] for r in rows],
            [r["goodput_rps"] for r in rows],
            *([r["refused"][reason] for r in rows] for reason in REASONS),
            [r["late"] for r in rows],
            [math.nan if r["p50_ms"] is None else r["p50_ms"] for r in rows],
            [math.nan if r["p99_ms"] is None else r["p99_ms"] for r in rows],
        ]
        name = tenant or "(anonymous)"
        lines.append([f"{load:.0%} {mode}", name, str(priority), *map(cell, figures)])
    return table(header, lines)
