"""What a tenant may use across the gateway (issue 52): quotas, and its name as metrics show it.

Pure: no trio, no clock of its own (every method that needs the time takes `now`).

Fair shares (`rsgw.scheduling.calls._shares`) divide a full worker among those who
want it, and give a lone tenant everything; a quota is a promise the other way, a
limit whatever is free: a rate (calls per second, with a burst: a token bucket) and a
concurrency (calls the tenant holds across the gateway at once), both optional, as
Envoy's AI gateway sets them per tenant. Over quota is RESOURCE_EXHAUSTED (REST 429),
the message naming the limit, and for the rate the seconds until a token comes, which
the caller rounds up into `Retry-After`. Quotas change at run time (`rsgw ctl`,
SIGHUP): a bucket re-configured keeps its fill, capped at its new burst, so a change
neither hands out a fresh burst nor takes back what a tenant saved.

A tenant is named by a header, a token or a certificate: a value a client picks.
Each name a metric carries is a series kept for the life of the process, so
`TenantLabels` labels the configured tenants and the first others by their names and
folds every later one into `OTHER`: 10,000 names make at most `max_tenants` + 1
series (and the configured ones).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import dataclass

from rsgw.base._errors import clip

#: The label of every tenant past `TenantLabels.max_tenants`.
OTHER = "_other_"
#: The longest tenant name accepted (a header's value).
MAX_TENANT_CHARS = 128

RATE = "rate"
CONCURRENCY = "concurrency"


def tenant_name(value: str, source: str) -> str:
    """`value`, checked as a tenant's name: 1 to `MAX_TENANT_CHARS` printable ASCII
    characters (what a header carries and a metric label can show).

    Raises:
        ValueError: it is not (INVALID_ARGUMENT, naming `source`, the header say).
    """
    if 0 < len(value) <= MAX_TENANT_CHARS and value.isascii() and value.isprintable():
        return value
    if not value:
        problem = "is empty"
    elif len(value) > MAX_TENANT_CHARS:
        problem = f"has {len(value)} characters"
    else:
        problem = f"is not printable ASCII: {clip(ascii(value), 64)}"
    raise ValueError(
        f"{source} names a tenant in 1 to {MAX_TENANT_CHARS} printable ASCII characters; "
        f"this value {problem}"
    )


class TenantLabels:
    """Tenant names as metric labels: bounded (see the module docstring)."""

    __slots__ = ("_configured", "_seen", "max_tenants")

    def __init__(self, max_tenants: int, configured: Iterable[str] = ()) -> None:
        self.max_tenants = max_tenants
        self._configured = frozenset(configured)
        #: Names labelled as themselves besides the configured ones (at most `max_tenants`
        #: less the configured).
        self._seen: set[str] = set()

    def label(self, tenant: str) -> str:
        """`tenant`'s label: its name while there is room, else `OTHER`."""
        if tenant in self._seen or tenant in self._configured:
            return tenant
        if len(self._seen) + len(self._configured) < self.max_tenants:
            self._seen.add(tenant)
            return tenant
        return OTHER


