"""Runtime knob changes: what SetSchedulingPolicy and SetModelPlacement decide.

Pure: no trio, no sockets, no logging, no clock. The control service turns the wire
forms into config forms, calls these functions, and swaps the returned knob set in
by reference. Every value is checked with the gateway.yml validators
(`rsgw.scheduling.knobs._knobs.validate_knob`), so the control plane accepts exactly what
gateway.yml accepts, with the same error text (docs/original.md §2.8, §3.3).

Changes are all-or-nothing: every entry of a request is checked before anything is
built, and a bad one raises `ConfigError` with the knobs untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from rsgw.base._errors import ConfigError
from rsgw.scheduling.knobs._knobs import ALL, RUNTIME_KNOBS, FillMode, Replicas, validate_knob
from rsgw.scheduling.knobs._settings import ModelOverride, SchedulingConfig, check_override

#: Names an operator may try that only gateway.yml and a restart can change.
STARTUP_ONLY: Final[Mapping[str, str]] = MappingProxyType(
    {
        "mode": "the scheduling mode decides how the gateway starts",
        "scheduling_mode": "the scheduling mode decides how the gateway starts",
        "max_worker_share": "it is read once at startup",
        "endpoints": "worker membership is fixed at startup",
        "listen": "the listeners are bound at startup",
    }
)

#: The parking warning about `inflight` fill mode (docs/original.md §2.8; tests match
#: `ONE replica`).
PARKING_WARNING: Final = (
    "fill mode 'inflight' counts requests in flight, so a model whose in-flight "
    "concurrency stays between 2 and its quantum and never drains is served by ONE "
    "replica indefinitely while the others receive no traffic; diagnose with "
    "gateway_replica_routed_total; prefer 'run', or 'spread'"
)
#: Appended to every SetModelPlacement answer.
NEXT_REPACK: Final = "takes effect at the next repack; call Repack to apply it now"


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """An accepted SetSchedulingPolicy: the new knob set and what to tell the operator."""

    knobs: SchedulingConfig
    changed: tuple[str, ...]
    warnings: tuple[str, ...]


def check_mask_entry(name: str) -> None:
    """Raise `ConfigError` for a mask entry that names no runtime knob."""
    reason = STARTUP_ONLY.get(name)
    if reason is not None:
        raise ConfigError(
            f"'{name}' cannot be changed at runtime: {reason}. "
            "Change it in gateway.yml and restart."
        )
    if name not in RUNTIME_KNOBS:
        raise ConfigError(
            f"unknown scheduling knob '{name}'; accepted: {', '.join(sorted(RUNTIME_KNOBS))}"
        )


def update_policy(
    knobs: SchedulingConfig,
    mask: Sequence[str],
    values: Mapping[str, object],
    *,
    accumulated: float,
    first_repack_done: bool,
) -> PolicyChange:
    """Apply the `mask` entries of `values` (config forms) to `knobs`, or raise.

    Args:
        accumulated: the compute the last tick had accumulated toward a repack.
        first_repack_done: whether the first traffic-driven repack already ran.

    Raises:
        ConfigError: an empty mask, a startup-only or unknown name, or a bad value;
            nothing is applied.
    """
    if not mask:
        raise ConfigError("update_mask is empty; name the knobs to change")
    checked: dict[str, object] = {}
    for name in mask:
        check_mask_entry(name)
        checked[name] = validate_knob(name, values.get(name))
    # 0 means "track rebalance": fixed to the rebalance being set now, else the current.
    if checked.get("ema_halflife_compute_seconds") == 0:
        checked["ema_halflife_compute_seconds"] = checked.get(
            "rebalance_compute_seconds", knobs.rebalance_compute_seconds
        )
    updated = dataclasses.replace(knobs, **checked)  # type: ignore[arg-type]
    warnings: list[str] = []
    if "rebalance_compute_seconds" in checked:
        budget = updated.rebalance_compute_seconds
        in_force = first_repack_done or updated.first_rebalance_compute_seconds <= 0
        if in_force and accumulated >= budget:
            warnings.append(
                f"the fleet has already accumulated {accumulated:.2f} GPU-seconds, at or "
                f"above the new {budget:g} second budget; a repack will fire on the next "
                "prober tick"
            )
    if updated.resolved_ema_halflife != knobs.resolved_ema_halflife:
        warnings.append(
            "arrival rates and costs measured so far were folded at the previous halflife "
            f"({knobs.resolved_ema_halflife:g}s) and are not recomputed; only future decay "
            "changes"
        )
    if "first_rebalance_compute_seconds" in checked and first_repack_done:
        warnings.append(
            "first_rebalance_compute_seconds no longer applies: the first traffic-driven "
            "repack already ran, so later repacks wait for rebalance_compute_seconds"
        )
    if (
        "routing_fill_mode" in checked
        and updated.routing_fill_mode is FillMode.INFLIGHT
        and knobs.routing_fill_mode is not FillMode.INFLIGHT
    ):
        warnings.append(PARKING_WARNING)
    changed = tuple(dict.fromkeys(mask))
    return PolicyChange(updated, changed, tuple(warnings))


def replicas_from_wire(value: int, key: str = "replicas") -> Replicas | None:
    """SetModelPlacement's replicas: 0 clears (None), -1 is every worker, > 0 a count."""
    if value == 0:
        return None
    if value == -1:
        return ALL
    if value < -1:
        raise ConfigError(f"{key} must be a positive count, -1 (all) or 0 (clear), got {value}")
    return value


