"""gateway.yml's `tenancy:` block: who the tenants are, how they share, what they may use.

Pure, and built like the other blocks (`rsgw.config._blocks`): frozen dataclasses whose
fields run through per-key checks, so every `ConfigError` names the key path and the
bad value, and a block changed at run time (`SetTenantPolicy`: `dataclasses.replace`
with a new `tenants` table) is held to exactly the rules gateway.yml is.

The gateway's hot path reads this block through `rsgw.gateway.calls._tenancy.Tenancy`,
which the gateway builds only when the block asks for something (`enabled`); the
rules it applies are the pure cores' (`rsgw.scheduling.calls._shares` for priority
bands and fair shares at a full worker, `rsgw.scheduling.calls._quotas` for quotas
and tenant names). Zero is "none" or "the default" wherever a key takes a number, as
in the control plane's messages (proto3 scalars have no presence), so a policy reads
the same in gateway.yml, in `rsgw ctl` and on the wire.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields

from rsgw.base._errors import ConfigError
from rsgw.base._values import Check, check_fields, check_float, check_int, check_str, ranged, show
from rsgw.config._blocks import FrozenTable, non_negative, non_negative_int
from rsgw.scheduling.calls._quotas import Quota, tenant_name
from rsgw.scheduling.knobs._knobs import check_positive

#: The most priority levels (Triton's own bound is much larger; a band is a queue of
#: places kept at each worker, and more than a handful of them keep nothing apart).
MAX_PRIORITY_LEVELS = 16
#: Tenants past this many have their metrics series folded into one (`_other_`).
DEFAULT_MAX_TENANT_SERIES = 100
#: The keys of a quota (what `tenancy.default` takes).
QUOTA_KEYS = ("rate", "burst", "max_concurrent")
#: Metadata a tenant header may not be: credentials, gRPC's own and binary metadata.
_RESERVED_HEADERS = frozenset({"authorization", "te", "content-type", "user-agent", "host"})


def _check_header(value: object, key: str) -> str:
    """A metadata key (a REST header name), lower-cased; "" for none."""
    text = check_str(value, key).strip().lower()
    if not text:
        return ""
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", text):
        raise ConfigError(
            f"{key} must be a header name (letters, digits, '.', '_', '-'), got {show(value)}"
        )
    if text in _RESERVED_HEADERS or text.startswith("grpc-") or text.endswith("-bin"):
        raise ConfigError(
            f"{key} cannot be {text!r}: the gateway or gRPC reads that header itself; "
            "pick a name of your own, such as x-tenant-id"
        )
    return text


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One tenant's weight, default priority and quota (0: none, or the default).

    Checked by the block that holds it (`TenancyConfig`), which knows its key path and
    the priority levels; `policy_from` is that check.
    """

    #: Its share of a full worker within its band, against the others' weights.
    weight: float = 1.0
    #: Its calls' priority when they send none (1 the highest); 0: `default_priority`.
    priority: int = 0
    #: Calls per second; 0: no rate quota.
    rate: float = 0.0
    #: Calls a burst may take at once; 0: one second of the rate, at least one call.
    burst: float = 0.0
    #: Calls it may hold across the gateway at once; 0: no limit.
    max_concurrent: int = 0

    @property
    def quota(self) -> Quota | None:
        """Its quota as the pure core reads it; None when it has none."""
        if not self.rate and not self.max_concurrent:
            return None
        return Quota(
            rate=self.rate or None,
            burst=self.burst or None,
            concurrency=self.max_concurrent or None,
        )


_POLICY_CHECKS: Mapping[str, Check] = {
    "weight": check_positive,
    "priority": ranged(
        check_int,
        lambda n: 0 <= n <= MAX_PRIORITY_LEVELS,
        f"0 (the default) to {MAX_PRIORITY_LEVELS}",
    ),
    "rate": non_negative,
    "burst": ranged(check_float, lambda x: x == 0 or x >= 1, "0 (one second of the rate) or >= 1"),
    "max_concurrent": non_negative_int,
}
POLICY_KEYS = tuple(_POLICY_CHECKS)


def policy_from(
    value: object, key: str, levels: int, keys: tuple[str, ...] = POLICY_KEYS
) -> TenantPolicy:
    """A tenant's policy from a mapping of `keys` (or a `TenantPolicy`), each checked,
    its priority within `levels`; keys it does not take are left to the parser's
    notes (an unknown key is ignored, with a warning).

    Raises:
        ConfigError: a bad value, naming `key.<field>` and the value.
    """
    if isinstance(value, TenantPolicy):
        value = asdict(value)
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping of {', '.join(keys)}, got {show(value)}")
    checked = {
        name: _POLICY_CHECKS[name](value[name], f"{key}.{name}")
        for name in keys
        if value.get(name) is not None
    }
    policy = TenantPolicy(**checked)
    if policy.priority > levels:
        raise ConfigError(
            f"{key}.priority is {policy.priority}, past tenancy.priority_levels ({levels}); "
            f"priorities run from 1 (the highest) to {levels}, 0 is the default"
        )
    if policy.burst and not policy.rate:
        raise ConfigError(
            f"{key}.burst is {policy.burst:g} but {key}.rate is 0: a burst needs a rate"
        )
    return policy


def _check_tenants(levels: int) -> Check:
    """`tenancy.tenants`: tenant name -> policy."""

    def check(value: object, key: str) -> FrozenTable[TenantPolicy]:
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{key} must be a mapping of tenant name to policy, got {show(value)}"
            )
        table: dict[str, TenantPolicy] = {}
        for name, entry in value.items():
            if not isinstance(name, str):
                raise ConfigError(f"{key} keys must be tenant names, got {show(name)}")
            try:
                tenant_name(name, f"{key} key {name!r}")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            table[name] = policy_from(entry, f"{key}.{name}", levels)
        return FrozenTable(table)

    return check


