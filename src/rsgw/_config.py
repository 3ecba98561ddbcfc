"""Gateway configuration: gateway.yml plus `REACTANT_GATEWAY_*` environment -> `GatewayConfig`.

Pure: no trio, no sockets, no logging, no clock. `load_config` reads one YAML file
(and checks which file exists); everything else is a function of its arguments.
docs/configuration.md documents every key, default and variable.

Theory of operation:

1. `load_config` finds the file (explicit path > `REACTANT_GATEWAY_FILE` >
   `/etc/reactantserver/gateway.yml` > none) and hands the YAML to `parse_config`.
2. `parse_config` reads the `REACTANT_GATEWAY_*` variables into typed values and writes
   them over the raw mapping BEFORE anything is parsed, so the environment beats YAML
   and a bad YAML value that the environment replaces is never looked at.
3. The merged mapping is walked block by block. The walk only deals with shape (a block
   must be a mapping, a list a list, YAML null means "absent", unknown keys are noted
   and ignored); it passes leaf values to the dataclass constructors unchanged.
4. Every dataclass validates and normalises its own fields in `__post_init__`, through
   the per-key checks below. So a config built by hand, or by `dataclasses.replace` in
   the control plane, is held to exactly the rules gateway.yml is, and every
   `ConfigError` names the key path and the bad value.

The scheduling checks are also exported one by one (`SCHEDULING_KNOBS`, `validate_knob`):
the runtime control plane validates a `SetSchedulingPolicy` value with the very function
that validated gateway.yml, as REFERENCE.md §3.3 requires.

We differ from the original where DECISIONS.md says so (a `scheduling.models.<m>` entry
without `replicas` inherits `default_replicas`; `logging.*` is honoured) and where it was
silent (docs/configuration.md, "Decisions"): unparsable `STARTUP_WAIT_SECONDS` is an
error rather than 0; an empty variable counts as unset; numbers must be finite.
"""

from __future__ import annotations

import enum
import math
import os
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import yaml

from rsgw._errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

# Defaults: REFERENCE.md §3.2 (the original's gateway.yml defaults), unless noted.
DEFAULT_LISTEN_GRPC = "0.0.0.0:8001"
DEFAULT_LISTEN_METRICS = "0.0.0.0:8002"
DEFAULT_REQUEST_TIMEOUT_SECONDS = 60
DEFAULT_MAX_CONCURRENT_STREAMS = 32
DEFAULT_MAX_MSG_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_CONCURRENT_REQUESTS_PER_WORKER = 64
DEFAULT_LOG_LEVEL = "info"
DEFAULT_LOG_FORMAT = "json"
DEFAULT_REBALANCE_COMPUTE_SECONDS = 300.0
DEFAULT_FIRST_REBALANCE_COMPUTE_SECONDS = 60.0
DEFAULT_MAX_WORKER_SHARE = 0.8
DEFAULT_HYSTERESIS = 0.0
DEFAULT_EMA_HALFLIFE_COMPUTE_SECONDS = 0.0
DEFAULT_REPLICAS = 1
DEFAULT_ROUTING_FILL_FACTOR = 1.0
DEFAULT_COMPACTION_INTERVAL = 1
DEFAULT_STARTUP_WAIT_SECONDS = 0.0
DEFAULT_HEALTH_INTERVAL_SECONDS = 10.0
DEFAULT_WEDGE_EXIT_ROUNDS = 3
# The prober's per-call watchdog (REFERENCE.md §5.2 PROBE_TIMEOUT_SECONDS); a constant
# in the original, a field here so an embedding application or a test can shorten it.
DEFAULT_PROBE_TIMEOUT_SECONDS = 8.0
# RoutingMeta's halflife when neither the EMA nor the rebalance budget gives one (§3.4).
DEFAULT_ROUTING_META_HALFLIFE_SECONDS = 30.0
DEFAULT_CONFIG_PATH = "/etc/reactantserver/gateway.yml"
# The gRPC length prefix is four bytes: no message can be longer than this.
MAX_MESSAGE_BYTES = 2**32 - 1

