"""The scheduling knobs: their enums, their checks, and the table that names them.

Pure: no trio, no sockets, no logging, no clock.

Every `scheduling.<knob>` scalar of gateway.yml has one check here, and
`SCHEDULING_KNOBS` maps each knob to it. Two callers use the table: `SchedulingConfig`
runs every field through it when it is built (from gateway.yml, the environment, by
hand or by `dataclasses.replace`), and the runtime control plane validates a
`SetSchedulingPolicy` value with `validate_knob`. So a value the control plane accepts
is one gateway.yml would accept, and the error text is the same (docs/original.md §3.3).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias

from rsgw.base._errors import ConfigError
from rsgw.base._values import Check, check_bool, check_float, check_int, choice, ranged, show

ALL: Final = "all"
#: A replica count: a positive integer, or every worker.
Replicas: TypeAlias = int | Literal["all"]


class SchedulingMode(enum.StrEnum):
    """How a request picks its worker (`scheduling.mode`)."""

    ROUND_ROBIN = "round_robin"
    LEAST_OUTSTANDING = "least_outstanding"
    LPT_PACKING = "lpt_packing"


class WorkBasis(enum.StrEnum):
    """What one request charges a worker's load (`scheduling.work_basis`)."""

    COMPUTE = "compute"
    ITEMS = "items"
    REQUESTS = "requests"


class RoutingPolicy(enum.StrEnum):
    """Tie-break among a model's replicas (`scheduling.routing_policy`)."""

    FILL_RR = "fill_rr"
    FILL_LEAST = "fill_least"


class FillMode(enum.StrEnum):
    """How a multi-replica model's requests fill its replicas."""

    RUN = "run"
    SPREAD = "spread"
    INFLIGHT = "inflight"
    INHERIT = "inherit"  # per-model overrides only: use the fleet's routing_fill_mode


class CompactionMode(enum.StrEnum):
    """When workers are asked to compact memory after a repack."""

    OFF = "off"
    EAGER = "eager"
    SCHEDULED = "scheduled"


# ---------------------------------------------------------------------------
# Checks: `check(value, key) -> normalised value`, raising ConfigError that names `key`.

check_mode = choice(SchedulingMode)
check_work_basis = choice(WorkBasis)
_compaction_mode_choice = choice(CompactionMode)
_FLEET_FILL_MODES = ("run", "spread", "inflight")
check_fill_mode = choice(FillMode, _FLEET_FILL_MODES)
check_model_fill_mode = choice(FillMode, (*_FLEET_FILL_MODES, "inherit"))
check_positive = ranged(check_float, lambda x: x > 0, "positive")
check_fill_factor = check_positive


_routing_policy_choice = choice(RoutingPolicy)


def check_routing_policy(value: object, key: str) -> RoutingPolicy:
    if isinstance(value, str) and value.strip().lower() == "least_outstanding":
        raise ConfigError(
            f"{key} 'least_outstanding' is now a top-level scheduling mode. "
            "Set scheduling.mode: least_outstanding instead."
        )
    result: RoutingPolicy = _routing_policy_choice(value, key)
    return result


def check_compaction_mode(value: object, key: str) -> CompactionMode:
    # YAML 1.1 reads an unquoted `compaction_mode: off` as false; that is what it means.
    result: CompactionMode = _compaction_mode_choice("off" if value is False else value, key)
    return result


def check_replicas(value: object, key: str) -> Replicas:
    """A positive integer or 'all' (any case); a decimal string is read as its integer."""
    count: object = value
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == ALL:
            return ALL
        # (Bounded length: int() refuses strings of more than 4300 digits.)
        count = int(text) if re.fullmatch(r"[+-]?[0-9]{1,18}", text) else None
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(f"{key} must be a positive integer or 'all', got {show(value)}")
    return count


#: Every `scheduling.<knob>` scalar and its check, in docs/original.md §3.2 order.
SCHEDULING_KNOBS: Mapping[str, Check] = MappingProxyType(
    {
        "mode": check_mode,
        "work_basis": check_work_basis,
        "rebalance_compute_seconds": check_positive,
        "first_rebalance_compute_seconds": ranged(
            check_float, lambda x: x >= 0, "non-negative (0 uses rebalance_compute_seconds)"
        ),
        "max_worker_share": ranged(check_float, lambda x: 0 < x <= 1, "in (0, 1]"),
        "hysteresis": ranged(check_float, lambda x: 0 <= x < 1, "in [0, 1)"),
        "ema_halflife_compute_seconds": ranged(
            check_float, lambda x: x >= 0, "non-negative (0 tracks rebalance_compute_seconds)"
        ),
        "default_replicas": check_replicas,
        "routing_fill_factor": check_positive,
        "routing_policy": check_routing_policy,
        "routing_fill_mode": check_fill_mode,
        "forbid_memory_oversubscription": check_bool,
        "compaction_mode": check_compaction_mode,
        "compaction_interval": ranged(check_int, lambda n: n >= 0, "non-negative (0 disables)"),
    }
)
#: The knobs SetSchedulingPolicy may change; the others need a restart (docs/original.md §2.8).
RUNTIME_KNOBS: Final = frozenset(SCHEDULING_KNOBS) - {"mode", "max_worker_share"}


def validate_knob(name: str, value: object, *, key: str | None = None) -> Any:
    """Check one scheduling knob exactly as gateway.yml is checked; return its normal form.

    The control plane calls this once per `update_mask` entry (after turning its wire
    forms into config forms, e.g. default_replicas -1 into 'all'), so a value it accepts
    is one gateway.yml would accept and the error text is the same.

    Args:
        name: a key of `SCHEDULING_KNOBS` (`RUNTIME_KNOBS` are the runtime-changeable ones).
        value: the value, as YAML or protobuf gives it.
        key: the name the error should use; default `scheduling.<name>`.

    Returns:
        The normalised value: an enum member for the choices, an int or 'all' for
        replicas, a float for the numbers.

    Raises:
        ConfigError: unknown knob, or a bad value; the message names the key and value.
    """
    check = SCHEDULING_KNOBS.get(name)
    if check is None:
        accepted = ", ".join(sorted(SCHEDULING_KNOBS))
        raise ConfigError(f"unknown scheduling knob '{name}'; accepted: {accepted}")
    return check(value, key or f"scheduling.{name}")