@dataclass(frozen=True, slots=True)
class Quota:
    """A tenant's limits: `rate` calls per second with bursts of `burst` (rate's default:
    one second's worth, at least one call), and at most `concurrency` calls at once.
    None: no such limit."""

    rate: float | None = None
    burst: float | None = None
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"a quota's rate is calls per second, above 0; not {self.rate!r}")
        if self.burst is not None and not (self.burst >= 1 and math.isfinite(self.burst)):
            raise ValueError(f"a quota's burst is at least 1 call; not {self.burst!r}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"a quota's concurrency is at least 1 call; not {self.concurrency}")

    @property
    def bucket_size(self) -> float:
        """The burst, or its default: one second of the rate, at least one call."""
        if self.burst is not None:
            return self.burst
        return max(1.0, self.rate or 1.0)


class TokenBucket:
    """`rate` tokens a second, up to `burst` saved; a call takes one. Starts full."""

    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.last = now

    def _fill(self, now: float) -> None:
        if now > self.last:
            tokens = self.tokens + (now - self.last) * self.rate
            self.tokens = tokens if tokens < self.burst else self.burst
            self.last = now

    def take(self, now: float) -> float | None:
        """None if a token was taken at `now`; else the seconds until one will be there."""
        self._fill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return (1.0 - self.tokens) / self.rate

    def full(self, now: float) -> bool:
        """Whether the bucket holds its whole burst at `now` (as a new one does)."""
        self._fill(now)
        return self.tokens >= self.burst

    def configure(self, rate: float, burst: float, now: float) -> None:
        """A new rate and burst from `now`: what was saved stays, capped at the new burst."""
        self._fill(now)
        self.rate = rate
        self.burst = burst
        self.tokens = min(self.tokens, burst)


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    """Why a tenant's call was refused: the `limit` it is over (RATE or CONCURRENCY), its
    quota, and for the rate the seconds until it may call again."""

    tenant: str
    limit: str
    quota: Quota
    retry_after: float | None

    @property
    def message(self) -> str:
        """What the client reads."""
        quota = self.quota
        if self.limit == RATE:
            what = f"rate quota of {quota.rate:g}/s (burst {quota.bucket_size:g})"
        else:
            what = f"concurrency quota of {quota.concurrency} calls at once"
        who = f"tenant '{self.tenant}'" if self.tenant else "the anonymous tenant"
        return f"{who} is over its {what}; retry later"


class _Account:
    """One tenant with a quota: its bucket (if it has a rate) and the calls it holds."""

    __slots__ = ("bucket", "held", "quota")

    def __init__(self, quota: Quota, now: float) -> None:
        self.quota = quota
        self.held = 0
        self.bucket = (
            TokenBucket(quota.rate, quota.bucket_size, now) if quota.rate is not None else None
        )


class Quotas:
    """Every tenant's quota and use. A tenant without a quota costs a dict lookup.

    The gateway calls `admit` when it knows the call's tenant, and `release` when an
    admitted call is over. The calls a tenant held when its quota was set were admitted
    without one and are not counted; as they end they are taken off those admitted
    since (never below none), so for that one round it may hold more than its limit.
    """

    __slots__ = ("_accounts",)

    def __init__(self) -> None:
        self._accounts: dict[str, _Account] = {}

    def configure(self, tenant: str, quota: Quota | None, now: float) -> None:
        """Set (or with None, lift) `tenant`'s quota from `now` on."""
        account = self._accounts.get(tenant)
        if quota is None or (quota.rate is None and quota.concurrency is None):
            self._accounts.pop(tenant, None)
        elif account is None:
            self._accounts[tenant] = _Account(quota, now)
        else:
            account.quota = quota
            if quota.rate is None:
                account.bucket = None
            elif account.bucket is None:
                account.bucket = TokenBucket(quota.rate, quota.bucket_size, now)
            else:
                account.bucket.configure(quota.rate, quota.bucket_size, now)

    def quota(self, tenant: str) -> Quota | None:
        """`tenant`'s quota, if it has one."""
        account = self._accounts.get(tenant)
        return account.quota if account is not None else None

    def held(self, tenant: str) -> int:
        """Calls `tenant` holds now, as counted against a concurrency quota."""
        account = self._accounts.get(tenant)
        return account.held if account is not None else 0

    def admit(self, tenant: str, now: float) -> QuotaVerdict | None:
        """None to admit a call of `tenant` at `now` (counted until `release`); else why
        not. The concurrency is checked first, so a refused call spends no token."""
        account = self._accounts.get(tenant)
        if account is None:
            return None
        quota = account.quota
        if quota.concurrency is not None and account.held >= quota.concurrency:
            return QuotaVerdict(tenant, CONCURRENCY, quota, None)
        if account.bucket is not None:
            wait = account.bucket.take(now)
            if wait is not None:
                return QuotaVerdict(tenant, RATE, quota, wait)
        account.held += 1
        return None

    def __len__(self) -> int:
        """Tenants with a quota now."""
        return len(self._accounts)

    def tenants(self) -> list[str]:
        """The tenants with a quota now."""
        return list(self._accounts)

    def sweep(self, keep: Container[str], now: float) -> int:
        """Forget the accounts, but those of `keep`, that hold no call and whose bucket is
        full (or that have none) at `now`; how many went.

        Such an account is exactly what `configure` would open anew, so a caller that
        opens accounts on demand (a default quota for every tenant not listed, each
        counted on its own) can sweep without changing a verdict, and its accounts
        stay as many as the tenants called lately, however many names clients make up.
        """
        idle = []
        for tenant, account in self._accounts.items():
            if account.held or tenant in keep:
                continue
            if account.bucket is None or account.bucket.full(now):
                idle.append(tenant)
        for tenant in idle:
            del self._accounts[tenant]
        return len(idle)

    def release(self, tenant: str) -> None:
        """A call `admit` admitted is over."""
        account = self._accounts.get(tenant)
        if account is not None and account.held > 0:
            account.held -= 1