ENV_PREFIX = "REACTANT_GATEWAY_"
ENV_FILE = "REACTANT_GATEWAY_FILE"
ENV_STARTUP_WAIT = "REACTANT_GATEWAY_STARTUP_WAIT_SECONDS"
ENV_HEALTH_INTERVAL = "REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS"
ENV_WEDGE_EXIT_ROUNDS = "REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS"
TRUE_WORDS: Final = frozenset({"1", "true", "yes", "on"})
FOREVER_WORDS: Final = frozenset({"inf", "+inf", "infinity", "forever", "-1"})
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "text")

ALL: Final = "all"
#: A replica count: a positive integer, or every worker.
Replicas: TypeAlias = int | Literal["all"]
Check: TypeAlias = "Callable[[object, str], Any]"


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


def _show(value: object) -> str:
    """A bad value as messages quote it: its repr, cut short if it is long."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_of(values: Iterable[str]) -> str:
    quoted = [f"'{v}'" for v in values]
    return ", ".join(quoted[:-1]) + f", or {quoted[-1]}" if len(quoted) > 2 else " or ".join(quoted)


def _must_be(key: str, what: str, value: object) -> ConfigError:
    return ConfigError(f"config '{key}' must be {what}, got {_show(value)}")


def check_int(value: object, key: str) -> int:
    # bool is an int subclass; `max_concurrent_streams: yes` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise _must_be(key, "an integer", value)
    return value


def check_float(value: object, key: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _must_be(key, "a number", value)
    try:
        number = float(value)
    except OverflowError:  # an int past float range
        number = math.inf
    if not math.isfinite(number):
        raise _must_be(key, "a finite number", value)
    return number


def check_bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise _must_be(key, "a boolean", value)
    return value


def check_str(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise _must_be(key, "a string", value)
    return value


def _ranged(base: Check, test: Callable[[Any], bool], rule: str) -> Check:
    """A check that applies `base` (the type) and then `test`, failing with `rule`."""

    def check(value: object, key: str) -> Any:
        result = base(value, key)
        if not test(result):
            raise ConfigError(f"{key} must be {rule}, got {_show(value)}")
        return result

    return check


def _choice(enum_type: type[enum.StrEnum], allowed: tuple[str, ...] | None = None) -> Check:
    """A check for one of the (case-insensitive, stripped) values of `enum_type`."""
    names = allowed or tuple(m.value for m in enum_type)

    def check(value: object, key: str) -> Any:
        text = check_str(value, key).strip().lower()
        if text not in names:
            raise ConfigError(f"{key} must be {_one_of(names)}, got {_show(value)}")
        return enum_type(text)

    return check


def _words(words: tuple[str, ...]) -> Check:
    def check(value: object, key: str) -> str:
        text = check_str(value, key).strip().lower()
        if text not in words:
            raise ConfigError(f"{key} must be {_one_of(words)}, got {_show(value)}")
        return text

    return check


check_mode = _choice(SchedulingMode)
check_work_basis = _choice(WorkBasis)
_compaction_mode_choice = _choice(CompactionMode)
_FLEET_FILL_MODES = ("run", "spread", "inflight")
check_fill_mode = _choice(FillMode, _FLEET_FILL_MODES)
check_model_fill_mode = _choice(FillMode, (*_FLEET_FILL_MODES, "inherit"))
check_positive = _ranged(check_float, lambda x: x > 0, "positive")
check_fill_factor = check_positive


_routing_policy_choice = _choice(RoutingPolicy)


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
        raise ConfigError(f"{key} must be a positive integer or 'all', got {_show(value)}")
    return count


def check_target(value: object, key: str) -> str:
    """A worker's `host:port` (split at the LAST colon, as REFERENCE.md §3.2)."""
    text = check_str(value, key).strip()
    host, colon, port = text.rpartition(":")
    if not colon:
        raise ConfigError(f"{key}: worker target '{text}' is not host:port")
    if not re.fullmatch(r"[0-9]+", port):
        raise ConfigError(f"{key}: worker target '{text}' has a non-integer port")
    if not host:
        raise ConfigError(f"{key}: worker target '{text}' has an empty host")
    if len(port) > 5 or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{key}: worker target '{text}' has a port out of range 1..65535")
    return text


