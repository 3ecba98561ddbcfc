"""Who goes first at a full worker: priority bands, and fair shares per tenant (issue 52).

Pure: no trio, no clock of its own (every method that needs the time takes `now`).
The gateway asks it at arrival, after issue 38's deadline rule
(`rsgw.scheduling.calls._forecast`) has passed the call, for the worker chosen.

Issue 38 refuses a call that would finish after its deadline: a worker that drains a
call every `per_call` seconds can hold `depth` calls, the newcomer included, and
still finish the last in time (`depth_for`). There every call is equal, so a client
sending ten times its share takes ten times the places, and a latency-critical call
waits behind a batch job's. A worker runs what it holds in order and no running call
is cut, so a place, once given, is not taken back: who goes first is decided at
admission, by keeping places free for those who will need them (the Gateway API
inference extension's flow control decides it in its router for the same reason).

A tenant's claim is the fraction of the worker's drain its recent arrivals there
would use (their decayed rate x per_call, at most 1). A call of band b (0 the
highest) and tenant t is admitted iff `held + 1 + kept <= depth`, `kept` being the
places kept free for others' next calls:
- each tenant of a higher band keeps `band_keep(claim)`: `HEADROOM` times its claim
  of the worker. A lower band gets what the higher ones do not claim.
- the band's room (`depth` less what the higher bands keep) is divided by
  `keep_fractions`: max-min fair by weight (water-filling), so a tenant claiming no
  more than its share is *satisfied* and keeps `HEADROOM` times its claim; the tenants
  over their shares divide the rest by weight. A satisfied tenant keeps its places
  whatever it holds: in a FIFO queue a tenant's calls are held in proportion to the
  whole queue's wait, not to its share, so what it holds says nothing of what its
  next calls need. A tenant over its share keeps its places less what it holds, so
  that among the heavy tenants each gets its weight's part of the worker. A satisfied
  tenant's call is never refused to keep places for a tenant over its share.
Capacity nobody claims is kept for nobody (work-conserving): a tenant alone at a
worker is admitted exactly when issue 38's rule admits it, and the rule is asked at
all only when more than one (band, tenant) is active there.

Guarantees (tests/scheduling/test_shares.py checks each as a property):
- priority order: in any state, if a call of some band is admitted, a call of any
  higher band would be admitted too;
- no starvation: right after a call of a tenant over its share or of a lower band is
  admitted, each satisfied tenant of the band can still place as many calls as it
  keeps places, one after another. So a tenant within its share is refused only when
  its own burst (with the higher bands' and the other satisfied tenants') outgrows
  its places; a tenant that turns up at a worker others have filled gets its places
  as their calls drain (within one deadline), since none is cut.
What it costs: the places kept are unused deadline slack while nobody uses them (the
worker stays busy: a flood fills the rest), and a high band claiming over two thirds
of a worker keeps all of it, so a lower band is refused there even between its calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from rsgw.base._errors import clip
from rsgw.scheduling.calls._forecast import DEADLINE, AdmissionRule

#: Seconds after which a tenant's past arrivals at a worker count half (its claim's memory).
ARRIVAL_HALFLIFE = 2.0
#: A tenant holding nothing at a worker is forgotten there after this many half-lives
#: without an arrival (its claim is then under 0.4 % of what it was).
IDLE_HALFLIVES = 8.0
#: Places kept for a claim, over its mean use (see the module docstring).
HEADROOM = 1.5
#: A tenant claiming up to this much more than its share counts as within it: its
#: measured rate wanders around a true rate at its share.
SLACK = 1.25
#: The weight of a tenant no weight is configured for.
DEFAULT_WEIGHT = 1.0

SHARE = "share"
BAND = "band"

_LN2 = math.log(2.0)
#: Calls ahead past which a depth bounds nothing (and float division stops being exact).
_UNBOUNDED = 2.0**52


def band_of(priority: object, levels: int, default: int) -> int:
    """The band (0 the highest, `levels - 1` the lowest) of a call with `priority`.

    As in Triton, 1 is the highest priority and larger numbers lower; 0, or no
    `priority` parameter (None), is the gateway's `default` (1 to `levels`). A
    priority past `levels` is in the lowest band: a client may use a finer scale
    than the gateway's, and its order is kept as far as the bands go.

    Raises:
        ValueError: `priority` is not a non-negative integer (INVALID_ARGUMENT).
    """
    if type(priority) is int:
        if priority > 0:
            return priority - 1 if priority < levels else levels - 1
        if priority == 0:
            return min(default, levels) - 1
    elif priority is None:
        return min(default, levels) - 1
    kind = type(priority).__name__
    raise ValueError(
        f"parameter 'priority' must be a non-negative integer (1 the highest priority, "
        f"0 the default), not {kind} {clip(repr(priority), 64)}"
    )


def depth_for(per_call: float, left: float, rule: AdmissionRule) -> float:
    """Calls a worker may hold, a newcomer included, for `rule` (issue 38's deadline and
    queue limit) to admit the newcomer: one more than the most calls ahead it admits.

    inf when nothing bounds it (the worker is not measured yet, or neither limit is
    finite). Found with the very comparison the gateway makes inline, so that a lone
    tenant is admitted exactly as before.
    """
    if per_call <= 0.0:
        return math.inf
    bound = min(rule.queue_limit, left - per_call - rule.margin)
    if bound / per_call > _UNBOUNDED:
        return math.inf
    ahead = math.floor(bound / per_call) if bound > 0.0 else 0
    while ahead > 0 and not _admits(ahead, per_call, left, rule):
        ahead -= 1
    while _admits(ahead + 1, per_call, left, rule):
        ahead += 1
    return ahead + 1


def _admits(ahead: int, per_call: float, left: float, rule: AdmissionRule) -> bool:
    wait = ahead * per_call
    return not (wait > rule.queue_limit or wait + per_call + rule.margin > left)


def places(fraction: float, total: float) -> int:
    """The places a fraction of `total` keeps: rounded down, but at least one for any
    fraction above 0, so that no tenant is starved by rounding."""
    if fraction <= 0.0 or total <= 0.0:
        return 0
    whole = math.floor(fraction * total)
    return whole if whole > 1 else 1


def keep_fractions(claims: Sequence[float], weights: Sequence[float]) -> list[tuple[float, bool]]:
    """Each tenant's fraction of its band's room, and whether it is satisfied, from its
    claim and weight (> 0).

    Max-min fair by weight (water-filling): a tenant claiming at most its weighted share
    (`SLACK` times it) of what the lighter ones leave is satisfied, and keeps `HEADROOM`
    times its claim (all of them scaled down together if that is more than the room);
    the others are over their shares and divide the rest by weight.
    """
    order = sorted(range(len(claims)), key=lambda i: claims[i] / weights[i])
    share_left, weight_left = 1.0, math.fsum(weights)
    satisfied, count = 0.0, 0
    for i in order:
        if claims[i] > share_left or claims[i] * weight_left > share_left * weights[i] * SLACK:
            break  # over its share, and so is every heavier one
        share_left -= claims[i]
        weight_left -= weights[i]
        satisfied += claims[i]
        count += 1
    scale = HEADROOM if satisfied * HEADROOM <= 1.0 else 1.0 / satisfied
    rest = max(0.0, 1.0 - satisfied * scale)
    fractions = [(0.0, False)] * len(claims)
    for rank, i in enumerate(order):
        if rank < count:
            fractions[i] = (claims[i] * scale, True)
        else:
            fractions[i] = (rest * weights[i] / weight_left, False)
    return fractions


def band_keep(claim: float, depth: float) -> int:
    """The places a tenant of a higher band keeps from the lower ones: its claim with
    `HEADROOM`, at most the whole worker."""
    return places(min(1.0, HEADROOM * claim), depth)


@dataclass(frozen=True, slots=True)
class ShareVerdict:
    """Why a call was refused: `reason` (SHARE, BAND or DEADLINE) and the numbers.

    `share` is the tenant's weight over its band's active weights, `own` the places
    its share keeps it and `mine` the calls it holds, `room` the places its band has
    after the higher bands, `held` the calls the worker holds, `depth` as in `depth_for`.
    """

    reason: str
    band: int
    tenant: str
    share: float
    own: int
    mine: int
    room: int
    held: int
    depth: float


def describe_share(verdict: ShareVerdict, model: str, where: str) -> str:
    """The refusal's message: who was refused, and whose places it would have taken."""
    subject = f"model '{model}'" if model else "call"
    tenant = f"tenant '{verdict.tenant}'" if verdict.tenant else "the anonymous tenant"
    band = f"priority band {verdict.band + 1}"
    if verdict.reason == SHARE:
        return (
            f"{subject} not admitted: {tenant} holds {verdict.mine} calls {where}, its share "
            f"({verdict.share:.2f} of {band}) keeps it {verdict.own} of the {verdict.room} "
            f"places that finish in time, and the others' are taken; retry later or elsewhere"
        )
    if verdict.reason == BAND:
        return (
            f"{subject} not admitted: higher-priority calls claim the places {where} "
            f"({verdict.room} of {verdict.depth:g} left to {band}, {verdict.held} held); "
            f"retry later or elsewhere"
        )
    return (
        f"{subject} not admitted: {where} {verdict.held} calls are ahead of it, and it "
        f"finishes before its deadline behind {verdict.depth - 1:g} at most; "
        f"retry later or elsewhere"
    )


