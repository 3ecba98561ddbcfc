"""A scenario's capacity, from a short simulation of the worker's own cost model.

The simulated worker dispatches one batch at a time, choosing among its models' queues
with `rsgw.worker.device._batching.RequestQueues` (the very code the worker runs), and a batch
of R rows of a model costs `launch + item * R`. So a GPU that holds several models pays
a launch per model per cycle, and a model's batch is only as large as what queued
while the others ran: capacity is not "four GPUs in full batches". Rather than a
closed form, this replays Poisson arrivals through that queue in virtual time (no Trio,
no sockets) for each GPU of a reference placement, and finds by bisection the highest
total rate at which every GPU's p99 latency stays within the scenario's SLO.

Deterministic for a seed; a few seconds for the bench's scenarios.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from rsgw.worker.device._batching import BatchPolicy, Discipline, Pending, RequestQueues

#: Virtual seconds simulated per GPU and rate (after a tenth as warm-up).
SIM_SECONDS = 40.0
BISECTION_STEPS = 18


@dataclass(frozen=True)
class SimModel:
    """What the cost model needs of one model on one GPU: its rate and costs (seconds)."""

    name: str
    rate: float  # requests/s arriving at this GPU for this model
    max_batch: int
    launch_s: float
    item_s: float
    max_queue_delay_s: float = 0.0
    preferred: tuple[int, ...] = ()


def simulate_gpu(
    models: Sequence[SimModel], seconds: float, seed: int, discipline: Discipline
) -> list[float]:
    """Latencies (s) of the requests of `models` arriving at one GPU, sorted.

    Requests still queued at the end count as infinitely late, so an overloaded
    GPU cannot look fast by never answering.
    """
    rng = random.Random(seed)
    arrivals: list[tuple[float, str]] = []
    for model in models:
        t = rng.expovariate(model.rate) if model.rate > 0 else math.inf
        while t < seconds:
            arrivals.append((t, model.name))
            t += rng.expovariate(model.rate)
    heapq.heapify(arrivals)
    spec = {m.name: m for m in models}
    caps = {m.name: m.max_batch for m in models}
    policies = {
        m.name: BatchPolicy(m.max_queue_delay_s, m.preferred)
        for m in models
        if m.max_queue_delay_s > 0
    }
    queues: RequestQueues[None] = RequestQueues(discipline)
    warmup = seconds / 10
    latencies: list[float] = []
    arrived = 0
    now = 0.0
    device_free = 0.0
    while now < seconds * 3:  # far past the last arrival: whatever is left is late
        while arrivals and arrivals[0][0] <= now:
            at, name = heapq.heappop(arrivals)
            queues.enqueue(Pending(name, 1, None, at))
            arrived += at >= warmup
        if device_free <= now:
            batch = queues.next_batch(caps, now, policies)
            if batch is not None and batch.requests:
                model = spec[batch.model]
                took = model.launch_s + model.item_s * batch.rows
                device_free = now + took
                queues.record(batch.model, batch.rows, took, device_free)
                latencies += [
                    device_free - p.enqueued_at for p in batch.requests if p.enqueued_at >= warmup
                ]
                continue
        upcoming = arrivals[0][0] if arrivals else math.inf
        if device_free > now:
            upcoming = min(upcoming, device_free)
        elif len(queues):
            upcoming = min(upcoming, queues.wake_at(policies))
        if upcoming == math.inf:
            break
        now = upcoming
    late = max(0, arrived - len(latencies))
    return sorted(latencies) + [math.inf] * late


def p99(latencies: Sequence[float]) -> float:
    if not latencies:
        return 0.0
    return latencies[max(0, math.ceil(0.99 * len(latencies)) - 1)]


#: With more GPUs than this, only the likeliest bottlenecks are simulated per step.
SIMULATED_GPUS = 8


def busiest(
    gpus: Sequence[Sequence[tuple[SimModel, float]]],
) -> list[tuple[int, Sequence[tuple[SimModel, float]]]]:
    """(index, GPU) of the GPUs whose p99 bounds the capacity: all of them for a small
    fleet; else the four with the most traffic and the four with the most models (the
    most launches per cycle), as every other GPU carries less of both."""
    indexed = list(enumerate(gpus))
    if len(indexed) <= SIMULATED_GPUS:
        return indexed
    half = SIMULATED_GPUS // 2
    by_traffic = sorted(indexed, key=lambda g: -sum(m.rate * part for m, part in g[1]))
    by_models = sorted(indexed, key=lambda g: -len(g[1]))
    chosen = {g for g, _ in by_traffic[:half]} | {g for g, _ in by_models[:half]}
    return [(g, gpus[g]) for g in sorted(chosen)]


def capacity(
    gpus: Sequence[Sequence[tuple[SimModel, float]]],
    slo_s: float,
    discipline: Discipline,
    seed: int = 7,
) -> float:
    """The highest total rate (req/s) at which every GPU's p99 stays within `slo_s`.

    `gpus[g]` lists (model, fraction of the model's traffic this GPU gets) with
    `model.rate` the model's share of one request/s in all; rates are scaled together.
    """

    def fits(total: float) -> bool:
        for g, placed in busiest(gpus):
            models = [
                SimModel(
                    m.name,
                    m.rate * part * total,
                    m.max_batch,
                    m.launch_s,
                    m.item_s,
                    m.max_queue_delay_s,
                    m.preferred,
                )
                for m, part in placed
            ]
            if p99(simulate_gpu(models, SIM_SECONDS, seed + g, discipline)) > slo_s:
                return False
        return True

    low, high = 0.0, 1.0
    while fits(high):
        low, high = high, high * 2
        if high > 1e7:
            return high
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
