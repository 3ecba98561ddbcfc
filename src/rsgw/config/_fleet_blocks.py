"""gateway.yml's blocks about the fleet: `discovery`, `coordination`, `repository`.

Pure, and built like the other blocks (`rsgw.config._blocks`): each a frozen dataclass
that runs its fields through a table of per-key checks, so every `ConfigError` names
the key path and the bad value. These three say how the gateway learns and places
models on its workers: which models to look for on workers that cannot list theirs,
several gateways sharing one placement through etcd, and the models placed by loading
and unloading them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from rsgw.base._errors import ConfigError
from rsgw.base._values import Check, check_fields, check_int, check_str, ranged, show
from rsgw.config._blocks import FrozenTable, non_negative, non_negative_int, positive_int
from rsgw.scheduling.fleet._lookups import (
    DEFAULT_FOUND_TTL_SECONDS,
    DEFAULT_LOOKUPS_PER_SECOND,
    DEFAULT_MISS_TTL_SECONDS,
)
from rsgw.scheduling.knobs._knobs import check_positive

# rsgw's own: how long a worker losing a model's placement may finish the calls it
# holds for it before the model is unloaded there (a call's default timeout is 60 s).
DEFAULT_DRAIN_SECONDS = 30.0
# rsgw's own: one RepositoryModelLoad; Triton's own client waits as long as it takes.
DEFAULT_LOAD_TIMEOUT_SECONDS = 300.0
# rsgw's own (issue 49): a model loaded to make room is not evicted sooner than this,
# so two models that take turns on one GPU do not reload each other call by call.
DEFAULT_MIN_RESIDENCY_SECONDS = 10.0
#: A model's demand for residency halves each this many seconds without calls.
DEFAULT_DEMAND_HALFLIFE_SECONDS = 60.0


def _check_models(value: object, key: str) -> tuple[str, ...]:
    """A list of model names: strings, none empty, each once (in order)."""
    if not isinstance(value, tuple | list):
        raise ConfigError(f"{key} must be a list of model names, got {show(value)}")
    names = tuple(check_str(name, f"{key}[{i}]") for i, name in enumerate(value))
    for i, name in enumerate(names):
        if not name:
            raise ConfigError(f"{key}[{i}] must be a model name, got an empty string")
    return tuple(dict.fromkeys(names))


_DISCOVERY_CHECKS: Mapping[str, Check] = {
    "models": _check_models,
    "found_ttl_seconds": non_negative,
    "miss_ttl_seconds": non_negative,
    "lookups_per_second": non_negative_int,
}


def _named_table(what: str, unit: str, each: Check) -> Check:
    """A check of a mapping of `what` names to values that `each` checks."""

    def check(value: object, key: str) -> FrozenTable[int]:
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{key} must be a mapping of {what} name to {unit}, got {show(value)}"
            )
        table: dict[str, int] = {}
        for name, item in value.items():
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"{key} keys must be {what} names, got {show(name)}")
            table[name] = each(item, f"{key}.{name}")
        return FrozenTable(table)

    return check


_REPOSITORY_CHECKS: Mapping[str, Check] = {
    "models": _check_models,
    "weight_bytes": _named_table("model", "bytes", positive_int),
    "default_weight_bytes": non_negative_int,
    "worker_budget_bytes": non_negative_int,
    "worker_budgets": _named_table("worker", "bytes", non_negative_int),
    "drain_seconds": non_negative,
    "load_timeout_seconds": check_positive,
    "min_residency_seconds": non_negative,
    "load_seconds": non_negative,
    "eviction": ranged(check_str, lambda s: s in ("value", "lru"), "value or lru"),
    "demand_halflife_seconds": check_positive,
    "min_copies": _named_table("model", "copies", non_negative_int),
    "max_copies": _named_table("model", "copies", positive_int),
}


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    """How the gateway learns the models of workers without a RepositoryIndex.

    Such a worker (KServe's ModelServer) is asked ModelReady about each of `models`
    every probe round; a model a client names that the routing table lacks is looked
    up on those workers on demand, at most `lookups_per_second` a second (0: never),
    a name found nowhere not again for `miss_ttl_seconds`, and a model found kept
    among the ones asked about until no round has found it for `found_ttl_seconds`
    (docs/workers.md).
    """

    models: tuple[str, ...] = ()
    found_ttl_seconds: float = DEFAULT_FOUND_TTL_SECONDS
    miss_ttl_seconds: float = DEFAULT_MISS_TTL_SECONDS
    lookups_per_second: int = DEFAULT_LOOKUPS_PER_SECOND

    def __post_init__(self) -> None:
        check_fields(self, "discovery.", _DISCOVERY_CHECKS)


def _check_etcd_endpoints(value: object, key: str) -> tuple[str, ...]:
    """etcd's client URLs as `host:port` (an `http://` prefix is dropped; TLS to etcd is
    not supported yet, so `https://` is an error rather than a silent downgrade)."""
    if not isinstance(value, tuple | list):
        raise ConfigError(f"{key} must be a list of host:port addresses, got {show(value)}")
    endpoints = []
    for i, item in enumerate(value):
        text = check_str(item, f"{key}[{i}]").strip().removeprefix("http://").rstrip("/")
        if text.startswith("https://"):
            raise ConfigError(
                f"{key}[{i}] is {item!r}: rsgw speaks to etcd in cleartext only; give its "
                "http:// client URL (on a network you trust)"
            )
        host, _, port = text.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{key}[{i}] must be host:port, got {show(item)}")
        endpoints.append(text)
    return tuple(endpoints)


_COORDINATION_CHECKS: Mapping[str, Check] = {
    "etcd_endpoints": _check_etcd_endpoints,
    "cluster": ranged(
        check_str,
        lambda s: bool(re.fullmatch(r"[A-Za-z0-9._-]+", s)),
        "letters, digits, '.', '_' or '-' (it names etcd keys)",
    ),
    "lease_ttl_seconds": ranged(check_int, lambda n: 2 <= n <= 300, "between 2 and 300"),
    "member": check_str,
}


@dataclass(frozen=True, slots=True)
class CoordinationConfig:
    """Several gateways in front of the same workers, one lpt_packing placement (issue 39).

    With `etcd_endpoints`, gateways of the same `cluster` elect one placer through an
    etcd lease of `lease_ttl_seconds`; the placer places for all and publishes the
    placement, the others route by it (`rsgw.coordination`). `member` names this
    gateway among them ("" = its host name and gRPC port). Empty endpoints: one
    gateway on its own, as before.
    """

    etcd_endpoints: tuple[str, ...] = ()
    cluster: str = "default"
    lease_ttl_seconds: int = 10
    member: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "coordination.", _COORDINATION_CHECKS)

    @property
    def enabled(self) -> bool:
        return bool(self.etcd_endpoints)


@dataclass(frozen=True, slots=True)
class RepositoryConfig:
    """Which models lpt_packing may place by loading and unloading them.

    For workers without ReactantServer's control plane but with Triton's repository
    extension (Triton in explicit model control, MLServer): each of `models` is loaded
    only on the workers its placement names and unloaded from the others, a new holder
    loaded (within `load_timeout_seconds`) before an old one is drained (for at most
    `drain_seconds`) and unloaded. Models not listed are never loaded or unloaded
    (default: none, so nothing is touched). The packer weighs each model's weights
    (`memory_usage` in the worker's statistics once it reports it, else `weight_bytes`,
    else `default_weight_bytes`) against its budget (`worker_budgets` by worker name
    or address, else `worker_budget_bytes`; 0: unbounded), a hard limit: with more
    models than the budgets hold, the most valuable stay loaded and the rest are
    loaded when called (issue 49, docs/models.md). `min_copies` models are always
    loaded, `max_copies` bound a model's copies, a model loaded is not evicted within
    `min_residency_seconds`, a model's demand forgets its calls with a half-life of
    `demand_halflife_seconds`, and a call whose deadline is shorter than a cold model's
    load (learned, else `load_seconds`; 0: not until learned) is refused at once.
    """

    models: tuple[str, ...] = ()
    weight_bytes: Mapping[str, int] = field(default_factory=FrozenTable)
    default_weight_bytes: int = 0
    worker_budget_bytes: int = 0
    worker_budgets: Mapping[str, int] = field(default_factory=FrozenTable)
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    load_timeout_seconds: float = DEFAULT_LOAD_TIMEOUT_SECONDS
    min_residency_seconds: float = DEFAULT_MIN_RESIDENCY_SECONDS
    load_seconds: float = 0.0
    #: How copies are valued for eviction: `value` (demand x load seconds, rsgw's) or
    #: `lru` (least recently used first, as ModelMesh and Seldon Core: the baseline of
    #: bench/fleet's long tail).
    eviction: str = "value"
    #: A model's demand (its value's calls per second) is its calls counted with a
    #: decay: each call's weight halves every this many seconds.
    demand_halflife_seconds: float = DEFAULT_DEMAND_HALFLIFE_SECONDS
    min_copies: Mapping[str, int] = field(default_factory=FrozenTable)
    max_copies: Mapping[str, int] = field(default_factory=FrozenTable)

    def __post_init__(self) -> None:
        check_fields(self, "repository.", _REPOSITORY_CHECKS)
        for key in ("min_copies", "max_copies"):
            for model in getattr(self, key):
                if model not in self.models:
                    raise ConfigError(
                        f"repository.{key}.{model}: {model!r} is not in repository.models"
                    )
        for model, floor in self.min_copies.items():
            cap = self.max_copies.get(model)
            if cap is not None and floor > cap:
                raise ConfigError(
                    f"repository.min_copies.{model} is {floor}, more than its max_copies ({cap})"
                )
        largest = self.largest_budget
        if largest:
            for model in self.models:
                size = self.weight_bytes.get(model, self.default_weight_bytes)
                if size > largest:
                    key = (
                        f"weight_bytes.{model}"
                        if model in self.weight_bytes
                        else "default_weight_bytes"
                    )
                    raise ConfigError(
                        f"repository.{key} is {size} for {model!r}: more than any worker's "
                        f"budget ({largest} bytes), so no GPU could ever load it"
                    )

    @property
    def largest_budget(self) -> int:
        """The largest worker budget; 0 when some worker's is unbounded."""
        budgets = [*self.worker_budgets.values(), self.worker_budget_bytes]
        return 0 if 0 in budgets else max(budgets)

    def budget_of(self, *names: str) -> int:
        """The budget of the worker known by `names` (its name, its address); 0 unbounded."""
        for name in names:
            if name in self.worker_budgets:
                return self.worker_budgets[name]
        return self.worker_budget_bytes


#: The environment overrides of these blocks' keys, by the kind of value they take
#: (merged into `rsgw.config._config`'s table).
FLEET_ENV_KINDS: Mapping[str, str] = {
    "discovery.models": "names",
    "discovery.found_ttl_seconds": "float",
    "discovery.miss_ttl_seconds": "float",
    "discovery.lookups_per_second": "int",
    "repository.models": "names",
    "repository.worker_budget_bytes": "int",
    "repository.default_weight_bytes": "int",
    "repository.drain_seconds": "float",
    "repository.load_timeout_seconds": "float",
    "repository.min_residency_seconds": "float",
    "repository.load_seconds": "float",
    "repository.eviction": "str",
    "repository.demand_halflife_seconds": "float",
    "coordination.etcd_endpoints": "names",
    "coordination.cluster": "str",
    "coordination.lease_ttl_seconds": "int",
    "coordination.member": "str",
}