def check_listen(value: object, key: str) -> str:
    """A listen address `host:port`; port 0 picks a free port (DECISIONS.md §2)."""
    text = check_str(value, key).strip()
    _, colon, port = text.rpartition(":")
    if not (colon and re.fullmatch(r"[0-9]{1,5}", port) and int(port) <= 65535):
        raise ConfigError(f"{key} must be host:port with a port in 0..65535, got {_show(value)}")
    return text


def check_names(value: object, key: str) -> tuple[str, ...]:
    if not isinstance(value, tuple | list):
        raise _must_be(key, "a list of strings", value)
    return tuple(check_str(name, f"{key}[{i}]") for i, name in enumerate(value))


def check_targets(value: object, key: str) -> tuple[str, ...]:
    if not isinstance(value, tuple | list):
        raise _must_be(key, "a list of host:port strings", value)
    return tuple(check_target(t, f"{key}[{i}]") for i, t in enumerate(value))


_positive_int = _ranged(check_int, lambda n: n > 0, "positive")
_non_negative = _ranged(check_float, lambda x: x >= 0, "non-negative")

#: Every `scheduling.<knob>` scalar and its check, in REFERENCE.md §3.2 order.
SCHEDULING_KNOBS: Mapping[str, Check] = MappingProxyType(
    {
        "mode": check_mode,
        "work_basis": check_work_basis,
        "rebalance_compute_seconds": check_positive,
        "first_rebalance_compute_seconds": _ranged(
            check_float, lambda x: x >= 0, "non-negative (0 uses rebalance_compute_seconds)"
        ),
        "max_worker_share": _ranged(check_float, lambda x: 0 < x <= 1, "in (0, 1]"),
        "hysteresis": _ranged(check_float, lambda x: 0 <= x < 1, "in [0, 1)"),
        "ema_halflife_compute_seconds": _ranged(
            check_float, lambda x: x >= 0, "non-negative (0 tracks rebalance_compute_seconds)"
        ),
        "default_replicas": check_replicas,
        "routing_fill_factor": check_positive,
        "routing_policy": check_routing_policy,
        "routing_fill_mode": check_fill_mode,
        "forbid_memory_oversubscription": check_bool,
        "compaction_mode": check_compaction_mode,
        "compaction_interval": _ranged(check_int, lambda n: n >= 0, "non-negative (0 disables)"),
    }
)
#: The knobs SetSchedulingPolicy may change; the others need a restart (REFERENCE.md §2.8).
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


_message_bytes = _ranged(check_int, lambda n: 0 < n <= MAX_MESSAGE_BYTES, "in 1..4294967295")
# The checks of the other blocks, by field (the dataclass adds the block's key prefix).
_LISTEN_CHECKS: Mapping[str, Check] = {"grpc": check_listen, "metrics": check_listen}
_WORKER_CLIENT_CHECKS: Mapping[str, Check] = {
    "request_timeout_seconds": _positive_int,
    "max_concurrent_streams": _positive_int,
}
_GRPC_CHECKS: Mapping[str, Check] = {
    "max_recv_msg_bytes": _message_bytes,
    "max_send_msg_bytes": _message_bytes,
    "max_concurrent_requests_per_worker": _ranged(
        check_int, lambda n: n >= 0, "non-negative (0 = uncapped)"
    ),
}
_LOGGING_CHECKS: Mapping[str, Check] = {"level": _words(LOG_LEVELS), "format": _words(LOG_FORMATS)}
_TLS_CHECKS: Mapping[str, Check] = dict.fromkeys(
    ("cert_file", "key_file", "client_ca_file"), check_str
)


def _check_fields(obj: object, prefix: str, checks: Mapping[str, Check]) -> None:
    """Run each field of a frozen dataclass through its check and store the normal form."""
    for name, check in checks.items():
        object.__setattr__(obj, name, check(getattr(obj, name), f"{prefix}{name}"))


def _frozen_fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


# ---------------------------------------------------------------------------
# The configuration object.


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """Where the gateway listens: gRPC (`listen.grpc`) and admin HTTP (`listen.metrics`)."""

    grpc: str = DEFAULT_LISTEN_GRPC
    metrics: str = DEFAULT_LISTEN_METRICS

    def __post_init__(self) -> None:
        _check_fields(self, "listen.", _LISTEN_CHECKS)


