"""Scenarios as data (YAML), their arrivals, and the capacity each is offered a share of.

Shared by `bench/fleet` (which runs a scenario through real processes; its scenarios
live in bench/fleet/scenarios/NAME.yaml) and `rsgw simulate` (which replays it in
virtual time), so both read the same file the same way and send the same arrivals.

A scenario fixes the fleet (workers, discipline, weight budget), the models (count,
popularity, max batch, launch and per-row cost, load time, weights as a fraction of the
fleet's budget, optional dynamic batching), the SLO, and optional phases in which the
popularity changes. Its capacity is derived, never tuned against a result:

1. a reference placement: the models' traffic split into as few equal parts as keep
   every part within one GPU's fair share (a hot model gets replicas), placed on the
   GPUs within their weight budget so that the busiest GPU's share of the traffic is as
   small as it can be (exhaustive search with symmetry breaking);
2. the highest total rate at which, in that placement, a simulation of the worker's own
   cost model (`_capacity`) keeps every GPU's p99 latency within the SLO. This counts
   the launch each co-resident model pays per cycle, which "every GPU in full batches"
   does not.

The offered load is a fraction of that capacity, time-scaled (`--time-scale` of the
workers, and the SLO with it) by the smallest whole factor that keeps the highest load
of the sweep within what this machine's two cores can send and proxy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.simulate import _capacity
from rsgw.simulate._results import Schedule
from rsgw.worker._batching import Discipline

DEFAULT_LOADS = (0.3, 0.5, 0.7, 0.9, 1.1)
MAX_OFFERED_RPS = 400.0  # what bench/fleet asks the machine's 2 cores to carry
#: Above this many model parts the reference placement is greedy (heaviest part onto the
#: lightest GPU), not exhaustive: the bench's scenarios stay well below it.
EXHAUSTIVE_PARTS = 24
# Request elements: one row of 16 FP32, so a request is small and the gateway's cost per
# call is what bench/overhead measured for 1 KiB calls or less.
ROW_ELEMENTS = 16


@dataclass(frozen=True)
class RunSettings:
    """How a scenario is run, the same in bench/fleet and in `rsgw simulate`.

    The gateway's prober round (default 10 s) also ticks lpt_packing's packer and
    refreshes least_outstanding's per-model costs; 2 s lets the first repack happen
    inside the warm-up. Every mode runs with it, so they differ only in scheduling.
    lpt_packing's first repack comes after `first_repack_compute_s` fleet GPU-seconds,
    small enough to fall within the first seconds of the warm-up; later ones every
    `repack_compute_s`: the default (300) is meant for a real node, and here every
    duration is stretched by the time scale, so at 70% load four GPUs would take
    minutes to spend it and a run would see only the first repack, made from two
    seconds of traffic. 40 lets repacks recur every 15 s or so at that load, so the
    packer can correct its first guess and follow a shift in popularity within a run;
    the hysteresis and the plan's gain floor still keep it from moving weights for
    small gains. A call not answered within `deadline_s` (at least three SLOs) counts
    as failed.
    """

    warmup_s: float = 20.0
    measure_s: float = 60.0
    health_interval_s: float = 2.0
    first_repack_compute_s: float = 2.0
    repack_compute_s: float = 40.0
    deadline_s: float = 5.0

    def deadline(self, scenario: Scenario, time_scale: float) -> float:
        """Seconds a call gets: `deadline_s`, or three scaled SLOs when longer."""
        return max(self.deadline_s, 3 * scenario.slo_ms * time_scale / 1000)

    def gateway_scheduling(self, mode: str) -> dict[str, Any]:
        """The gateway.yml `scheduling` section for `mode`."""
        scheduling: dict[str, Any] = {"mode": mode, "work_basis": "compute"}
        if mode == "lpt_packing":
            scheduling["first_rebalance_compute_seconds"] = self.first_repack_compute_s
            scheduling["rebalance_compute_seconds"] = self.repack_compute_s
        return scheduling


def request_body(model: str, rows: int = 1) -> bytes:
    """`rows` rows of a scenario model's FP32 input: the ModelInfer body of a call."""
    return pb.ModelInferRequest(
        model_name=model,
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="INPUT0", datatype="FP32", shape=[rows, ROW_ELEMENTS]
            )
        ],
        raw_input_contents=[bytes(4 * ROW_ELEMENTS * rows)],
    ).SerializeToString()


