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
4. Every dataclass (`rsgw.config._schema`, `rsgw.config._blocks`) checks its own fields,
   so a config built by hand or by `dataclasses.replace` in the control plane is held to
   the rules gateway.yml is, every `ConfigError` naming the key path and the bad value
   (the scheduling knobs' checks: `rsgw.scheduling.knobs._knobs`, docs/original.md §3.3).

The configuration object and its enums are re-exported: one import loads or builds one.

We differ from the original where docs/product.md says so (a `scheduling.models.<m>` entry
without `replicas` inherits `default_replicas`; `logging.*` is honoured) and where it was
silent (docs/configuration.md, "Decisions"): unparsable `STARTUP_WAIT_SECONDS` is an
error rather than 0; an empty variable counts as unset; numbers must be finite.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Hashable, Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import Any, Final

from rsgw.base._errors import ConfigError
from rsgw.base._usage import nearest
from rsgw.base._values import must_be, read_yaml, show
from rsgw.config._blocks import AuthConfig as AuthConfig
from rsgw.config._blocks import ConnectionsConfig as ConnectionsConfig
from rsgw.config._blocks import GrpcLimits as GrpcLimits
from rsgw.config._blocks import ListenConfig as ListenConfig
from rsgw.config._blocks import LoggingConfig as LoggingConfig
from rsgw.config._blocks import MetricsConfig as MetricsConfig
from rsgw.config._blocks import OutlierConfig as OutlierConfig
from rsgw.config._blocks import ServerMetadataConfig as ServerMetadataConfig
from rsgw.config._blocks import ShmConfig as ShmConfig
from rsgw.config._blocks import ShutdownConfig as ShutdownConfig
from rsgw.config._blocks import TlsConfig as TlsConfig
from rsgw.config._blocks import WorkerClientConfig as WorkerClientConfig
from rsgw.config._endpoints import check_endpoint
from rsgw.config._fleet_blocks import FLEET_ENV_KINDS
from rsgw.config._fleet_blocks import CoordinationConfig as CoordinationConfig
from rsgw.config._fleet_blocks import DiscoveryConfig as DiscoveryConfig
from rsgw.config._fleet_blocks import RepositoryConfig as RepositoryConfig
from rsgw.config._schema import (
    DEFAULT_HEALTH_INTERVAL_SECONDS,
    DEFAULT_STARTUP_WAIT_SECONDS,
    DEFAULT_WEDGE_EXIT_ROUNDS,
)
from rsgw.config._schema import GatewayConfig as GatewayConfig
from rsgw.config._tenancy import TENANCY_ENV_KINDS, nested_entries
from rsgw.config._tenancy import TenancyConfig as TenancyConfig
from rsgw.config._tenancy import TenantPolicy as TenantPolicy
from rsgw.config._tracing import TracingConfig as TracingConfig
from rsgw.config._tracing import otel_overrides
from rsgw.scheduling.knobs._knobs import SCHEDULING_KNOBS, check_fill_factor, check_replicas
from rsgw.scheduling.knobs._knobs import CompactionMode as CompactionMode
from rsgw.scheduling.knobs._knobs import FillMode as FillMode
from rsgw.scheduling.knobs._knobs import Replicas as Replicas
from rsgw.scheduling.knobs._knobs import RoutingPolicy as RoutingPolicy
from rsgw.scheduling.knobs._knobs import SchedulingMode as SchedulingMode
from rsgw.scheduling.knobs._knobs import WorkBasis as WorkBasis
from rsgw.scheduling.knobs._settings import ModelOverride as ModelOverride
from rsgw.scheduling.knobs._settings import SchedulingConfig as SchedulingConfig
from rsgw.scheduling.knobs._settings import check_override

DEFAULT_CONFIG_PATH = "/etc/reactantserver/gateway.yml"
ENV_PREFIX = "REACTANT_GATEWAY_"
ENV_FILE = "REACTANT_GATEWAY_FILE"
ENV_STARTUP_WAIT = "REACTANT_GATEWAY_STARTUP_WAIT_SECONDS"
ENV_HEALTH_INTERVAL = "REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS"
ENV_WEDGE_EXIT_ROUNDS = "REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS"
ENV_STRICT = "REACTANT_GATEWAY_STRICT"
TRUE_WORDS: Final = frozenset({"1", "true", "yes", "on"})
FOREVER_WORDS: Final = frozenset({"inf", "+inf", "infinity", "forever", "-1"})


# ---------------------------------------------------------------------------
# The environment (docs/original.md §3.2).

# Every YAML path that has a variable, and how its text is read.
_ENV_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "listen.grpc": "str",
        "listen.metrics": "str",
        "listen.http": "str",
        "endpoints": "targets",
        "metrics_endpoints": "targets",
        "worker_names": "names",
        "worker_client.request_timeout_seconds": "int",
        "worker_client.max_concurrent_streams": "int",
        "worker_client.tls_ca_file": "str",
        "worker_client.tls_cert_file": "str",
        "worker_client.tls_key_file": "str",
        "grpc.max_recv_msg_bytes": "int",
        "grpc.max_send_msg_bytes": "int",
        "grpc.max_concurrent_requests_per_worker": "int",
        "grpc.max_queue_seconds": "float",
        "logging.level": "str",
        "logging.format": "str",
        "logging.access_log_sample_rate": "float",
        "logging.access_log_max_per_second": "int",
        "tls.cert_file": "str",
        "tls.key_file": "str",
        "tls.client_ca_file": "str",
        "auth.tokens_file": "str",
        "auth.trusted_network": "bool",
        "shm.max_regions_per_client": "int",
        "shm.max_bytes_per_client": "int",
        "shm.allow_remote_clients": "bool",
        "shm.key_prefix": "str",
        "server_metadata.name": "str",
        "server_metadata.version": "str",
        "shutdown.grace_seconds": "float",
        "outlier_detection.stall_seconds": "float",
        "outlier_detection.ping_timeout_seconds": "float",
        "outlier_detection.ejection_seconds": "float",
        "connections.max_connections": "int",
        "connections.idle_seconds": "float",
        "connections.header_seconds": "float",
        "connections.max_header_list_bytes": "int",
        "connections.max_buffered_bytes": "int",
        "connections.max_buffered_bytes_total": "int",
        "connections.stream_window_bytes": "int",
        "connections.flood_budget": "int",
        "connections.max_concurrent_streams": "int",
        "metrics.scrape_timeout_seconds": "float",
        **FLEET_ENV_KINDS,
        **{f"scheduling.{k}": "str" for k in SCHEDULING_KNOBS},
        "scheduling.rebalance_compute_seconds": "float",
        "scheduling.first_rebalance_compute_seconds": "float",
        "scheduling.max_worker_share": "float",
        "scheduling.hysteresis": "float",
        "scheduling.ema_halflife_compute_seconds": "float",
        "scheduling.routing_fill_factor": "float",
        "scheduling.forbid_memory_oversubscription": "bool",
        "scheduling.compaction_interval": "int",
        **TENANCY_ENV_KINDS,
    }
)
_ENV_ALIASES = {"endpoints": "WORKERS", "metrics_endpoints": "WORKER_METRICS"}