@dataclass(frozen=True, slots=True)
class WorkerClientConfig:
    """The gateway's client side: per-call timeout and streams per worker connection."""

    request_timeout_seconds: int = DEFAULT_REQUEST_TIMEOUT_SECONDS
    max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS

    def __post_init__(self) -> None:
        _check_fields(self, "worker_client.", _WORKER_CLIENT_CHECKS)


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """Message size limits and the inbound admission cap per worker (0 = uncapped)."""

    max_recv_msg_bytes: int = DEFAULT_MAX_MSG_BYTES
    max_send_msg_bytes: int = DEFAULT_MAX_MSG_BYTES
    max_concurrent_requests_per_worker: int = DEFAULT_MAX_CONCURRENT_REQUESTS_PER_WORKER

    def __post_init__(self) -> None:
        _check_fields(self, "grpc.", _GRPC_CHECKS)


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """Log level (debug|info|warning|error) and format (json|text), both honoured."""

    level: str = DEFAULT_LOG_LEVEL
    format: str = DEFAULT_LOG_FORMAT

    def __post_init__(self) -> None:
        _check_fields(self, "logging.", _LOGGING_CHECKS)


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS files. Parsed but not yet enforced: the gateway serves cleartext h2c."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""

    def __post_init__(self) -> None:
        _check_fields(self, "tls.", _TLS_CHECKS)


@dataclass(frozen=True, slots=True)
class ModelOverride:
    """`scheduling.models.<m>`: what one model does differently from the fleet.

    Every field has an "inherit" value: `replicas=None` takes `default_replicas`
    (DECISIONS.md §3.3; the original pinned such a model to 1), `fill_mode=INHERIT`
    takes `routing_fill_mode`, `fill_factor=0.0` takes `routing_fill_factor`. It is
    checked (with its model's key path) by the `SchedulingConfig` that holds it.
    """

    replicas: Replicas | None = None
    fill_mode: FillMode = FillMode.INHERIT
    fill_factor: float = 0.0


def _check_override(override: object, key: str) -> ModelOverride:
    if not isinstance(override, ModelOverride):
        raise _must_be(key, "a ModelOverride", override)
    replicas = override.replicas
    return ModelOverride(
        replicas=None if replicas is None else check_replicas(replicas, f"{key}.replicas"),
        fill_mode=check_model_fill_mode(override.fill_mode, f"{key}.fill_mode"),
        fill_factor=_non_negative(override.fill_factor, f"{key}.fill_factor"),
    )


@dataclass(frozen=True, slots=True)
class SchedulingConfig:
    """The `scheduling:` block: the mode and lpt_packing's knobs (REFERENCE.md §4.8)."""

    mode: SchedulingMode = SchedulingMode.ROUND_ROBIN
    work_basis: WorkBasis = WorkBasis.COMPUTE
    rebalance_compute_seconds: float = DEFAULT_REBALANCE_COMPUTE_SECONDS
    # 0 = the first repack waits for rebalance_compute_seconds too.
    first_rebalance_compute_seconds: float = DEFAULT_FIRST_REBALANCE_COMPUTE_SECONDS
    # Advisory only (as in the original): logged, never enforced.
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
        _check_fields(self, "scheduling.", SCHEDULING_KNOBS)
        if not isinstance(self.models, Mapping):
            raise _must_be("scheduling.models", "a mapping", self.models)
        models: dict[str, ModelOverride] = {}
        for name, override in self.models.items():
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(
                    f"config 'scheduling.models' keys must be model names, got {_show(name)}"
                )
            models[name] = _check_override(override, f"scheduling.models.{name}")
        object.__setattr__(self, "models", MappingProxyType(models))

    @property
    def resolved_ema_halflife(self) -> float:
        """`PackingKnobs.ema_halflife_compute`: the EMA halflife, 0 resolved to rebalance."""
        return self.ema_halflife_compute_seconds or self.rebalance_compute_seconds

    @property
    def routing_meta_halflife(self) -> float:
        """RoutingMeta's halflife: EMA if > 0, else rebalance if > 0, else 30 s (§3.4)."""
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