class ScenarioError(Exception):
    """A scenario file that cannot be used: names the file and the key."""


@dataclass(frozen=True)
class Phase:
    """From `at` (fraction of the whole run) on, requests follow `shares`."""

    at: float
    shares: tuple[float, ...]
    #: The file's popularity for the phase, so a resized scenario can recompute it.
    spec: Mapping[str, Any] = field(default_factory=dict, compare=False)


def _phase_spec(scenario: Scenario, phase: Phase) -> Mapping[str, Any]:
    return phase.spec or scenario.popularity


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    workers: int
    discipline: str
    budget_bytes: int
    slo_ms: float  # unscaled
    count: int
    shares: tuple[float, ...]
    max_batch: int
    launch_ms: float
    item_ms: float
    load_ms: float
    weight_bytes: int
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    phases: tuple[Phase, ...] = ()
    loads: tuple[float, ...] = DEFAULT_LOADS
    source: str = field(default="", compare=False)
    #: How the file sized it, so `resized` can size it again.
    popularity: Mapping[str, Any] = field(default_factory=dict, compare=False)
    weight_fraction: float = 0.0

    def model_name(self, i: int) -> str:
        """Model i (1-based); zero-padded so name order is first-phase popularity order."""
        return f"m{i:02d}"

    @property
    def names(self) -> list[str]:
        return [self.model_name(i + 1) for i in range(self.count)]

    def shares_at(self, fraction: float) -> tuple[float, ...]:
        """The popularity in force at `fraction` of the run."""
        shares = self.shares
        for phase in self.phases:
            if fraction >= phase.at:
                shares = phase.shares
        return shares

    @property
    def slots_per_gpu(self) -> int:
        return max(1, self.budget_bytes // self.weight_bytes) if self.weight_bytes else self.count

    def catalogue_yaml(self) -> str:
        """The workers' model catalogue: identical GPU-shaped models, synthetic compute."""
        lines = [f"# bench/fleet scenario {self.name} (generated).", "models:"]
        for name in self.names:
            lines += [
                f"  - name: {name}",
                f"    inputs: [{{name: INPUT0, datatype: FP32, shape: [-1, {ROW_ELEMENTS}]}}]",
                f"    outputs: [{{name: OUTPUT0, datatype: FP32, shape: [-1, {ROW_ELEMENTS}]}}]",
                f"    max_batch_size: {self.max_batch}",
                f"    launch_ms: {self.launch_ms}",
                f"    item_ms: {self.item_ms}",
                f"    weight_bytes: {self.weight_bytes}",
                f"    load_ms: {self.load_ms}",
            ]
            if self.max_queue_delay_us:
                lines.append(f"    max_queue_delay_microseconds: {self.max_queue_delay_us}")
            if self.preferred_batch_size:
                lines.append(f"    preferred_batch_size: {list(self.preferred_batch_size)}")
        return "\n".join(lines) + "\n"

    def resized(self, workers: int, count: int) -> Scenario:
        """The same scenario on `workers` GPUs with `count` models: popularity and weight
        fraction as the file gives them (a `zipf` popularity; explicit `shares` fix the
        count), phases likewise.

        Raises:
            ScenarioError: the popularity is a list of shares and `count` differs.
        """
        if count != self.count and "shares" in self.popularity:
            raise ScenarioError(
                f"{self.source}: popularity is a list of {self.count} shares; "
                "--models needs a zipf popularity"
            )
        where = f"{self.source}: models.popularity"
        phases = tuple(
            replace(p, shares=_shares(_phase_spec(self, p), count, where)) for p in self.phases
        )
        weight = int(self.weight_fraction * workers * self.budget_bytes / count)
        return replace(
            self,
            workers=workers,
            count=count,
            shares=_shares(self.popularity, count, where),
            weight_bytes=weight,
            phases=phases,
        )

    def with_batcher(self, delay_us: int, preferred: Sequence[int] = ()) -> Scenario:
        """This scenario with every model's dynamic batcher set (0: eager)."""
        return replace(self, max_queue_delay_us=delay_us, preferred_batch_size=tuple(preferred))


# --------------------------------------------------------------------------- loading


def _shares(spec: object, count: int, where: str) -> tuple[float, ...]:
    if not isinstance(spec, Mapping):
        raise ScenarioError(f"{where} must be {{zipf: S}} or {{shares: [...]}}")
    if "shares" in spec:
        raw = [float(x) for x in spec["shares"]]
        if len(raw) != count or min(raw) < 0 or sum(raw) <= 0:
            raise ScenarioError(f"{where}.shares must be {count} non-negative numbers")
    elif "zipf" in spec:
        raw = [i ** -float(spec["zipf"]) for i in range(1, count + 1)]
    else:
        raise ScenarioError(f"{where} needs zipf or shares")
    if spec.get("reverse"):
        raw.reverse()
    total = sum(raw)
    return tuple(r / total for r in raw)


def load_scenario(path: Path, known: Sequence[str] = ()) -> Scenario:
    """The scenario in the YAML file `path`; `known` names others, for the error."""
    try:
        data: Any = yaml.safe_load(path.read_text())
    except OSError as exc:
        others = f" (scenarios: {', '.join(known)})" if known else ""
        raise ScenarioError(f"{path}: {exc.strerror}{others}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{path}: expected a mapping of scenario keys")
    where = str(path)
    try:
        models = data["models"]
        count = int(models["count"])
        workers = int(data["workers"])
        budget = int(data["budget_bytes"])
        weight = int(float(models["weight_fraction"]) * workers * budget / count)
        phases = tuple(
            Phase(
                float(p["at"]),
                _shares(p["popularity"], count, f"{where}: phases[{i}]"),
                dict(p["popularity"]),
            )
            for i, p in enumerate(data.get("phases") or [])
        )
        return Scenario(
            name=path.stem,
            description=str(data.get("description", path.stem)),
            workers=workers,
            discipline=str(data.get("discipline", "fifo")),
            budget_bytes=budget,
            slo_ms=float(data["slo_ms"]),
            count=count,
            shares=_shares(models["popularity"], count, f"{where}: models.popularity"),
            max_batch=int(models["max_batch"]),
            launch_ms=float(models["launch_ms"]),
            item_ms=float(models["item_ms"]),
            load_ms=float(models.get("load_ms", 0)),
            weight_bytes=weight,
            max_queue_delay_us=int(models.get("max_queue_delay_us", 0)),
            preferred_batch_size=tuple(models.get("preferred_batch_size", ())),
            phases=phases,
            loads=tuple(float(x) for x in data.get("loads", DEFAULT_LOADS)),
            source=where,
            popularity=dict(models["popularity"]),
            weight_fraction=float(models["weight_fraction"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioError(f"{where}: missing or bad key: {exc}") from None


# --------------------------------------------------------------------------- capacity


@dataclass(frozen=True)
class Packing:
    """A reference placement: per GPU, (model number 1-based, share of its traffic)."""

    groups: tuple[tuple[tuple[int, float], ...], ...]
    shares: tuple[float, ...]  # the share of all requests each GPU serves

    @property
    def bottleneck(self) -> float:
        return max(self.shares)


def replicas_needed(shares: Sequence[float], workers: int, slots: int) -> list[int]:
    """Parts per model: as few as keep each part within one GPU's fair share (1/workers),
    as far as the GPUs' slots allow (the extra parts that help least go first)."""
    parts = [min(workers, max(1, math.ceil(s * workers - 1e-9))) for s in shares]
    while sum(parts) > workers * slots and max(parts) > 1:
        split = [i for i, k in enumerate(parts) if k > 1]
        i = min(split, key=lambda j: shares[j] / (parts[j] - 1))
        parts[i] -= 1
    return parts


def best_packing(shares: Sequence[float], workers: int, slots: int) -> Packing:
    """Minimise the busiest GPU's share, with hot models split into equal parts on
    different GPUs and at most `slots` models per GPU. Exhaustive, symmetry broken."""
    parts = replicas_needed(shares, workers, slots)
    items = sorted(
        ((i + 1, shares[i] / k) for i, k in enumerate(parts) for _ in range(k)),
        key=lambda item: -item[1],
    )
    if len(items) > EXHAUSTIVE_PARTS:
        return _packing(_greedy_groups(items, workers, slots))
    best: tuple[float, list[list[tuple[int, float]]]] = (math.inf, [])
    groups: list[list[tuple[int, float]]] = [[] for _ in range(workers)]
    loads = [0.0] * workers

    def place(i: int) -> None:
        nonlocal best
        if i == len(items):
            worst = max(loads)
            if worst < best[0]:
                best = (worst, [list(g) for g in groups])
            return
        model, share = items[i]
        tried_empty = False
        for g in range(workers):
            if not groups[g]:
                if tried_empty:
                    continue  # empty GPUs are interchangeable
                tried_empty = True
            if len(groups[g]) >= slots or any(m == model for m, _ in groups[g]):
                continue
            if loads[g] + share >= best[0]:
                continue
            groups[g].append((model, share))
            loads[g] += share
            place(i + 1)
            groups[g].pop()
            loads[g] -= share

    place(0)
    return _packing(best[1])


def _greedy_groups(
    items: Sequence[tuple[int, float]], workers: int, slots: int
) -> list[list[tuple[int, float]]]:
    """Heaviest part first onto the lightest GPU with a free slot that lacks the model."""
    groups: list[list[tuple[int, float]]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for model, share in items:
        open_ = [
            g
            for g in range(workers)
            if len(groups[g]) < slots and all(m != model for m, _ in groups[g])
        ]
        if not open_:
            return []
        g = min(open_, key=lambda k: (loads[k], k))
        groups[g].append((model, share))
        loads[g] += share
    return groups


def _packing(found: list[list[tuple[int, float]]]) -> Packing:
    if not found:
        raise ScenarioError(
            "no placement fits: the models' weights need more slots than the GPUs' budgets "
            "hold (fewer models, more GPUs, or a smaller weight_fraction)"
        )
    chosen = [g for g in found if g]
    totals: dict[int, float] = {}
    for group in chosen:
        for model, share in group:
            totals[model] = totals.get(model, 0.0) + share
    return Packing(
        tuple(tuple((m, share / totals[m]) for m, share in g) for g in chosen),
        tuple(sum(share for _, share in g) for g in chosen),
    )


@dataclass(frozen=True)
class Load:
    """The capacity, its derivation, and the time scale of a sweep."""

    packing: Packing
    capacity: float  # req/s at time scale 1 within the SLO (simulated)
    full_batch_capacity: float  # req/s if every GPU ran full batches of one model
    time_scale: float

    def offered(self, fraction: float) -> float:
        """Req/s actually sent at `fraction` of capacity, after time scaling."""
        return fraction * self.capacity / self.time_scale


def derive_load(scenario: Scenario) -> Load:
    shares = scenario.shares
    packing = best_packing(shares, scenario.workers, scenario.slots_per_gpu)
    gpus = [
        [
            (
                _capacity.SimModel(
                    scenario.model_name(model),
                    shares[model - 1],
                    scenario.max_batch,
                    scenario.launch_ms / 1000,
                    scenario.item_ms / 1000,
                    scenario.max_queue_delay_us / 1e6,
                    scenario.preferred_batch_size,
                ),
                part,
            )
            for model, part in group
        ]
        for group in packing.groups
    ]
    capacity = _capacity.capacity(gpus, scenario.slo_ms / 1000, Discipline(scenario.discipline))
    per_item = (scenario.launch_ms + scenario.item_ms * scenario.max_batch) / scenario.max_batch
    full = scenario.workers / (per_item / 1000)
    scale = float(math.ceil(max(scenario.loads) * capacity / MAX_OFFERED_RPS))
    return Load(packing, capacity, full, max(1.0, scale))


def describe(scenario: Scenario, load: Load) -> str:
    """The scenario and its load figures, stated with their derivation."""
    pct = ", ".join(f"{n} {p:.1%}" for n, p in zip(scenario.names, scenario.shares, strict=True))
    groups = "; ".join(
        "{"
        + ",".join(scenario.model_name(m) + ("" if part == 1 else f"x{part:.2f}") for m, part in g)
        + f"}} {s:.1%}"
        for g, s in zip(load.packing.groups, load.packing.shares, strict=True)
    )
    lines = [
        f"scenario {scenario.name}: {scenario.description}",
        f"  {scenario.workers} workers ({scenario.discipline}), {scenario.count} models: {pct}",
        f"  each model: max batch {scenario.max_batch}, {scenario.launch_ms:g} ms + "
        f"{scenario.item_ms:g} ms/row, load {scenario.load_ms:g} ms, weights "
        f"{scenario.weight_bytes:,} B ({scenario.slots_per_gpu} fit a worker's "
        f"{scenario.budget_bytes:,} B)"
        + (
            f"; dynamic batcher {scenario.max_queue_delay_us} us"
            + (
                f", preferred {list(scenario.preferred_batch_size)}"
                if scenario.preferred_batch_size
                else ""
            )
            if scenario.max_queue_delay_us
            else ""
        ),
        f"  reference placement (hot models split, busiest GPU minimised, exhaustive): {groups}",
        f"  capacity: {load.capacity:,.0f} req/s at time scale 1 = the highest rate at which a "
        f"simulation of the worker's cost model keeps every GPU's p99 within the SLO "
        f"({scenario.slo_ms:g} ms) in that placement (every GPU in full batches would be "
        f"{load.full_batch_capacity:,.0f})",
        f"  --time-scale {load.time_scale:g} (smallest whole factor keeping "
        f"{max(scenario.loads):.0%} of capacity <= {MAX_OFFERED_RPS:g} req/s); SLO "
        f"{scenario.slo_ms * load.time_scale:g} ms scaled; loads "
        + ", ".join(f"{f:.0%} = {load.offered(f):.0f} req/s" for f in scenario.loads),
    ]
    for phase in scenario.phases:
        top = max(range(scenario.count), key=lambda i: phase.shares[i])
        lines.append(
            f"  from {phase.at:.0%} of the run: popularity changes, most popular now "
            f"{scenario.model_name(top + 1)} ({phase.shares[top]:.1%})"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- arrivals


def poisson_schedule(scenario: Scenario, rate: float, duration: float, seed: int) -> Schedule:
    """Exponential gaps at `rate`/s for `duration` s; each request's model drawn by the
    popularity in force at its time (the scenario's phases). Depends only on the seed,
    so every mode (and the simulator) meets the same requests at the same times."""
    rng = random.Random(seed)
    times: list[float] = []
    models: list[int] = []
    t = rng.expovariate(rate)
    while t < duration:
        shares = scenario.shares_at(t / duration)
        u = rng.random() * sum(shares)
        acc = 0.0
        pick = len(shares) - 1
        for i, share in enumerate(shares):
            acc += share
            if u < acc:
                pick = i
                break
        times.append(t)
        models.append(pick)
        t += rng.expovariate(rate)
    return Schedule(times, models)
