"""One GPU's device as a fluid: a round's calls served in closed form, not one by one.

A day of a 64-GPU fleet is hundreds of millions of calls; at one event each the
discrete simulation (`_engine`) would take most of a day. So the fleet-day simulation
(`_day`) steps time in prober rounds and, for each GPU, serves the round's calls from
the same cost model the worker runs (`ModelSpec.execution_seconds` and
`weight_load_seconds`) and the same weight cache (`WeightCache`), in closed form.

Pure: no trio, no sockets, no clock.

Theory of operation
-------------------

Under eager dispatch the worker runs, for the model it takes next, every call of that
model queued so far, up to its max batch. Over a round of `dt` seconds with `q[m]`
calls of model m to serve (its backlog plus the round's arrivals), a device that
cycles through its models `n` times runs `n * batches(q[m] / n)` batches of model m
(`batches_per_cycle`: one in a cycle its calls come in, or more, full, when more than
`B` come, as fifo takes the oldest call's model again) and spends

    f(n) = sum over m of  visit[m] * n * batches(q[m] / n)  +  item[m] * q[m]

where `visit` is the launch (plus a weight load when the cache thrashes, below).
`f` grows with `n`, piecewise linearly, from "full batches only" to "every call
alone". If every call alone fits in the round, the device keeps up with single-call
batches and idles the rest; if even full batches do not fit, it serves the same share
of every model's calls in full batches and the rest waits; otherwise it is busy the
whole round, running the `n` cycles with `f(n) = dt`.

A served call waits for the backlog ahead of it (under fifo the whole device's backlog
over its service rate, as calls leave in arrival order; else its model's), then for
its model's next batch (uniform over the gap between two), then its batch runs; the
share of the round's calls within the SLO is that of the uniform's range. Calls still
queued past the deadline give up; under a shedding mode a worker's queue is held to
the admission cap and the rest is refused. The cap also bounds a cycle (see
`serve_round`): past it, batches shrink and the device falls behind.

A model has `1 - e^-c` batches in a cycle in which `c` of its calls arrive on average
(Poisson arrivals: a cold model is skipped in some cycles), and at least `c / B`.

Weights: if the round's active models fit the budget, each one not resident loads
once (through the `WeightCache`, which evicts by LRU) and the load time comes out of
the round; if they do not fit, an LRU visited in cycles misses on every visit, so every
visit pays a load.

What it leaves out: Poisson bursts (the fluid is optimistic near saturation, where
a burst's queue is what breaks the SLO), the dynamic batcher (eager dispatch only),
and the order in which `edf` and `fair` pick models (all take one model per turn).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from rsgw.simulate._device import device_weights
from rsgw.worker.device._weights import WeightCache
from rsgw.worker.models._specs import ModelSpec

#: Latency histogram: log-spaced bins from 0.1 ms to ~1000 s, 20 per decade.
_BINS_PER_DECADE = 20
_LOWEST = 1e-4
_NBINS = 7 * _BINS_PER_DECADE + 1


@dataclass(frozen=True, slots=True)
class Served:
    """How a round went on one device: per model (in the order given) the calls served
    and the batches run, and the device time it took."""

    calls: tuple[float, ...]
    batches: tuple[float, ...]
    busy_s: float
    cycles: float = 0.0  # inf: every call ran alone


def serve_round(
    dt: float, parts: list[tuple[float, float, float, float]], cap: float = math.inf
) -> Served:
    """Serve models given as (calls q, max batch B, visit s, item s) within `dt` s,
    with at most `cap` calls at the device at once.

    Every call alone (q visits) if that fits; else the number of cycles `n` with
    f(n) = dt, where a model runs max(min(n, q), q / B) batches (at most one per call,
    at least full ones: a model with more than B calls a cycle is taken again, as
    fifo takes the oldest call's model); else, when even full batches of everything
    do not fit, the same share of every model's calls in full batches. A model's calls
    gather at the device from one of its batches to the next, so on average the device
    holds half a cycle's calls: when that would pass `cap`, the cycles hold `2 * cap`
    calls, shared by the models as their calls are, and the device serves as many such
    cycles as fit (the rest wait for a slot).
    """
    served = _uncapped(dt, parts)
    cycles = served.cycles
    total = sum(p[0] for p in parts)
    if cycles <= 0 or sum(served.calls) / cycles <= 2 * cap:
        return served
    per_cycle = [2 * cap * q / total for q, _, _, _ in parts]
    batches = [batches_per_cycle(c, p[1]) for c, p in zip(per_cycle, parts, strict=True)]
    cost = sum(b * p[2] + c * p[3] for b, c, p in zip(batches, per_cycle, parts, strict=True))
    n = min(dt / cost, total / (2 * cap))
    return Served(
        tuple(min(p[0], c * n) for c, p in zip(per_cycle, parts, strict=True)),
        tuple(b * n for b in batches),
        n * cost,
        n,
    )


def batches_per_cycle(calls: float, max_batch: float) -> float:
    """Batches a model runs in a cycle in which `calls` of its calls come (on average):
    one if any came (Poisson: 1 - e^-calls), and at least full ones."""
    return max(-math.expm1(-calls), calls / max_batch)


def _uncapped(dt: float, parts: list[tuple[float, float, float, float]]) -> Served:
    alone = sum(q * (v + i) for q, _, v, i in parts)
    if alone <= dt:
        calls = tuple(p[0] for p in parts)
        return Served(calls, calls, alone, math.inf)
    full = sum(q * (v / b + i) for q, b, v, i in parts)
    if full >= dt:
        share = dt / full
        calls = tuple(q * share for q, _, _, _ in parts)
        batches = tuple(c / p[1] for c, p in zip(calls, parts, strict=True))
        return Served(calls, batches, dt, max(batches))

    def spent(n: float) -> tuple[float, float]:
        """f(n) and its slope (a batch's launch for every model batching below full)."""
        total = slope = 0.0
        for q, b, v, i in parts:
            x = q / n
            once = -math.expm1(-x)
            if once >= x / b:
                total += v * n * once
                slope += v * (once - x * math.exp(-x))
            else:
                total += v * q / b
            total += i * q
        return total, slope

    # f grows with n from `full` towards `alone`: Newton's method within a bracket.
    low, high = 0.0, max(1.0, sum(p[0] for p in parts))
    while spent(high)[0] < dt and high < 1e12:
        low, high = high, high * 4
    n = (low + high) / 2
    for _ in range(60):
        value, slope = spent(n)
        if abs(value - dt) <= 1e-9 * dt:
            break
        if value < dt:
            low = n
        else:
            high = n
        step = n + (dt - value) / slope if slope > 0 else math.nan
        n = step if low < step < high else (low + high) / 2
    batches = tuple(n * batches_per_cycle(q / n, b) for q, b, _, _ in parts)
    return Served(tuple(p[0] for p in parts), batches, dt, n)


@dataclass(slots=True)
class RoundFigures:
    """What one GPU did in one round (calls are fractional: expected values)."""

    arrived: float = 0.0
    served: float = 0.0
    good: float = 0.0  # served within the SLO
    late: float = 0.0  # gave up queued past the deadline
    shed: float = 0.0  # refused: the worker's queue was at the admission cap
    dispatches: float = 0.0
    #: Sum over served calls of their batch's depth: / served = rows-weighted depth.
    depth_rows: float = 0.0
    loads: float = 0.0
    evicts: float = 0.0
    busy_s: float = 0.0

    def add(self, other: RoundFigures, times: float = 1.0) -> None:
        self.arrived += other.arrived * times
        self.served += other.served * times
        self.good += other.good * times
        self.late += other.late * times
        self.shed += other.shed * times
        self.dispatches += other.dispatches * times
        self.depth_rows += other.depth_rows * times
        self.loads += other.loads * times
        self.evicts += other.evicts * times
        self.busy_s += other.busy_s * times


@dataclass(slots=True)
class LatencyHistogram:
    """Served calls by latency, log-spaced: enough for p50 and p99 of a day."""

    counts: list[float] = field(default_factory=lambda: [0.0] * _NBINS)

    def add_uniform(self, low: float, width: float, mass: float) -> None:
        """`mass` calls spread evenly over [low, low + width] (four points)."""
        for k in range(4):
            self.add(low + width * (k + 0.5) / 4, mass / 4)

    def add(self, latency: float, mass: float) -> None:
        x = max(latency, _LOWEST)
        b = min(_NBINS - 1, int(math.log10(x / _LOWEST) * _BINS_PER_DECADE))
        self.counts[b] += mass

    def merge(self, other: LatencyHistogram, times: float = 1.0) -> None:
        for b, c in enumerate(other.counts):
            self.counts[b] += c * times

    def quantile(self, q: float) -> float:
        """The upper edge of the bin holding quantile `q` (nan when empty)."""
        total = sum(self.counts)
        if total <= 0:
            return math.nan
        acc = 0.0
        for b, c in enumerate(self.counts):
            acc += c
            if acc >= q * total:
                return _LOWEST * 10 ** ((b + 1) / _BINS_PER_DECADE)
        return math.inf


@dataclass(slots=True)
class FluidDevice:
    """One GPU worker as a fluid, stepped a round at a time by `_day`.

    Args:
        url: the worker's name in the gateway's tables.
        specs: its catalogue (model -> spec).
        weight_cache_bytes: the on-demand weight budget; 0 keeps every model resident.
        time_scale: multiplies every cost, as the worker's --time-scale does.
        load_bandwidth: bytes/s for models without a catalogue load time.
    """

    url: str
    specs: Mapping[str, ModelSpec]
    weight_cache_bytes: int
    time_scale: float = 1.0
    load_bandwidth: float = 8 * 1024**3
    backlog: dict[str, float] = field(default_factory=dict)
    cache: WeightCache = field(init=False)
    #: model -> [compute s, requests, rows], cumulative: the worker's poll counters.
    per_model: dict[str, list[float]] = field(init=False)
    compute_s: float = 0.0  # the sum of per_model's compute seconds
    discipline: str = "fifo"

    def __post_init__(self) -> None:
        self.cache = device_weights(self.specs, self.weight_cache_bytes)
        self.per_model = {m: [0.0, 0.0, 0.0] for m in self.specs}

    def step(
        self,
        arrivals: Mapping[str, float],
        now: float,
        dt: float,
        slo_s: float,
        deadline_s: float,
        cap: float,
        sheds: bool,
        latencies: LatencyHistogram,
    ) -> RoundFigures:
        """Serve one round: `arrivals` (model -> calls) on top of the backlog.

        `cap` bounds the calls the gateway lets the worker hold at once; beyond it
        calls are refused (`sheds`, lpt_packing's request path) or wait in their
        clients until a slot frees or their deadline passes.
        """
        figures = RoundFigures(arrived=sum(arrivals.values()))
        demand = dict(self.backlog)
        for model, calls in arrivals.items():
            if calls > 0:
                demand[model] = demand.get(model, 0.0) + calls
        if not demand:
            return figures
        spent_loading = self._load_weights(demand, now, figures)
        thrash = spent_loading is None
        room = dt if thrash else max(0.0, dt - (spent_loading or 0.0))
        parts = []
        for model, q in demand.items():
            spec = self.specs[model]
            visit = spec.launch_seconds * self.time_scale
            visit += self._load_s(model) if thrash else 0.0
            item = spec.item_seconds * self.time_scale
            parts.append((q, float(max(1, spec.max_batch_size)), visit, item))
        served = serve_round(room, parts, cap) if room > 0 else None
        if served is None:
            served = Served((0.0,) * len(parts), (0.0,) * len(parts), 0.0)
        figures.busy_s = served.busy_s + (0.0 if thrash else (spent_loading or 0.0))
        busy = served.busy_s >= room  # else every call ran alone, as it came
        # fifo serves calls in arrival order, so when the device falls behind every
        # model's calls wait alike: the whole backlog over the whole service rate.
        fifo_wait = None
        total = sum(served.calls)
        if self.discipline == "fifo" and total > 0:
            before = sum(self.backlog.values())
            left = sum(p[0] for p in parts) - total
            fifo_wait = (before + left) / 2 / (total / dt)
        held = 0.0
        for (q, _, visit, item), done, visits, model in zip(
            parts, served.calls, served.batches, demand, strict=True
        ):
            left = q - done
            rate = done / dt
            if done > 0:
                wait = (self.backlog.get(model, 0.0) + left) / 2 / rate
                if fifo_wait is not None:
                    wait = fifo_wait
                run = visit + item * done / visits
                within = slo_s - wait - run
                gap = dt / visits if busy else 0.0  # between two of the model's batches
                share = within / gap if gap else (1.0 if within >= 0 else 0.0)
                figures.good += done * min(1.0, max(0.0, share))
                latencies.add_uniform(wait + run, gap, done)
                figures.depth_rows += done * done / visits
                # Compute is launches and rows, not loads (as the worker counts it).
                compute = visits * self.specs[model].launch_seconds * self.time_scale
                compute += item * done
                self.compute_s += compute
                counters = self.per_model[model]
                counters[0] += compute
                counters[1] += done
                counters[2] += done
                if thrash:
                    figures.loads += visits
                    figures.evicts += visits
            figures.served += done
            figures.dispatches += visits
            keep = min(left, rate * deadline_s)
            figures.late += left - keep
            if keep > 1e-9:
                self.backlog[model] = keep
                held += keep
            else:
                self.backlog.pop(model, None)
        if sheds and held > cap:
            scale = cap / held
            for model in self.backlog:
                self.backlog[model] *= scale
            figures.shed += held - cap
        return figures

    def _load_s(self, model: str) -> float:
        spec = self.specs[model]
        return spec.weight_load_seconds(spec.weight_bytes, self.load_bandwidth) * self.time_scale

    def _load_weights(
        self, demand: Mapping[str, float], now: float, figures: RoundFigures
    ) -> float | None:
        """Seconds of loads the round pays once, or None when the active models' weights
        exceed the budget (every visit loads; the cache is left as a cycle leaves it)."""
        if self.weight_cache_bytes <= 0:
            return 0.0
        need = sum(self.specs[m].weight_bytes for m in demand)
        spent = 0.0
        for model in demand:
            load = self.cache.load(model, now)
            if load is not None and need <= self.weight_cache_bytes:
                figures.loads += 1
                figures.evicts += len(load.evicted)
                spent += self._load_s(model)
        return spent if need <= self.weight_cache_bytes else None