def _check_startup_wait(value: object, key: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and value == math.inf:
        return math.inf
    seconds: float = _non_negative(value, key)
    return seconds


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything the gateway reads at start-up, validated and immutable.

    Built by `load_config` / `parse_config`, or by hand (tests): the constructor checks
    every field with the same rules as gateway.yml. `env_overrides`, `notes` and `source`
    say where the values came from; they take no part in equality.
    """

    endpoints: tuple[str, ...]
    metrics_endpoints: tuple[str, ...] = ()
    worker_names: tuple[str, ...] = ()
    listen: ListenConfig = field(default_factory=ListenConfig)
    worker_client: WorkerClientConfig = field(default_factory=WorkerClientConfig)
    grpc: GrpcLimits = field(default_factory=GrpcLimits)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    # The process-level variables (no YAML key; REFERENCE.md §3.2 "other env").
    # lpt_packing's wait for every worker before serving; math.inf = forever.
    startup_wait_seconds: float = DEFAULT_STARTUP_WAIT_SECONDS
    health_interval_seconds: float = DEFAULT_HEALTH_INTERVAL_SECONDS
    # All-probes-hung rounds before GatewayWedged; 0 disables.
    wedge_exit_rounds: int = DEFAULT_WEDGE_EXIT_ROUNDS
    # No YAML key and no variable: only code sets it (see DEFAULT_PROBE_TIMEOUT_SECONDS).
    probe_timeout_seconds: float = DEFAULT_PROBE_TIMEOUT_SECONDS
    # Provenance, for the caller to log.
    env_overrides: tuple[str, ...] = field(default=(), compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        checks: dict[str, Check] = {
            "endpoints": check_targets,
            "metrics_endpoints": check_targets,
            "worker_names": check_names,
            "startup_wait_seconds": _check_startup_wait,
            "health_interval_seconds": check_positive,
            "probe_timeout_seconds": check_positive,
            "wedge_exit_rounds": _ranged(check_int, lambda n: n >= 0, "non-negative (0 disables)"),
        }
        _check_fields(self, "", checks)
        if not self.endpoints:
            raise ConfigError(
                "gateway has no endpoints; set 'endpoints:' in gateway.yml or "
                "REACTANT_GATEWAY_WORKERS"
            )

    @property
    def max_concurrent_requests(self) -> int:
        """The inbound admission cap: per-worker cap x workers; 0 = uncapped (§3.4)."""
        return self.grpc.max_concurrent_requests_per_worker * len(self.endpoints)

    def worker_label(self, url: str) -> str:
        """The friendly name of a worker or worker-metrics URL, else the URL itself."""
        for urls in (self.endpoints, self.metrics_endpoints):
            if url in urls and urls.index(url) < len(self.worker_names):
                return self.worker_names[urls.index(url)]
        return url

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the caller should log at warning level: parse notes, then risky values."""
        found = list(self.notes)
        if self.tls.cert_file or self.tls.key_file or self.tls.client_ca_file:
            found.append(
                "tls files are configured but TLS is not yet enforced; serving cleartext h2c"
            )
        cap = self.grpc.max_concurrent_requests_per_worker
        streams = self.worker_client.max_concurrent_streams
        if 0 < cap <= streams:
            found.append(
                f"grpc.max_concurrent_requests_per_worker ({cap}) is not above "
                f"worker_client.max_concurrent_streams ({streams}): the gateway sheds "
                "(RESOURCE_EXHAUSTED) before any request can queue for a worker stream"
            )
        if self.worker_names and len(self.worker_names) != len(self.endpoints):
            found.append(
                f"worker_names has {len(self.worker_names)} names for {len(self.endpoints)} "
                "endpoints; names pair with endpoints by position, unnamed workers show their URL"
            )
        return tuple(found)

    def to_mapping(self) -> dict[str, Any]:
        """gateway.yml for this config: plain dicts, lists and scalars (YAML-safe).

        `parse_config(cfg.to_mapping()) == cfg` for a config whose process-level values
        (startup wait, health interval, wedge rounds, probe timeout) are their defaults:
        those have no YAML key.
        """
        blocks = {
            name: {k: _plain(v) for k, v in _frozen_fields(getattr(self, name)).items()}
            for name in ("listen", "worker_client", "grpc", "logging", "tls", "scheduling")
        }
        blocks["scheduling"]["models"] = {
            name: {
                k: _plain(v)
                for k, v in _frozen_fields(o).items()
                if v is not None and not (k == "fill_factor" and v == 0.0)
            }
            for name, o in self.scheduling.models.items()
        }
        return {
            "endpoints": list(self.endpoints),
            "metrics_endpoints": list(self.metrics_endpoints),
            "worker_names": list(self.worker_names),
            **blocks,
        }


def _plain(value: object) -> object:
    return str(value) if isinstance(value, enum.Enum) else value


# ---------------------------------------------------------------------------
# The environment (REFERENCE.md §3.2).

# Every YAML path that has a variable, and how its text is read.
_ENV_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "listen.grpc": "str",
        "listen.metrics": "str",
        "endpoints": "targets",
        "metrics_endpoints": "targets",
        "worker_names": "names",
        "worker_client.request_timeout_seconds": "int",
        "worker_client.max_concurrent_streams": "int",
        "grpc.max_recv_msg_bytes": "int",
        "grpc.max_send_msg_bytes": "int",
        "grpc.max_concurrent_requests_per_worker": "int",
        "logging.level": "str",
        "logging.format": "str",
        "tls.cert_file": "str",
        "tls.key_file": "str",
        "tls.client_ca_file": "str",
        **{f"scheduling.{k}": "str" for k in SCHEDULING_KNOBS},
        "scheduling.rebalance_compute_seconds": "float",
        "scheduling.first_rebalance_compute_seconds": "float",
        "scheduling.max_worker_share": "float",
        "scheduling.hysteresis": "float",
        "scheduling.ema_halflife_compute_seconds": "float",
        "scheduling.routing_fill_factor": "float",
        "scheduling.forbid_memory_oversubscription": "bool",
        "scheduling.compaction_interval": "int",
    }
)
_ENV_ALIASES = {"endpoints": "WORKERS", "metrics_endpoints": "WORKER_METRICS"}


