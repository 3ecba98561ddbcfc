"""Scenarios as data (YAML), how they are run, and their arrivals.

Shared by `bench/fleet` (which runs a scenario through real processes; its scenarios
live in bench/fleet/scenarios/NAME.yaml) and `rsgw simulate` (which replays it in
virtual time), so both read the same file the same way and send the same arrivals.

A scenario fixes the fleet (workers, discipline, weight budget), the models (count,
popularity, max batch, launch and per-row cost, load time, weights as a fraction of the
fleet's budget, optional dynamic batching), the SLO, and optional phases in which the
popularity changes. The capacity it is offered a share of is derived from it, never
tuned against a result (`_offered.py`).

For issue 52 (`rsgw simulate` only) a scenario may also say who sends the calls:
`traffic`, each tenant's share of the calls and the `priority` parameter they carry
(Triton's: 1 the highest, 0 none), and the gateway's `tenancy:` block in gateway.yml's
own shape (checked by the gateway's own parser, so its errors read the same);
`deadline_ms` gives every call that deadline instead of `RunSettings.deadline`'s.
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
from rsgw.base._errors import ConfigError
from rsgw.base._values import show
from rsgw.config._config import parse_config
from rsgw.scheduling.calls._quotas import tenant_name
from rsgw.simulate._results import Schedule

DEFAULT_LOADS = (0.3, 0.5, 0.7, 0.9, 1.1)
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
        """Seconds a call gets: the scenario's `deadline_ms` (scaled) when it sets one,
        else `deadline_s`, or three scaled SLOs when longer."""
        if scenario.deadline_ms:
            return scenario.deadline_ms * time_scale / 1000
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
class Traffic:
    """One tenant's calls: its `share` of all the calls (relative to the others'), and
    the `priority` parameter they carry (Triton's: 1 the highest; 0: none, so the
    gateway's tenancy block decides)."""

    tenant: str
    share: float
    priority: int = 0


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
    #: Models' weights relative to the mean (`weight_bytes`), model i taking class
    #: i mod len (so every popularity band has every size); (): all alike.
    weight_classes: tuple[float, ...] = ()
    #: The part of a load that does not grow with the weights: a model's load takes
    #: `load_ms` x (this + (1 - this) x its weight / the mean weight).
    load_fixed_fraction: float = 1.0
    #: Who sends the calls (issue 52); (): nobody in particular.
    traffic: tuple[Traffic, ...] = ()
    #: gateway.yml's `tenancy:` block for the simulated gateway, as the file gives it.
    tenancy: Mapping[str, Any] = field(default_factory=dict, compare=False)
    #: Every call's deadline in unscaled ms; 0: `RunSettings.deadline`'s.
    deadline_ms: float = 0.0

    def weight_of(self, i: int) -> int:
        """Model i's (0-based, by popularity) weight in bytes."""
        if not self.weight_classes:
            return self.weight_bytes
        classes = self.weight_classes
        mean = sum(classes) / len(classes)
        return int(self.weight_bytes * classes[i % len(classes)] / mean)

    def load_ms_of(self, i: int) -> float:
        """Model i's (0-based) load time in unscaled ms."""
        fixed = self.load_fixed_fraction
        return self.load_ms * (fixed + (1 - fixed) * self.weight_of(i) / self.weight_bytes)

    @property
    def weights(self) -> dict[str, int]:
        """model name -> weight bytes."""
        return {name: self.weight_of(i) for i, name in enumerate(self.names)}

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
        """The workers' model catalogue: GPU-shaped models, synthetic compute."""
        lines = [f"# bench/fleet scenario {self.name} (generated).", "models:"]
        for i, name in enumerate(self.names):
            lines += [
                f"  - name: {name}",
                f"    inputs: [{{name: INPUT0, datatype: FP32, shape: [-1, {ROW_ELEMENTS}]}}]",
                f"    outputs: [{{name: OUTPUT0, datatype: FP32, shape: [-1, {ROW_ELEMENTS}]}}]",
                f"    max_batch_size: {self.max_batch}",
                f"    launch_ms: {self.launch_ms}",
                f"    item_ms: {self.item_ms}",
                f"    weight_bytes: {self.weight_of(i)}",
                f"    load_ms: {self.load_ms_of(i):g}",
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


def _weight_classes(raw: object, where: str) -> tuple[float, ...]:
    classes = tuple(float(x) for x in raw) if isinstance(raw, list | tuple) else None
    if classes is None or any(not c > 0 for c in classes):
        raise ScenarioError(f"{where}: models.weight_classes must be a list of numbers > 0")
    return classes


def _fraction(raw: object, where: str) -> float:
    value = float(raw) if isinstance(raw, int | float) else math.nan
    if not 0 <= value <= 1:
        raise ScenarioError(f"{where}: models.load_fixed_fraction must be within 0..1")
    return value


def _traffic(raw: object, where: str) -> tuple[Traffic, ...]:
    """`traffic`: tenant name -> {share, priority}."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping) or not raw:
        raise ScenarioError(f"{where}: traffic must map tenant names to {{share, priority}}")
    found = []
    for name, entry in raw.items():
        key = f"traffic.{name}"
        try:
            tenant_name(str(name), f"{where}: {key}")
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
        if not isinstance(entry, Mapping) or set(entry) - {"share", "priority"}:
            raise ScenarioError(f"{where}: {key} takes share and priority, got {show(entry)}")
        share, priority = entry.get("share"), entry.get("priority", 0)
        if (
            isinstance(share, bool)
            or not isinstance(share, int | float)
            or not 0 < share < math.inf
        ):
            raise ScenarioError(f"{where}: {key}.share must be a number above 0, got {show(share)}")
        if type(priority) is not int or priority < 0:
            raise ScenarioError(
                f"{where}: {key}.priority must be a whole number >= 0 (1 the highest, 0 "
                f"none), got {show(priority)}"
            )
        found.append(Traffic(str(name), float(share), priority))
    return tuple(found)


def _deadline_ms(raw: object, where: str) -> float:
    value = float(raw) if isinstance(raw, int | float) else math.nan
    if not 0 <= value < math.inf:
        raise ScenarioError(f"{where}: deadline_ms must be a number of ms >= 0, got {show(raw)}")
    return value


def _tenancy(raw: object, where: str) -> dict[str, Any]:
    """`tenancy`, checked by the gateway's own parser (a misspelt key is an error here:
    a scenario has no log to warn in)."""
    if raw is None:
        return {}
    try:
        notes = parse_config({"endpoints": ["127.0.0.1:9000"], "tenancy": raw}).notes
    except ConfigError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    if notes:
        raise ScenarioError(f"{where}: {notes[0].replace(' ignored', '')}")
    assert isinstance(raw, Mapping)
    return dict(raw)


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
            weight_classes=_weight_classes(models.get("weight_classes", ()), where),
            load_fixed_fraction=_fraction(models.get("load_fixed_fraction", 1.0), where),
            traffic=_traffic(data.get("traffic"), where),
            tenancy=_tenancy(data.get("tenancy"), where),
            deadline_ms=_deadline_ms(data.get("deadline_ms", 0), where),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioError(f"{where}: missing or bad key: {exc}") from None


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


def tenant_draws(scenario: Scenario, count: int, seed: int) -> list[int] | None:
    """Each of `count` calls' tenant (an index into `scenario.traffic`), drawn by share
    from its own stream of `seed`, so that the models and times drawn stay those of a
    scenario without traffic; None when the scenario names no tenants."""
    if not scenario.traffic:
        return None
    rng = random.Random(f"tenants {seed}")
    names = range(len(scenario.traffic))
    shares = [t.share for t in scenario.traffic]
    return rng.choices(names, weights=shares, k=count)