def env_name(path: str) -> str:
    """The variable that overrides YAML `path`: `scheduling.mode` -> `..._SCHEDULING_MODE`."""
    return ENV_PREFIX + _ENV_ALIASES.get(path, path.replace(".", "_").upper())


#: Variable name -> the YAML path it overrides.
ENV_VARIABLES: Mapping[str, str] = MappingProxyType({env_name(p): p for p in _ENV_KINDS})
#: Every `REACTANT_GATEWAY_*` variable rsgw reads: the overrides, and the process-level
#: ones that have no YAML key.
KNOWN_VARIABLES: frozenset[str] = frozenset(
    {
        *ENV_VARIABLES,
        ENV_FILE,
        ENV_STARTUP_WAIT,
        ENV_HEALTH_INTERVAL,
        ENV_WEDGE_EXIT_ROUNDS,
        ENV_STRICT,
    }
)


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """One line for each `REACTANT_GATEWAY_*` variable rsgw does not read (a typo is
    otherwise ignored without a word), naming the nearest one it does."""
    lines = []
    names = [known.removeprefix(ENV_PREFIX) for known in KNOWN_VARIABLES]
    for var in sorted(env):
        if var.startswith(ENV_PREFIX) and var not in KNOWN_VARIABLES:
            near = difflib.get_close_matches(var.removeprefix(ENV_PREFIX), names, 1, 0.6)
            hint = f" (did you mean {ENV_PREFIX}{near[0]}?)" if near else ""
            lines.append(f"unknown environment variable {var} ignored{hint}")
    return lines