def env_name(path: str) -> str:
    """The variable that overrides YAML `path`: `scheduling.mode` -> `..._SCHEDULING_MODE`."""
    return ENV_PREFIX + _ENV_ALIASES.get(path, path.replace(".", "_").upper())


#: Variable name -> the YAML path it overrides.
ENV_VARIABLES: Mapping[str, str] = MappingProxyType({env_name(p): p for p in _ENV_KINDS})


def _env_value(var: str, kind: str, text: str) -> object:
    text = text.strip()
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ConfigError(
                f'environment override {var} has invalid integer value "{text}"'
            ) from None
    if kind == "float":
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise ConfigError(f'environment override {var} has invalid number value "{text}"')
        return number
    if kind == "bool":
        return text.lower() in TRUE_WORDS
    if kind == "str":
        return text
    items = [item.strip() for item in text.split(",") if item.strip()]
    # Env lists are not de-duplicated (REFERENCE.md §3.2); a target is checked here so the
    # error names the variable.
    return tuple(check_target(item, var) for item in items) if kind == "targets" else tuple(items)


def _env_set(env: Mapping[str, str], var: str) -> str | None:
    """The variable's value, or None when unset or blank (an empty variable is unset)."""
    value = env.get(var)
    return value if value is not None and value.strip() else None


def _startup_wait(env: Mapping[str, str]) -> float:
    text = _env_set(env, ENV_STARTUP_WAIT)
    if text is None:
        return DEFAULT_STARTUP_WAIT_SECONDS
    if text.strip().lower() in FOREVER_WORDS:
        return math.inf
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (seconds >= 0 or seconds == -1):
        raise ConfigError(
            f"{ENV_STARTUP_WAIT} must be seconds >= 0, or inf/forever/-1, got {text!r}"
        )
    return math.inf if seconds in (-1, math.inf) else seconds


def _health_interval(env: Mapping[str, str], notes: list[str]) -> float:
    text = _env_set(env, ENV_HEALTH_INTERVAL)
    if text is None:
        return DEFAULT_HEALTH_INTERVAL_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if math.isfinite(seconds) and seconds > 0:
        return seconds
    # REFERENCE.md §3.2: a bad interval falls back to the default; we say so.
    notes.append(
        f"{ENV_HEALTH_INTERVAL}={text!r} is not a positive number of seconds; "
        f"using {DEFAULT_HEALTH_INTERVAL_SECONDS:g}"
    )
    return DEFAULT_HEALTH_INTERVAL_SECONDS


