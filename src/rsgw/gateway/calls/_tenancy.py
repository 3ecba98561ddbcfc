"""The tenants of a running gateway (issue 52): who a call is for, its band, its quota.

The shell around the pure cores: `rsgw.scheduling.calls._shares` (priority bands and
fair shares at a full worker) and `rsgw.scheduling.calls._quotas` (quotas, bounded
tenant labels), and around gateway.yml's `tenancy:` block
(`rsgw.config._tenancy.TenancyConfig`). The gateway builds one `Tenancy` only when
that block asks for something; otherwise the call path holds None and pays one
attribute test.

A ModelInfer call goes through it in this order:

1. `tenant_of(call)`: the identity the call proved (auth on), else the tenant header,
   else the anonymous tenant "";
2. `band(head, tenant)`: its priority band from its `priority` parameter, its
   tenant's, or the default (0 when priorities are off);
3. `admit_quota(tenant, now, band)`: refused RESOURCE_EXHAUSTED over the tenant's rate
   or concurrency quota (counted here as `over_rate` / `over_concurrency`); once it
   returns, the call holds a place in its tenant's quota until `release_quota(tenant)`,
   which the call path owes whatever happens next (refused at a worker, answered,
   failed, cancelled);
4. the worker's admission (`shares`, after issue 38's deadline rule), then
   `counted(tenant, band, outcome)` with `admitted` or the refusal's outcome.

The configuration is an immutable snapshot swapped by reference (`apply`): the
control plane's `SetTenantPolicy` and SIGHUP change weights and quotas for the calls
that come next, and a tenant's bucket keeps its fill across the change.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.config._tenancy import MAX_PRIORITY_LEVELS, TENANT_FIELDS, TenancyConfig, TenantPolicy
from rsgw.scheduling.calls._quotas import RATE, Quota, Quotas, TenantLabels, tenant_name
from rsgw.scheduling.calls._shares import BAND, SHARE, Shares, band_of
from rsgw.scheduling.calls._wire import peek_priority

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rsgw.base._call import CallContext
    from rsgw.gateway.observe._metrics import GatewayMetrics
    from rsgw.runtime._hot_series import Count, CounterFamily

#: The label of the calls of no tenant (auth off, no tenant header, or none sent).
ANONYMOUS = "_anonymous_"
#: `gateway_tenant_calls_total{outcome}`.
ADMITTED = "admitted"
REFUSED_SHARE = "refused_share"
REFUSED_BAND = "refused_band"
REFUSED_DEADLINE = "refused_deadline"
OVER_RATE = "over_rate"
OVER_CONCURRENCY = "over_concurrency"
OUTCOMES = (ADMITTED, REFUSED_SHARE, REFUSED_BAND, REFUSED_DEADLINE, OVER_RATE, OVER_CONCURRENCY)
_OUTCOME_INDEX = {outcome: i for i, outcome in enumerate(OUTCOMES)}
_REFUSED = (REFUSED_SHARE, REFUSED_BAND, REFUSED_DEADLINE)
_OVER_QUOTA = (OVER_RATE, OVER_CONCURRENCY)
#: A worker's refusal (`ShareVerdict.reason`) as the outcome it is counted under.
REFUSED_BY_REASON = {SHARE: REFUSED_SHARE, BAND: REFUSED_BAND}


class Seat:
    """One call's tenant and band, and the worker that gave it a place (once one did).

    The call holds a place in its tenant's quota from `Tenancy.seat` until
    `Tenancy.release`, and one at `url` (`Shares.hold`) from the moment it was admitted
    there."""

    __slots__ = ("band", "key", "tenant", "url")

    def __init__(self, tenant: str, band: int, key: str) -> None:
        self.tenant = tenant
        self.band = band
        #: Whose share it is at a worker: the tenant, or past `max_tenant_series` names
        #: the one `_other_` they all fold into, so that made-up names cannot make a
        #: call's admission cost more than that many tenants (`Shares.judge` is linear
        #: in the tenants active at a worker).
        self.key = key
        self.url = ""


#: gRPC's server pushback (the retry design, gRFC A6): the milliseconds a client's
#: retry policy waits before it tries again. The REST door makes it `Retry-After`.
PUSHBACK = b"grpc-retry-pushback-ms"
#: Accounts of the default quota opened before the first sweep of the idle ones.
SWEEP_FROM = 1024


class Tenancy:
    """The tenancy of one gateway; see the module docstring."""

    def __init__(self, config: TenancyConfig, metrics: GatewayMetrics, now: float) -> None:
        self.config = config
        self.shares = Shares()
        self.quotas = Quotas()
        #: Tenant names as metric labels: those listed at start, then the first others.
        self.labels = TenantLabels(config.max_tenant_series, config.tenants)
        self._calls: CounterFamily = metrics.track_tenants(lambda: self._inflight)
        #: Label -> its counters, by band x outcome (made at first use).
        self._children: dict[str, list[Count | None]] = {}
        #: Label -> the calls its tenants hold.
        self._inflight: dict[str, int] = {}
        self._header = b""
        self._default_quota: Quota | None = None
        self._sweep_at = SWEEP_FROM
        self.apply(config, now)

    def apply(self, config: TenancyConfig, now: float) -> None:
        """`config` from now on: weights, priorities and quotas change for the calls to
        come; a bucket keeps its fill (capped at its new burst)."""
        self.config = config
        self._header = config.header.encode()
        self.labels.max_tenants = config.max_tenant_series
        self.shares.set_weights({name: p.weight for name, p in config.tenants.items()})
        self._default_quota = config.default.quota
        for tenant in self.quotas.tenants():
            if tenant not in config.tenants:  # a default account, or a tenant delisted
                self.quotas.configure(tenant, self._default_quota, now)
        for tenant, policy in config.tenants.items():
            self.quotas.configure(tenant, policy.quota, now)

    # -- the call path ----------------------------------------------------------------

    def seat(self, call: CallContext, head: bytes, now: float) -> Seat:
        """Steps 1 to 3 of the module docstring at once: the call's tenant, its band,
        and a place in its tenant's quota, which `release` gives back.

        Raises:
            GrpcError: INVALID_ARGUMENT (the tenant header or the priority is not one),
                RESOURCE_EXHAUSTED (over quota, counted).
            DecodeError: `head` is not a request's encoding.
        """
        tenant = self.tenant_of(call)
        band = self.band(head, tenant)
        self.admit_quota(tenant, now, band)
        return Seat(tenant, band, self.labels.label(tenant) if tenant else "")

    def release(self, seat: Seat) -> None:
        """The call of `seat` is over: its places (at its worker, in its quota) go back."""
        if seat.url:
            self.shares.unhold(seat.url, seat.band, seat.key)
        self.release_quota(seat.tenant)

    def tenant_of(self, call: CallContext) -> str:
        """The call's tenant: its proven identity, else the tenant header's value, else "".

        Raises:
            GrpcError: INVALID_ARGUMENT, the header's value is not a tenant's name.
        """
        principal = call.principal
        if principal is not None:
            return principal.name
        header = self._header
        if header:
            for name, value in call.metadata:
                if name == header:
                    return self._named(value)
        return ""

    def _named(self, value: bytes) -> str:
        """A tenant header's value, checked (INVALID_ARGUMENT naming the header)."""
        try:
            return tenant_name(value.decode("latin-1"), f"header '{self.config.header}'")
        except ValueError as exc:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, str(exc)) from None

    def band(self, head: bytes, tenant: str) -> int:
        """The call's band (0 the highest): its `priority` parameter, else its tenant's
        priority, else the default; 0 when priorities are off.

        Raises:
            GrpcError: INVALID_ARGUMENT, the priority is not a non-negative integer.
            DecodeError: `head` is not a request's encoding.
        """
        config = self.config
        levels = config.priority_levels
        if levels == 1:
            return 0
        priority = peek_priority(head)
        if priority is None or (type(priority) is int and priority == 0):
            policy = config.tenants.get(tenant)
            priority = policy.priority if policy is not None and policy.priority else None
        try:
            return band_of(priority, levels, config.default_level)
        except ValueError as exc:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, str(exc)) from None

    def admit_quota(self, tenant: str, now: float, band: int = 0) -> None:
        """Take a place in `tenant`'s quota at `now`, until `release_quota`.

        Raises:
            GrpcError: RESOURCE_EXHAUSTED over its rate (with the `PUSHBACK` trailer: the
                REST door answers 429 with `Retry-After`) or concurrency quota; counted
                here as `over_rate` / `over_concurrency` in `band`.
        """
        quotas = self.quotas
        if (
            self._default_quota is not None
            and quotas.quota(tenant) is None
            and tenant not in self.config.tenants
        ):
            self._open_account(tenant, now)
        verdict = quotas.admit(tenant, now)
        label = self.labels.label(tenant) if tenant else ANONYMOUS
        if verdict is None:
            self._inflight[label] = self._inflight.get(label, 0) + 1
            return
        self._count(label, band, OVER_RATE if verdict.limit == RATE else OVER_CONCURRENCY)
        wait = verdict.retry_after
        pushback = () if wait is None else ((PUSHBACK, b"%d" % math.ceil(wait * 1000)),)
        raise GrpcError(StatusCode.RESOURCE_EXHAUSTED, verdict.message, pushback)

    def release_quota(self, tenant: str) -> None:
        """A call `admit_quota` let through is over."""
        self.quotas.release(tenant)
        label = self.labels.label(tenant) if tenant else ANONYMOUS
        held = self._inflight.get(label, 0)
        if held > 0:
            self._inflight[label] = held - 1

    def counted(self, tenant: str, band: int, outcome: str) -> None:
        """Count one call of `tenant` in `band` with `outcome` (one of `OUTCOMES`)."""
        self._count(self.labels.label(tenant) if tenant else ANONYMOUS, band, outcome)

    def _count(self, label: str, band: int, outcome: str) -> None:
        children = self._children.get(label)
        if children is None:
            children = self._children[label] = [None] * (MAX_PRIORITY_LEVELS * len(OUTCOMES))
        index = band * len(OUTCOMES) + _OUTCOME_INDEX[outcome]
        child = children[index]
        if child is None:
            child = children[index] = self._calls.labels(label, str(band + 1), outcome)
        child.inc()

    def _open_account(self, tenant: str, now: float) -> None:
        """Give a tenant not listed the default quota, its own; past `SWEEP_FROM`
        accounts (and then each time they double), first forget the idle ones, which
        changes no verdict (`Quotas.sweep`): so made-up names cost no lasting memory."""
        quotas = self.quotas
        if len(quotas) >= self._sweep_at:
            quotas.sweep(self.config.tenants, now)
            self._sweep_at = max(SWEEP_FROM, 2 * len(quotas))
        quotas.configure(tenant, self._default_quota, now)

    # -- the control plane ------------------------------------------------------------

    def status(self, now: float) -> cpb.TenancyStatus:
        """What `rsgw ctl status` shows: the block, and each tenant the gateway labels
        (the listed ones, the ones seen, `_other_`, `_anonymous_`) with its use."""
        config = self.config
        status = cpb.TenancyStatus(
            header=config.header,
            priority_levels=config.priority_levels,
            default_priority=config.default_level,
            max_tenant_series=config.max_tenant_series,
            default=tenant_policy_message(config.default),
        )
        names = dict.fromkeys([*config.tenants, *sorted({*self._inflight, *self._children})])
        total = sum(config.policy(name).weight for name in names)
        for name in names:
            policy = config.policy(name)
            counts = self._totals(name)
            status.tenants.append(
                cpb.TenantStatus(
                    tenant=name,
                    listed=name in config.tenants,
                    policy=tenant_policy_message(policy),
                    inflight=self._inflight.get(name, 0),
                    admitted=counts[ADMITTED],
                    refused=sum(counts[outcome] for outcome in _REFUSED),
                    over_quota=sum(counts[outcome] for outcome in _OVER_QUOTA),
                    share=policy.weight / total,
                )
            )
        return status

    def _totals(self, label: str) -> Mapping[str, int]:
        """`label`'s calls by outcome, over every band."""
        totals = dict.fromkeys(OUTCOMES, 0)
        for index, child in enumerate(self._children.get(label, ())):
            if child is not None:
                totals[OUTCOMES[index % len(OUTCOMES)]] += int(child.value)
        return totals


def tenant_policy_message(policy: TenantPolicy) -> cpb.TenantPolicy:
    """A tenant's policy on the control plane's wire."""
    return cpb.TenantPolicy(**{name: getattr(policy, name) for name in TENANT_FIELDS})
