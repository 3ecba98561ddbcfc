"""`SchedulingConfig`: the `scheduling:` block, the knobs every scheduling mode reads.

Pure. It lives with the schedulers rather than with the rest of gateway.yml's schema
because the cores here take it as their input (the packer, the policy updates of the
control plane, lpt_packing's request path), and a pure package must not reach up into
the configuration loader. Each field is checked by the knob table of
`rsgw.scheduling.knobs._knobs`, so a config built by hand, by `dataclasses.replace` in the
control plane, or from gateway.yml is held to exactly the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from rsgw.base._errors import ConfigError
from rsgw.base._values import check_fields, check_float, must_be, ranged, show
from rsgw.scheduling.knobs._knobs import (
    SCHEDULING_KNOBS,
    CompactionMode,
    FillMode,
    Replicas,
    RoutingPolicy,
    SchedulingMode,
    WorkBasis,
    check_model_fill_mode,
    check_replicas,
)

# Defaults: the original's gateway.yml defaults (docs/original.md §3.2), unless noted.
DEFAULT_REBALANCE_COMPUTE_SECONDS = 300.0
DEFAULT_FIRST_REBALANCE_COMPUTE_SECONDS = 60.0
DEFAULT_MAX_WORKER_SHARE = 0.8
DEFAULT_HYSTERESIS = 0.0
DEFAULT_EMA_HALFLIFE_COMPUTE_SECONDS = 0.0
DEFAULT_REPLICAS = 1
DEFAULT_ROUTING_FILL_FACTOR = 1.0
DEFAULT_COMPACTION_INTERVAL = 1
# RoutingMeta's halflife when neither the EMA nor the rebalance budget gives one
# (docs/original.md §3.4).
DEFAULT_ROUTING_META_HALFLIFE_SECONDS = 30.0

_non_negative = ranged(check_float, lambda x: x >= 0, "non-negative")


@dataclass(frozen=True, slots=True)
class ModelOverride:
    """`scheduling.models.<m>`: what one model does differently from the fleet.

    Every field has an "inherit" value: `replicas=None` takes `default_replicas`
    (docs/product.md §3.3; the original pinned such a model to 1), `fill_mode=INHERIT`
    takes `routing_fill_mode`, `fill_factor=0.0` takes `routing_fill_factor`. It is
    checked (with its model's key path) by the `SchedulingConfig` that holds it.
    """

    replicas: Replicas | None = None
    fill_mode: FillMode = FillMode.INHERIT
    fill_factor: float = 0.0


def check_override(override: object, key: str) -> ModelOverride:
    if not isinstance(override, ModelOverride):
        raise must_be(key, "a ModelOverride", override)
    replicas = override.replicas
    return ModelOverride(
        replicas=None if replicas is None else check_replicas(replicas, f"{key}.replicas"),
        fill_mode=check_model_fill_mode(override.fill_mode, f"{key}.fill_mode"),
        fill_factor=_non_negative(override.fill_factor, f"{key}.fill_factor"),
    )


@dataclass(frozen=True, slots=True)
class SchedulingConfig:
    """The `scheduling:` block: the mode and lpt_packing's knobs (docs/original.md §4.8)."""

    mode: SchedulingMode = SchedulingMode.ROUND_ROBIN
    work_basis: WorkBasis = WorkBasis.COMPUTE
    rebalance_compute_seconds: float = DEFAULT_REBALANCE_COMPUTE_SECONDS
    # 0 = the first repack waits for rebalance_compute_seconds too.
    first_rebalance_compute_seconds: float = DEFAULT_FIRST_REBALANCE_COMPUTE_SECONDS
    # lpt_packing: demand above this share of one GPU earns a model more replicas
    # (`_replicas.auto_replicas`); the original only logged it.
    max_worker_share: float = DEFAULT_MAX_WORKER_SHARE
    hysteresis: float = DEFAULT_HYSTERESIS
    # 0 = track rebalance_compute_seconds (see `resolved_ema_halflife`).
    ema_halflife_compute_seconds: float = DEFAULT_EMA_HALFLIFE_COMPUTE_SECONDS
    default_replicas: Replicas = DEFAULT_REPLICAS
    routing_fill_factor: float = DEFAULT_ROUTING_FILL_FACTOR
    routing_policy: RoutingPolicy = RoutingPolicy.FILL_LEAST
    routing_fill_mode: FillMode = FillMode.RUN
    forbid_memory_oversubscription: bool = True
    compaction_mode: CompactionMode = CompactionMode.EAGER
    # Compact every N repacks; 0 disables.
    compaction_interval: int = DEFAULT_COMPACTION_INTERVAL
    # Not hashed: a mapping has no hash, and the knobs above identify a policy anyway.
    models: Mapping[str, ModelOverride] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )

    def __post_init__(self) -> None:
        check_fields(self, "scheduling.", SCHEDULING_KNOBS)
        if not isinstance(self.models, Mapping):
            raise must_be("scheduling.models", "a mapping", self.models)
        models: dict[str, ModelOverride] = {}
        for name, override in self.models.items():
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(
                    f"config 'scheduling.models' keys must be model names, got {show(name)}"
                )
            models[name] = check_override(override, f"scheduling.models.{name}")
        object.__setattr__(self, "models", MappingProxyType(models))

    @property
    def resolved_ema_halflife(self) -> float:
        """`PackingKnobs.ema_halflife_compute`: the EMA halflife, 0 resolved to rebalance."""
        return self.ema_halflife_compute_seconds or self.rebalance_compute_seconds

    @property
    def routing_meta_halflife(self) -> float:
        """RoutingMeta's halflife: EMA if > 0, else rebalance if > 0, else 30 s.

        docs/original.md §3.4.
        """
        return (
            self.ema_halflife_compute_seconds
            or self.rebalance_compute_seconds
            or DEFAULT_ROUTING_META_HALFLIFE_SECONDS
        )

    def replicas_for(self, model: str) -> Replicas:
        """The configured replica count of `model`: its override, else `default_replicas`."""
        override = self.models.get(model)
        if override is None or override.replicas is None:
            return self.default_replicas
        return override.replicas
