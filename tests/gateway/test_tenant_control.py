"""SetTenantPolicy, the tenants in GetSchedulingStatus, `rsgw ctl tenant` and SIGHUP (issue 52).

A real gateway on loopback TCP and `rsgw ctl` as a subprocess: its argument parsing,
the call, its text and exit status, as an operator runs it.
"""

from __future__ import annotations

import dataclasses

from rsgw.config._config import GatewayConfig
from rsgw.config._tenancy import TenancyConfig, TenantPolicy
from tests.gateway.fleet import open_fleet
from tests.gateway.test_control import ctl

TENANCY = TenancyConfig(
    priority_levels=3,
    tenants={"batch": TenantPolicy(weight=0.5, priority=3)},
    default=TenantPolicy(max_concurrent=8),
)


async def test_ctl_tenant_sets_a_policy_checked_as_gateway_yml_and_status_shows_it() -> None:
    async with open_fleet(2, tenancy=TENANCY) as fleet:
        tenancy = fleet.gateway.tenancy
        assert tenancy is not None
        done = await ctl(fleet, "tenant", "team-a", "--rate", "5", "--max-concurrent", "2")
        assert done.returncode == 0, done.stderr
        out = done.stdout.decode()
        assert out.startswith(
            "applied rate, max_concurrent: tenant 'team-a' weight 1, priority the default, "
            "quota 5/s burst 5, 2 at once\n"
        )
        assert "a reload (SIGHUP) or a restart reverts" in out
        policy = tenancy.config.policy("team-a")
        assert (policy.rate, policy.max_concurrent) == (5.0, 2)

        shown = await ctl(fleet, "tenant", "batch")  # no option: what is in force
        assert shown.returncode == 0
        assert shown.stdout.decode().strip() == (
            "tenant 'batch' weight 0.5, priority 3, quota none"
        )

        bad = await ctl(fleet, "tenant", "team-a", "--priority", "4")
        assert bad.returncode == 1
        err = bad.stderr.decode()
        assert err.count("\n") == 1 and "INVALID_ARGUMENT" in err
        assert "tenancy.tenants.team-a.priority is 4, past tenancy.priority_levels (3)" in err
        assert tenancy.config.policy("team-a").priority == 0  # all or nothing

        name = await ctl(fleet, "tenant", "t\tab", "--weight", "2")
        assert name.returncode == 1 and "tenant names a tenant in 1 to 128" in name.stderr.decode()

        status = await ctl(fleet, "status")
        assert status.returncode == 0
        text = status.stdout.decode()
        assert (
            "tenancy: tenant from the caller's identity; priorities 3 levels, default 2; "
            "default quota 8 at once"
        ) in text
        rows = {line.split()[0]: line.split() for line in text.splitlines()[-4:]}
        assert rows["batch"][1:4] == ["0.5", "0.33", "3"]
        assert rows["team-a"][1:4] == ["1", "0.67", "2"]


async def test_without_a_tenancy_block_ctl_tenant_says_how_to_get_one() -> None:
    async with open_fleet(1) as fleet:
        assert fleet.gateway.tenancy is None
        done = await ctl(fleet, "tenant", "a", "--weight", "2")
        assert done.returncode == 1
        err = done.stderr.decode()
        assert "FAILED_PRECONDITION" in err and "no tenancy: block" in err
        status = await ctl(fleet, "status")
        assert "tenancy" not in status.stdout.decode()


async def test_a_reload_applies_gateway_yml_over_runtime_changes() -> None:
    files: dict[str, GatewayConfig] = {}
    async with open_fleet(2, tenancy=TENANCY, reload_config=lambda: files["gateway.yml"]) as fleet:
        tenancy = fleet.gateway.tenancy
        assert tenancy is not None
        done = await ctl(fleet, "tenant", "team-a", "--rate", "5")
        assert done.returncode == 0, done.stderr
        reread = dataclasses.replace(
            TENANCY, tenants={"batch": TenantPolicy(weight=2.0), "team-b": TenantPolicy(rate=1)}
        )
        files["gateway.yml"] = dataclasses.replace(fleet.gateway.config, tenancy=reread)
        fleet.gateway.reload()
        assert tenancy.config == reread
        assert tenancy.config.policy("team-a") == TENANCY.default  # the runtime change went
        assert tenancy.shares.weights == {"batch": 2.0, "team-b": 1.0}
        assert tenancy.quotas.quota("team-b") is not None