def strict(env: Mapping[str, str]) -> bool:
    """`REACTANT_GATEWAY_STRICT`: unknown keys and variables are errors, not warnings."""
    value = _env_set(env, ENV_STRICT)
    return value is not None and value.strip().lower() in TRUE_WORDS


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
    # Env lists are not de-duplicated (docs/original.md §3.2); a target is checked here so the
    # error names the variable.
    return tuple(check_endpoint(item, var) for item in items) if kind == "targets" else tuple(items)


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
    # docs/original.md §3.2: a bad interval falls back to the default; we say so.
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
        "auth": AuthConfig,
        "shm": ShmConfig,
        "server_metadata": ServerMetadataConfig,
        "shutdown": ShutdownConfig,
        "outlier_detection": OutlierConfig,
        "connections": ConnectionsConfig,
        "metrics": MetricsConfig,
        "discovery": DiscoveryConfig,
        "repository": RepositoryConfig,
        "coordination": CoordinationConfig,
        "scheduling": SchedulingConfig,
        "tracing": TracingConfig,
        "tenancy": TenancyConfig,
    }
)
_LISTS = ("endpoints", "metrics_endpoints", "worker_names")
_OVERRIDE_KEYS = ("replicas", "fill_mode", "fill_factor")


def _block(value: object, key: str) -> Mapping[Hashable, Any]:
    """A sub-block: absent/null is empty; anything but a mapping is an error."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise must_be(key, "a mapping", value)
    return value


def _note_unknown(
    m: Mapping[Hashable, Any], where: str, known: tuple[str, ...], notes: list[str]
) -> None:
    """Unknown keys are ignored (docs/original.md §3.1), but we say so: a typo shows up."""
    for k in m:
        if k not in known:
            name = k if isinstance(k, str) else show(k)
            hint = nearest(f"{where}{name}", [f"{where}{key}" for key in known])
            notes.append(f"unknown gateway config key '{where}{name}' ignored{hint}")


def _yaml_list(value: object, key: str, targets: bool) -> tuple[str, ...]:
    """A YAML list: entries stripped, blanks skipped, endpoint lists de-duplicated."""
    if value is None:
        return ()
    what = "host:port strings" if targets else "strings"
    if not isinstance(value, list | tuple):
        raise ConfigError(f"gateway config '{key}' must be a list of {what}, got {show(value)}")
    items: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ConfigError(f"gateway config '{key}' entries must be {what}, got {show(item)}")
        text = item.strip()
        if text and targets:
            check_endpoint(text, f"{key}[{i}]")  # indexed as in the file, before de-duplication
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
                f"config 'scheduling.models' keys must be model names, got {show(name)}"
            )
        kwargs: dict[str, Any] = {k: m[k] for k in _OVERRIDE_KEYS if m.get(k) is not None}
        if "fill_factor" in kwargs:  # present means set: 0 is rejected, absent inherits
            kwargs["fill_factor"] = check_fill_factor(kwargs["fill_factor"], f"{key}.fill_factor")
        if "replicas" in kwargs:
            kwargs["replicas"] = check_replicas(kwargs["replicas"], f"{key}.replicas")
        models[name] = check_override(ModelOverride(**kwargs), key)
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
        raise ConfigError(f"gateway config root must be a mapping, got {show(raw)}")
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
    otel, used = otel_overrides(env)  # OpenTelemetry's own variables (`_tracing`)
    if otel:
        merged["tracing"] = {**_block(merged.get("tracing"), "tracing"), **otel}
        applied += used

    notes: list[str] = unknown_variables(env)
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
        for entry, where, keys in nested_entries(m) if name == "tenancy" else ():
            _note_unknown(entry, where, keys, notes)
        blocks[name] = cls(**kwargs)
    health_interval = _health_interval(env, notes)
    if notes and strict(env):
        first = notes[0].replace(" ignored", "")
        raise ConfigError(f"{first}: {ENV_STRICT} makes unknown settings errors")
    return GatewayConfig(
        **lists,
        **blocks,
        startup_wait_seconds=_startup_wait(env),
        health_interval_seconds=health_interval,
        wedge_exit_rounds=_wedge_exit_rounds(env),
        env_overrides=tuple(applied),
        notes=tuple(notes),
        source=source,
    )


# ---------------------------------------------------------------------------
# Files.


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


def config_file_root(path: str) -> Mapping[Hashable, Any]:
    """The root mapping of a gateway.yml, for a caller that merges with it (`rsgw node`).

    Raises:
        ConfigError: the file is missing or unreadable, bad YAML, or not a mapping.
    """
    raw = read_yaml(path, what="gateway config")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: gateway config root must be a mapping, got {show(raw)}")
    return raw


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