def _wedge_exit_rounds(env: Mapping[str, str]) -> int:
    text = _env_set(env, ENV_WEDGE_EXIT_ROUNDS)
    if text is None:
        return DEFAULT_WEDGE_EXIT_ROUNDS
    value = _env_value(ENV_WEDGE_EXIT_ROUNDS, "int", text)
    if not isinstance(value, int) or value < 0:
        raise ConfigError(f"{ENV_WEDGE_EXIT_ROUNDS} must be >= 0 (0 disables), got {text!r}")
    return value


# ---------------------------------------------------------------------------
# Parsing.

_BLOCKS: Mapping[str, type[Any]] = MappingProxyType(
    {
        "listen": ListenConfig,
        "worker_client": WorkerClientConfig,
        "grpc": GrpcLimits,
        "logging": LoggingConfig,
        "tls": TlsConfig,
        "scheduling": SchedulingConfig,
    }
)
_LISTS = ("endpoints", "metrics_endpoints", "worker_names")
_OVERRIDE_KEYS = ("replicas", "fill_mode", "fill_factor")


def _block(value: object, key: str) -> Mapping[Hashable, Any]:
    """A sub-block: absent/null is empty; anything but a mapping is an error."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _must_be(key, "a mapping", value)
    return value


def _note_unknown(
    m: Mapping[Hashable, Any], where: str, known: tuple[str, ...], notes: list[str]
) -> None:
    """Unknown keys are ignored (REFERENCE.md §3.1), but we say so: a typo shows up."""
    for k in m:
        if k not in known:
            name = k if isinstance(k, str) else _show(k)
            notes.append(f"unknown gateway config key '{where}{name}' ignored")


def _yaml_list(value: object, key: str, targets: bool) -> tuple[str, ...]:
    """A YAML list: entries stripped, blanks skipped, endpoint lists de-duplicated."""
    if value is None:
        return ()
    what = "host:port strings" if targets else "strings"
    if not isinstance(value, list | tuple):
        raise ConfigError(f"gateway config '{key}' must be a list of {what}, got {_show(value)}")
    items: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ConfigError(f"gateway config '{key}' entries must be {what}, got {_show(item)}")
        text = item.strip()
        if text and targets:
            check_target(text, f"{key}[{i}]")  # indexed as in the file, before de-duplication
        if text and not (targets and text in items):
            items.append(text)
    return tuple(items)


def _models(value: object) -> dict[str, ModelOverride]:
    models: dict[str, ModelOverride] = {}
    for name, entry in _block(value, "scheduling.models").items():
        key = f"scheduling.models.{name}"
        m = _block(entry, key)
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(
                f"config 'scheduling.models' keys must be model names, got {_show(name)}"
            )
        kwargs: dict[str, Any] = {k: m[k] for k in _OVERRIDE_KEYS if m.get(k) is not None}
        if "fill_factor" in kwargs:  # present means set: 0 is rejected, absent inherits
            kwargs["fill_factor"] = check_fill_factor(kwargs["fill_factor"], f"{key}.fill_factor")
        if "replicas" in kwargs:
            kwargs["replicas"] = check_replicas(kwargs["replicas"], f"{key}.replicas")
        models[name] = _check_override(ModelOverride(**kwargs), key)
    return models


def parse_config(
    raw: object, env: Mapping[str, str] = MappingProxyType({}), *, source: str | None = None
) -> GatewayConfig:
    """Build a `GatewayConfig` from parsed gateway.yml and the environment.

    Args:
        raw: the YAML root (`yaml.safe_load` output, or any equivalent plain data).
        env: the process environment; every `REACTANT_GATEWAY_*` variable that is set
            and not blank replaces its YAML key (see `ENV_VARIABLES`).
        source: where `raw` came from, kept on the config for logging.

    Raises:
        ConfigError: anything invalid; the message names the key (or variable) and value.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"gateway config root must be a mapping, got {_show(raw)}")
    merged: dict[Hashable, Any] = dict(raw)
    applied: list[str] = []
    for path, kind in _ENV_KINDS.items():
        var = env_name(path)
        text = _env_set(env, var)
        if text is None:
            continue
        applied.append(var)
        *parents, leaf = path.split(".")
        target = merged
        for parent in parents:
            target[parent] = dict(_block(target.get(parent), parent))
            target = target[parent]
        target[leaf] = _env_value(var, kind, text)

    notes: list[str] = []
    _note_unknown(merged, "", (*_LISTS, *_BLOCKS), notes)
    lists: dict[str, Any] = {
        key: merged[key]
        if env_name(key) in applied
        else _yaml_list(merged.get(key), key, key != "worker_names")
        for key in _LISTS
    }
    blocks: dict[str, Any] = {}
    for name, cls in _BLOCKS.items():
        m = _block(merged.get(name), name)
        known = tuple(f.name for f in fields(cls))
        _note_unknown(m, f"{name}.", known, notes)
        kwargs: dict[str, Any] = {
            k: v for k, v in m.items() if isinstance(k, str) and k in known and v is not None
        }
        if name == "scheduling":
            models = _block(m.get("models"), "scheduling.models")
            for model, entry in models.items():
                if isinstance(entry, Mapping):
                    _note_unknown(entry, f"scheduling.models.{model}.", _OVERRIDE_KEYS, notes)
            kwargs["models"] = _models(models)
        blocks[name] = cls(**kwargs)
    return GatewayConfig(
        **lists,
        **blocks,
        startup_wait_seconds=_startup_wait(env),
        health_interval_seconds=_health_interval(env, notes),
        wedge_exit_rounds=_wedge_exit_rounds(env),
        env_overrides=tuple(applied),
        notes=tuple(notes),
        source=source,
    )