def _check_default(levels: int) -> Check:
    """`tenancy.default`: the quota of the tenants not listed, and nothing else."""

    def check(value: object, key: str) -> TenantPolicy:
        if isinstance(value, TenantPolicy) and (value.weight != 1.0 or value.priority):
            raise ConfigError(
                f"{key} takes the quota of the tenants not listed ({', '.join(QUOTA_KEYS)}); "
                "their weight is 1 and their priority tenancy.default_priority"
            )
        return policy_from(value, key, levels, QUOTA_KEYS)

    return check


@dataclass(frozen=True, slots=True)
class TenancyConfig:
    """Priorities, fair shares per tenant and quotas (issue 52; docs/operations.md,
    "Priorities, fair shares and quotas").

    A call's tenant is the caller's identity when authentication is on (a token's
    name, a certificate's identity), else the value of the `header` metadata (a REST
    header) when one is set, else the anonymous tenant. Its priority is its own
    `priority` request parameter (Triton's: 1 the highest), else its tenant's, else
    `default_priority`; `priority_levels` 1 turns priorities off. `tenants` lists
    weights, priorities and quotas by name; `default` is the quota of every tenant
    not listed (its weight is 1, its priority `default_priority`).
    """

    header: str = ""
    priority_levels: int = 1
    #: 0: the middle level, `(priority_levels + 1) // 2` (see `default_level`).
    default_priority: int = 0
    max_tenant_series: int = DEFAULT_MAX_TENANT_SERIES
    tenants: Mapping[str, TenantPolicy] = field(default_factory=FrozenTable)
    default: TenantPolicy = field(default_factory=TenantPolicy)

    def __post_init__(self) -> None:
        levels = ranged(
            check_int, lambda n: 1 <= n <= MAX_PRIORITY_LEVELS, f"1 to {MAX_PRIORITY_LEVELS}"
        )
        check_fields(
            self,
            "tenancy.",
            {
                "header": _check_header,
                "priority_levels": levels,
                "max_tenant_series": ranged(check_int, lambda n: n >= 1, "at least 1"),
            },
        )
        count = self.priority_levels
        check_fields(
            self,
            "tenancy.",
            {
                "default_priority": ranged(
                    check_int,
                    lambda n: 0 <= n <= count,
                    f"0 (the middle level) to tenancy.priority_levels ({count})",
                ),
                "tenants": _check_tenants(count),
                "default": _check_default(count),
            },
        )

    @property
    def enabled(self) -> bool:
        """Whether the block asks for anything: else the gateway builds no `Tenancy`,
        and a call pays one attribute test for the feature."""
        return bool(
            self.header
            or self.priority_levels > 1
            or self.tenants
            or self.default.quota is not None
        )

    @property
    def default_level(self) -> int:
        """The priority of a call that sends none and whose tenant has none: as
        configured, else the middle level, so that clients can mark calls both above
        (latency-critical) and below (batch) the unmarked ones."""
        return self.default_priority or (self.priority_levels + 1) // 2

    def policy(self, tenant: str) -> TenantPolicy:
        """`tenant`'s policy: as listed, else the default quota with weight 1."""
        return self.tenants.get(tenant, self.default)


#: The fields of a tenant policy, in the order the control plane's message holds them.
TENANT_FIELDS = tuple(f.name for f in fields(TenantPolicy))


def with_tenant(
    config: TenancyConfig, tenant: str, mask: Sequence[str], values: Mapping[str, object]
) -> TenancyConfig:
    """`config` with `tenant` listed, the fields `mask` names taken from `values` and the
    others from its policy in force (for a tenant not listed: the default quota, weight
    1, the default priority): what `SetTenantPolicy` applies, checked as gateway.yml is.

    Raises:
        ConfigError: a bad name, an unknown field, or a bad value (the key path named).
    """
    try:
        tenant_name(tenant, "tenant")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for name in mask:
        if name not in TENANT_FIELDS:
            raise ConfigError(
                f"update_mask names {name!r}, not a field of a tenant's policy; "
                f"the fields: {', '.join(TENANT_FIELDS)}"
            )
    if not mask:
        return config
    merged = {**asdict(config.policy(tenant)), **{name: values[name] for name in mask}}
    policy = policy_from(merged, f"tenancy.tenants.{tenant}", config.priority_levels)
    return dataclasses.replace(config, tenants={**config.tenants, tenant: policy})


#: The environment overrides of the block's scalar keys, by the kind of value they take
#: (merged into `rsgw.config._config`'s table); `tenants` and `default` are YAML only.
TENANCY_ENV_KINDS: Mapping[str, str] = {
    "tenancy.header": "str",
    "tenancy.priority_levels": "int",
    "tenancy.default_priority": "int",
    "tenancy.max_tenant_series": "int",
}


def nested_entries(
    block: Mapping[Hashable, object],
) -> Iterator[tuple[Mapping[Hashable, object], str, tuple[str, ...]]]:
    """The mappings inside a raw `tenancy:` block, each with its key path and the keys it
    takes, for the parser's notes on unknown keys (a misspelt `rate` is no quota)."""
    tenants = block.get("tenants")
    if isinstance(tenants, Mapping):
        for tenant, entry in tenants.items():
            if isinstance(entry, Mapping):
                yield entry, f"tenancy.tenants.{tenant}.", POLICY_KEYS
    default = block.get("default")
    if isinstance(default, Mapping):
        yield default, "tenancy.default.", QUOTA_KEYS