class _Entry:
    """One (band, tenant) at one worker: the calls it holds there, its recent arrivals."""

    __slots__ = ("arrivals", "held", "last")

    def __init__(self, now: float) -> None:
        self.held = 0
        self.arrivals = 0.0  # decayed count, as of `last`
        self.last = now  # its last arrival


class _Worker:
    __slots__ = ("bands", "entries", "held", "swept")

    def __init__(self, now: float) -> None:
        #: band -> tenant -> entry.
        self.bands: dict[int, dict[str, _Entry]] = {}
        self.entries = 0
        self.held = 0
        self.swept = now


_NOBODY: dict[str, _Entry] = {}


@dataclass(frozen=True, slots=True)
class Usage:
    """What one tenant of one band uses at one worker: calls held, arrivals per second."""

    url: str
    band: int
    tenant: str
    held: int
    rate: float


class Shares:
    """Each worker's calls and recent arrivals by (band, tenant), and the rule over them.

    The gateway calls `arrived` for every call it routes to a worker (refused ones
    too: a refused tenant still claims its share), then `judge`, then `hold` if
    admitted and `unhold` when the call is over there. `weights` (tenant -> weight,
    `DEFAULT_WEIGHT` for others) may be replaced at any time.
    """

    def __init__(
        self, weights: Mapping[str, float] | None = None, half_life: float = ARRIVAL_HALFLIFE
    ) -> None:
        self.weights: Mapping[str, float] = {}
        self.set_weights(weights or {})
        self.half_life = half_life
        self._idle = IDLE_HALFLIVES * half_life
        self._workers: dict[str, _Worker] = {}

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Each named tenant's weight from now on (`DEFAULT_WEIGHT` for the others).

        Raises:
            ValueError: a weight is not a positive number.
        """
        for tenant, weight in weights.items():
            if not (weight > 0 and math.isfinite(weight)):
                raise ValueError(f"tenant '{tenant}' has weight {weight!r}: weights are above 0")
        self.weights = dict(weights)

    def _entry(self, url: str, band: int, tenant: str, now: float) -> tuple[_Worker, _Entry]:
        worker = self._workers.get(url)
        if worker is None:
            worker = self._workers[url] = _Worker(now)
        tenants = worker.bands.get(band)
        if tenants is None:
            tenants = worker.bands[band] = {}
        entry = tenants.get(tenant)
        if entry is None:
            entry = tenants[tenant] = _Entry(now)
            worker.entries += 1
        return worker, entry

    def arrived(self, url: str, band: int, tenant: str, now: float) -> None:
        """A call of `tenant` in `band` was routed to `url` at `now`."""
        worker, entry = self._entry(url, band, tenant, now)
        entry.arrivals = self._decayed(entry, now) + 1.0
        if now > entry.last:
            entry.last = now
        if now - worker.swept > self._idle:
            self._sweep(worker, now)

    def hold(self, url: str, band: int, tenant: str, now: float) -> None:
        """The call was admitted: `url` holds it until `unhold`."""
        worker, entry = self._entry(url, band, tenant, now)
        entry.held += 1
        worker.held += 1

    def unhold(self, url: str, band: int, tenant: str) -> None:
        """A call `hold` counted is over at `url` (answered, failed or cancelled)."""
        worker = self._workers.get(url)
        entry = worker.bands.get(band, _NOBODY).get(tenant) if worker is not None else None
        if worker is not None and entry is not None and entry.held > 0:
            entry.held -= 1
            worker.held -= 1

    def held(self, url: str) -> int:
        """Calls `hold` counts at `url` now."""
        worker = self._workers.get(url)
        return worker.held if worker is not None else 0

    def forget(self, url: str) -> None:
        """`url` left the fleet."""
        self._workers.pop(url, None)

    def _sweep(self, worker: _Worker, now: float) -> None:
        """Forget the tenants idle at `worker`: holding nothing, no arrival for a while."""
        worker.swept = now
        for band, tenants in list(worker.bands.items()):
            for tenant, entry in list(tenants.items()):
                if not entry.held and now - entry.last > self._idle:
                    del tenants[tenant]
                    worker.entries -= 1
            if not tenants:
                del worker.bands[band]

    def _decayed(self, entry: _Entry, now: float) -> float:
        """`entry`'s arrivals as of `now`, each counting half after a half-life."""
        since = now - entry.last
        return entry.arrivals * 0.5 ** (since / self.half_life) if since > 0 else entry.arrivals

    def _rate(self, entry: _Entry, now: float) -> float:
        """`entry`'s arrivals per second, recently (a steady rate reads as itself)."""
        return self._decayed(entry, now) * _LN2 / self.half_life

    def _claim(self, entry: _Entry, now: float, per_call: float) -> float:
        """The fraction of the worker's drain `entry`'s arrivals would use (at most 1)."""
        claim = self._rate(entry, now) * per_call
        return claim if claim < 1.0 else 1.0

    def usage(self, now: float) -> Iterator[Usage]:
        """Every active (band, tenant) at every worker, for status and metrics."""
        for url, worker in self._workers.items():
            for band, tenants in worker.bands.items():
                for tenant, entry in tenants.items():
                    yield Usage(url, band, tenant, entry.held, self._rate(entry, now))

    def judge(
        self,
        url: str,
        band: int,
        tenant: str,
        held: int,
        depth: float,
        per_call: float,
        now: float,
    ) -> ShareVerdict | None:
        """None to admit a call of `tenant` in `band` to `url`, which holds `held` calls
        and can hold `depth` (`depth_for`) at `per_call` seconds each; else why not."""
        if held + 1 > depth:
            return ShareVerdict(DEADLINE, band, tenant, 0.0, 0, 0, 0, held, depth)
        worker = self._workers.get(url)
        if worker is None or depth == math.inf or worker.entries == 0:
            return None
        if worker.entries == 1 and tenant in worker.bands.get(band, _NOBODY):
            return None  # alone: issue 38's rule, already passed
        return self._judge(worker, band, tenant, held, int(depth), per_call, now)

    def _judge(
        self,
        worker: _Worker,
        band: int,
        tenant: str,
        held: int,
        depth: int,
        per_call: float,
        now: float,
    ) -> ShareVerdict | None:
        idle = self._idle
        above_keep = 0  # places higher bands keep free for their next calls
        for level, tenants in worker.bands.items():
            if level < band:
                for entry in tenants.values():
                    if entry.held or now - entry.last <= idle:
                        above_keep += band_keep(self._claim(entry, now, per_call), depth)
        room = depth - above_keep if depth > above_keep else 0
        if held + 1 + above_keep > depth:
            return ShareVerdict(BAND, band, tenant, 0.0, 0, 0, room, held, depth)
        peers = worker.bands.get(band, _NOBODY)
        if len(peers) - (tenant in peers) == 0:
            return None
        others, share, own, mine = self._peers_keep(peers, tenant, room, per_call, now)
        if held + 1 + above_keep + others <= depth:
            return None
        return ShareVerdict(SHARE, band, tenant, share, own, mine, room, held, depth)

    def _peers_keep(
        self, peers: dict[str, _Entry], tenant: str, room: int, per_call: float, now: float
    ) -> tuple[int, float, int, int]:
        """Within a band: the places kept from the caller (module docstring), and its
        share, own places and held calls."""
        weights = self.weights
        names: list[str] = []
        claims: list[float] = []
        shares: list[float] = []
        for name, entry in peers.items():
            if entry.held or now - entry.last <= self._idle or name == tenant:
                names.append(name)
                claims.append(self._claim(entry, now, per_call))
                shares.append(weights.get(name, DEFAULT_WEIGHT))
        if tenant not in peers:
            names.append(tenant)
            claims.append(0.0)
            shares.append(weights.get(tenant, DEFAULT_WEIGHT))
        fractions = keep_fractions(claims, shares)
        content = fractions[names.index(tenant)][1]
        satisfied_keep, over_keep, own, mine = 0, 0, 0, 0
        for name, (fraction, satisfied) in zip(names, fractions, strict=True):
            keep = places(fraction, room)
            held = peers[name].held if name in peers else 0
            if name == tenant:
                own, mine = keep, held
            elif satisfied:
                satisfied_keep += keep
            elif keep > held:
                over_keep += keep - held
        others = satisfied_keep if content else satisfied_keep + over_keep
        share = weights.get(tenant, DEFAULT_WEIGHT) / math.fsum(shares)
        return others, share, own, mine