# ---------------------------------------------------------------------------
# Files.


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that rejects a key given twice in one mapping (plain safe_load keeps
    the last one without a word, so half of an operator's block would silently vanish)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable):
                if key in seen:
                    mark = key_node.start_mark
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str, *, what: str, missing: str | None = None) -> object:
    """Read and parse one YAML file; every failure is a one-line ConfigError.

    Args:
        path: the file.
        what: what the file is, for messages ("gateway config", "node file").
        missing: the message when the file does not exist; default "<what> not found: <path>".
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(missing or f"{what} not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path}: not UTF-8 text ({exc.reason})") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(exc.problem or exc.context or "syntax error").split())
        raise ConfigError(f"{what} {path}: invalid YAML{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path}: invalid YAML: {' '.join(str(exc).split())}") from None


def find_config_file(env: Mapping[str, str] = os.environ) -> str | None:
    """The gateway.yml to use when none is named: `REACTANT_GATEWAY_FILE`, else the
    conventional `/etc/reactantserver/gateway.yml` if it exists, else None (env only).

    The node supervisor also asks this to decide whether a gateway.yml is mounted.

    Raises:
        ConfigError: `REACTANT_GATEWAY_FILE` names a file that does not exist.
    """
    pointed = _env_set(env, ENV_FILE)
    if pointed is not None:
        pointed = pointed.strip()
        if not os.path.isfile(pointed):
            raise ConfigError(f"{ENV_FILE} points at a missing file: {pointed}")
        return pointed
    return DEFAULT_CONFIG_PATH if os.path.isfile(DEFAULT_CONFIG_PATH) else None


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] = os.environ
) -> GatewayConfig:
    """Load the gateway's configuration: gateway.yml (if any) overridden by the environment.

    Args:
        path: the gateway.yml; it must exist. None: `find_config_file(env)` decides, and
            with no file the configuration comes from defaults and the environment only.
        env: the environment to read `REACTANT_GATEWAY_*` from.

    Returns:
        The validated config. Its `env_overrides` (variables applied) and `warnings` are
        for the caller to log; this module never logs.

    Raises:
        ConfigError: a missing or unreadable file, bad YAML, or any invalid value; one line
            that names the file, key or variable, and the bad value.
    """
    if path is not None:
        source = os.fspath(path)
        missing = f"gateway config file not found: {source}"
    else:
        found = find_config_file(env)
        if found is None:
            return parse_config({}, env)
        source, missing = found, f"{ENV_FILE} points at a missing file: {found}"
    raw = read_yaml(source, what="gateway config", missing=missing)
    return parse_config(raw, env, source=source)