def replicas_to_wire(value: Replicas | None) -> int:
    """The wire form of a configured replica count: -1 every worker, 0 none."""
    if value is None:
        return 0
    return -1 if value == ALL else int(value)


def update_override(
    knobs: SchedulingConfig,
    model: str,
    replicas: Replicas | None,
    fill_mode: str,
    fill_factor: float,
) -> SchedulingConfig:
    """`knobs` with `model`'s override changed (docs/original.md §2.8 SetModelPlacement).

    `replicas` always applies (None clears it); `fill_mode` "" keeps, "inherit"
    clears, a mode sets; `fill_factor` < 0 keeps, 0 clears, > 0 sets. An override
    equal to the empty one is deleted.

    Raises:
        ConfigError: a bad fill mode; nothing is applied.
    """
    if not model:
        raise ConfigError("name is empty")
    current = knobs.models.get(model, ModelOverride())
    mode = current.fill_mode if fill_mode == "" else fill_mode
    factor = current.fill_factor if fill_factor < 0 else fill_factor
    override = check_override(
        ModelOverride(replicas=replicas, fill_mode=mode, fill_factor=factor),  # type: ignore[arg-type]
        f"scheduling.models.{model}",
    )
    models = dict(knobs.models)
    if override == ModelOverride():
        models.pop(model, None)
    else:
        models[model] = override
    return dataclasses.replace(knobs, models=MappingProxyType(models))


def effective_replicas(knobs: SchedulingConfig, model: str, ready: int) -> int:
    """How many workers the next repack gives `model`: clamped to [1, ready] if any."""
    configured = knobs.replicas_for(model)
    if configured == ALL:
        return max(ready, 1)
    count = int(configured)
    return min(max(count, 1), ready) if ready > 0 else count


def memory_projection(
    model: str,
    effective: int,
    footprint: int,
    placed_mem: Mapping[str, int],
    budgets: Mapping[str, int],
) -> list[str]:
    """Warnings for workers the model would push past their weight budget (estimate).

    Args:
        footprint: the model's weight bytes at the last repack.
        placed_mem: worker -> bytes of the OTHER models placed on it.
        budgets: worker -> weight budget from the last repack's poll.
    """
    if footprint <= 0 or not budgets:
        return []
    workers = sorted(budgets, key=lambda url: (placed_mem.get(url, 0), url))[:effective]
    warnings = []
    for url in workers:
        budget = budgets[url]
        total = placed_mem.get(url, 0) + footprint
        if budget > 0 and total > budget:
            warnings.append(
                f"estimated: placing '{model}' on {effective} worker(s) would raise {url} to "
                f"{total} bytes of weights against a {budget} byte budget, so the packer will "
                "oversubscribe it (expect eviction churn) unless "
                "forbid_memory_oversubscription finds room elsewhere"
            )
    return warnings
