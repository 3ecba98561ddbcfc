"""The node supervisor's decisions: backoff, GPUs, addresses, the gateway's environment, argv.

Pure: no trio, no subprocess, no sockets, no logging, no clock. The Trio shell in
`rsgw.node._supervisor` and `rsgw.node._children` runs the processes; everything it has
to decide about them is a function here of the node, the environment and the numbers it
measured (how long a child ran, what a child printed), so the rules have plain table tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from rsgw.base._errors import ConfigError
from rsgw.base._values import split_host_port
from rsgw.config._blocks import (
    DEFAULT_LISTEN_GRPC,
    DEFAULT_LISTEN_METRICS,
    DEFAULT_SHUTDOWN_GRACE_SECONDS,
    ShutdownConfig,
    check_listen,
)
from rsgw.config._config import ENV_PREFIX, ENV_STARTUP_WAIT, env_name
from rsgw.node._node import BUILTIN_MODEL_REPO, MIRRORED_LIMITS, NodeConfig, WorkerSpec

if TYPE_CHECKING:
    from collections.abc import Sequence

# docs/product.md §6: restart backoff from 1 s to 30 s.
DEFAULT_BACKOFF_INITIAL = 1.0
DEFAULT_BACKOFF_MAX = 30.0
# A run this long counts as healthy: the next crash restarts after the initial delay
# again (systemd's StartLimitIntervalSec plays the same role, at 10 s).
DEFAULT_STABLE_SECONDS = 60.0

ENV_LISTEN_GRPC = env_name("listen.grpc")
ENV_LISTEN_METRICS = env_name("listen.metrics")
ENV_LISTEN_HTTP = env_name("listen.http")


@dataclass(slots=True)
class Backoff:
    """The restart delay policy: doubling from `initial` to `maximum`, reset by a stable run."""

    initial: float = DEFAULT_BACKOFF_INITIAL
    maximum: float = DEFAULT_BACKOFF_MAX
    stable: float = DEFAULT_STABLE_SECONDS
    _next: float = math.nan

    def after_exit(self, ran_for: float) -> float:
        """The delay before restarting a child that exited after running `ran_for` seconds."""
        if math.isnan(self._next) or ran_for >= self.stable:
            self._next = self.initial
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay


# ---------------------------------------------------------------------------
# GPUs.


def cuda_devices(env: Mapping[str, str]) -> list[str] | None:
    """The entries of CUDA_VISIBLE_DEVICES up to the first invalid one; None when unset."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    devices: list[str] = []
    for entry in value.split(","):
        entry = entry.strip()
        # CUDA stops at the first invalid entry; "-1" is the usual way to hide every GPU.
        if not entry or entry.startswith("-"):
            break
        devices.append(entry)
    return devices


def listed_gpu_count(listing: str) -> int:
    """How many GPUs `nvidia-smi -L` printed: its `GPU n: ...` lines."""
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def cuda_device(gpu: int | str, env: Mapping[str, str]) -> str:
    """What a worker on `gpu` gets as CUDA_VISIBLE_DEVICES: the physical device behind it.

    Ordinal i of a node that itself sees `CUDA_VISIBLE_DEVICES=2,3` is device `2,3`[i].
    """
    devices = cuda_devices(env)
    if isinstance(gpu, int) and devices and gpu < len(devices):
        return devices[gpu]
    return str(gpu)


# ---------------------------------------------------------------------------
# Addresses.


def public_addresses(env: Mapping[str, str]) -> tuple[str, str]:
    """The node's public gRPC and metrics addresses: `REACTANT_GATEWAY_LISTEN_*` or defaults.

    Raises:
        ConfigError: a variable is not host:port.
    """
    grpc = env.get(ENV_LISTEN_GRPC, "").strip()
    metrics = env.get(ENV_LISTEN_METRICS, "").strip()
    return (
        check_listen(grpc, ENV_LISTEN_GRPC) if grpc else DEFAULT_LISTEN_GRPC,
        check_listen(metrics, ENV_LISTEN_METRICS) if metrics else DEFAULT_LISTEN_METRICS,
    )


def drain_grace(env: Mapping[str, str]) -> float:
    """Seconds the node lets its public child drain: `shutdown.grace_seconds` as the
    environment sets it (`REACTANT_GATEWAY_SHUTDOWN_GRACE_SECONDS`), else its default.

    Raises:
        ConfigError: the variable is not a number of seconds >= 0.
    """
    variable = env_name("shutdown.grace_seconds")
    text = env.get(variable, "").strip()
    if not text:
        return DEFAULT_SHUTDOWN_GRACE_SECONDS
    return ShutdownConfig(grace_seconds=_seconds(text, variable)).grace_seconds


def _seconds(text: str, variable: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{variable} must be seconds >= 0, got {text!r}") from None


def sole_worker(node: NodeConfig, env: Mapping[str, str]) -> WorkerSpec:
    """The worker of a single-worker node as the supervisor runs it: on the public ports.

    A worker binds one host for both of its servers: the public gRPC address's. (The
    supervisor warns when the public metrics address names another.)

    Raises:
        ConfigError: a public address is malformed.
    """
    (worker,) = node.workers
    grpc, metrics = public_addresses(env)
    host, grpc_port = split_host_port(grpc)
    _, metrics_port = split_host_port(metrics)
    settings = worker.settings
    public_tls = {
        key: env[env_name(f"tls.{key}")]
        for key in _WORKER_TLS_FLAGS
        if env.get(env_name(f"tls.{key}"), "").strip()
    }
    if public_tls:  # the worker is the public endpoint: it serves the gateway's TLS
        settings = MappingProxyType({**settings, "tls": public_tls})
    return dataclasses.replace(
        worker, host=host, port=grpc_port, metrics_port=metrics_port, settings=settings
    )


# ---------------------------------------------------------------------------
# The embedded gateway.


def _dial(worker: WorkerSpec, port: int | None, what: str) -> str:
    if not port:
        raise ConfigError(
            f"worker '{worker.name}' has {what} port 0 (picked at start-up); pass the bound "
            "ports in `workers`"
        )
    return f"{worker.dial_host}:{port}"


def gateway_environment(
    node: NodeConfig,
    env: Mapping[str, str],
    *,
    gateway_yml: Mapping[Any, Any] | None = None,
    workers: Sequence[WorkerSpec] | None = None,
    logging: tuple[str, str] | None = None,
) -> dict[str, str]:
    """The environment the supervisor starts the embedded gateway with (docs/original.md §8.5).

    A copy of `env` plus: `REACTANT_GATEWAY_STARTUP_WAIT_SECONDS=inf` unless set (so the
    gateway waits for workers that are still loading, even with a gateway.yml); the
    worker list, the metrics list (when the node has metrics ports) and the names; the
    worker message limits from `global.grpc` and the TLS files from `global.tls`, unless
    set. A mounted gateway.yml merges with these rather than replacing them: since the
    environment beats the file, a key the file sets is left out (the file's `endpoints`
    owns all three worker lists), so an operator can mount a file that says only
    `scheduling.mode: lpt_packing` and still get the node's workers.

    Args:
        node: the node.
        env: the supervisor's own environment.
        gateway_yml: the root of the gateway.yml the gateway will read
            (`rsgw.config._config.find_config_file`), or None.
        workers: the workers with their bound ports, when the node file said port 0;
            default `node.workers`.
        logging: the node's log level and format (`auto` resolved against the node's
            stderr: the gateway's is a pipe to the node), handed on where neither the
            file nor the environment sets them; an `auto` from either is replaced.

    Raises:
        ConfigError: a worker's port is still 0 (the caller did not pass bound ports).
    """
    out = dict(env)

    def unset(var: str) -> bool:
        return not out.get(var, "").strip()

    def free(path: str) -> bool:
        """Neither the file nor the operator's environment sets `path`."""
        return unset(env_name(path)) and not file_sets(gateway_yml, path)

    if unset(ENV_STARTUP_WAIT):
        out[ENV_STARTUP_WAIT] = "inf"
    specs = node.workers if workers is None else tuple(workers)
    if not file_sets(gateway_yml, "endpoints"):
        out[env_name("endpoints")] = ",".join(_dial(w, w.port, "gRPC") for w in specs)
        if all(w.metrics_port is not None for w in specs) and not file_sets(
            gateway_yml, "metrics_endpoints"
        ):
            out[env_name("metrics_endpoints")] = ",".join(
                _dial(w, w.metrics_port, "metrics") for w in specs
            )
        out[env_name("worker_names")] = ",".join(w.name for w in specs)
    tls = _tls_settings(node.global_settings)
    if tls.get("cert_file"):  # the workers serve TLS: the gateway must speak it to them
        if not tls.get("ca_file"):
            raise ConfigError(
                f"{node.source}: global.tls.ca_file is required with global.tls.cert_file "
                "(the CA the gateway checks the workers' certificates against)"
            )
        if tls.get("client_ca_file") and not tls.get("client_cert_file"):
            raise ConfigError(
                f"{node.source}: global.tls.client_cert_file and client_key_file are required "
                "with global.tls.client_ca_file (the gateway's certificate for the workers)"
            )
        for key, path in _GATEWAY_TLS_KEYS.items():
            if tls.get(key) and free(path):
                out[env_name(path)] = tls[key]
    if logging is not None:
        level, fmt = logging
        if free("logging.level"):
            out[env_name("logging.level")] = level
        given = out.get(env_name("logging.format"), "").strip().lower() or file_value(
            gateway_yml, "logging.format"
        )
        if given in (None, "auto"):
            out[env_name("logging.format")] = fmt
    grpc = node.global_settings.get("grpc")
    for key in MIRRORED_LIMITS:
        limit = grpc.get(key) if isinstance(grpc, Mapping) else None
        if limit is not None and free(f"grpc.{key}"):
            out[env_name(f"grpc.{key}")] = str(limit)
    return out


def file_value(root: Mapping[Any, Any] | None, path: str) -> Any:
    """The value a gateway.yml root gives dotted `path`, None when it gives none (an
    empty value counts as absent, as in gateway.yml)."""
    value: Any = root
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def file_sets(root: Mapping[Any, Any] | None, path: str) -> bool:
    """Whether a gateway.yml root gives dotted `path` a value."""
    return file_value(root, path) is not None


def _with_port(address: str, port: int) -> str:
    host, _ = split_host_port(address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def pinned_gateway_env(
    env: Mapping[str, str], grpc_port: int, metrics_port: int | None, http_port: int | None = None
) -> dict[str, str]:
    """The gateway's environment for its restarts, once it reported its bound ports.

    Only a port 0 we chose through the environment is pinned: a gateway.yml's listen
    addresses are the operator's to keep.
    """
    out = dict(env)
    pairs = ((ENV_LISTEN_GRPC, grpc_port), (ENV_LISTEN_METRICS, metrics_port))
    for var, port in (*pairs, (ENV_LISTEN_HTTP, http_port)):
        address = out.get(var, "")
        if port is not None and address.strip().endswith(":0"):
            out[var] = _with_port(address.strip(), port)
    return out


# ---------------------------------------------------------------------------
# Command lines and log lines.


def worker_command(
    spec: WorkerSpec,
    node: NodeConfig,
    *,
    device: str,
    logging_flags: Sequence[str],
    executable: str,
) -> list[str]:
    """The `rsgw worker` command line that runs `spec` of `node`.

    Of the worker's node-file settings it passes on `scheduler.discipline`
    (`--discipline`), `memory.weight_cache_bytes` (`--weight-cache-bytes`, rsgw's own
    key: the on-demand weight budget) and the node's `models:` residency (`--pin MODEL`).

    Args:
        spec: the worker, with the ports it should bind.
        node: its node (the model repository and the residency).
        device: its CUDA_VISIBLE_DEVICES (`cuda_device`).
        logging_flags: `--log-level` / `--log-format` and their values.
        executable: the Python interpreter to run (the supervisor's own).
    """
    argv = [executable, "-m", "rsgw", "worker", "--name", spec.name]
    argv += ["--gpu", device, "--host", spec.host]
    argv += ["--port", str(spec.port)]
    argv += ["--metrics-port", str(-1 if spec.metrics_port is None else spec.metrics_port)]
    if node.model_repo != BUILTIN_MODEL_REPO:
        argv += ["--models", node.model_repo]
    scheduler = spec.settings.get("scheduler")
    discipline = scheduler.get("discipline") if isinstance(scheduler, Mapping) else None
    if isinstance(discipline, str):
        # The original's worker setting (docs/original.md §8.3); the worker checks the value.
        argv += ["--discipline", discipline.lower()]
    memory = spec.settings.get("memory")
    budget = memory.get("weight_cache_bytes") if isinstance(memory, Mapping) else None
    if isinstance(budget, int | str) and not isinstance(budget, bool):
        argv += ["--weight-cache-bytes", str(budget)]  # the worker checks the value
    # The node file's `models:` residency `device` is a pin on these workers.
    for model in node.models_on(spec.name):
        argv += ["--pin", model]
    tls = _tls_settings(spec.settings)
    for key, flag in _WORKER_TLS_FLAGS.items():
        if tls.get(key):
            argv += [flag, tls[key]]
    return argv + list(logging_flags)


#: `tls:` keys of a worker's node-file settings -> the `rsgw worker` flags.
_WORKER_TLS_FLAGS = {
    "cert_file": "--tls-cert",
    "key_file": "--tls-key",
    "client_ca_file": "--tls-client-ca",
}
#: `global.tls:` keys for the embedded gateway's side -> its `worker_client.` keys.
_GATEWAY_TLS_KEYS = {
    "ca_file": "worker_client.tls_ca_file",
    "client_cert_file": "worker_client.tls_cert_file",
    "client_key_file": "worker_client.tls_key_file",
}


def _tls_settings(settings: Mapping[str, object]) -> dict[str, str]:
    """The `tls:` block of node-file settings, its string values only."""
    block = settings.get("tls")
    if not isinstance(block, Mapping):
        return {}
    return {str(k): v for k, v in block.items() if isinstance(v, str) and v}


#: The `REACTANT_GATEWAY_*` variables the operator set, as `rsgw node` hands them to its
#: gateway (comma-separated): the gateway's "overridden by environment" line names only
#: these, not the ones the node derived (its workers, its flags, its log format).
OPERATOR_VARIABLES = "RSGW_NODE_OPERATOR_VARIABLES"


def operator_variables(env: Mapping[str, str]) -> str:
    """`OPERATOR_VARIABLES`'s value for the operator's own environment `env`."""
    return ",".join(sorted(k for k in env if k.startswith(ENV_PREFIX) and env[k].strip()))


def gateway_command(executable: str) -> list[str]:
    """The command line of the embedded gateway: `rsgw run`, configured by environment."""
    return [executable, "-m", "rsgw", "run"]


_TEXT_PORT = {
    key: re.compile(rf"(?:^| ){key}=(\d+|None)(?= |$)")
    for key in ("grpc_port", "metrics_port", "http_port")
}


def parse_serving(line: str, event: str) -> tuple[int, int | None] | None:
    """The (gRPC, metrics) ports of a child's `event` log line, or None if it is not one.

    Children log JSON by default and `k=v` text with `--log-format text`; we read both,
    so an operator's choice of format does not stop the supervisor learning ports.
    """
    if event not in line:
        return None
    fields: dict[str, object] = {}
    if line.lstrip().startswith("{"):
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("event") == event:
                fields = entry
    elif f": {event} " in line or line.endswith(f": {event}"):
        for key, pattern in _TEXT_PORT.items():
            found = pattern.search(line)
            if found:
                fields[key] = None if found.group(1) == "None" else int(found.group(1))
    grpc, metrics = fields.get("grpc_port"), fields.get("metrics_port")
    if not isinstance(grpc, int) or not (metrics is None or isinstance(metrics, int)):
        return None
    return grpc, metrics


def serving_http_port(line: str) -> int | None:
    """The REST port of the gateway's `gateway serving` log line (None: not one, or no
    REST listener), read from JSON or `k=v` text as `parse_serving` reads the others."""
    if "gateway serving" not in line:
        return None
    if line.lstrip().startswith("{"):
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            port = entry.get("http_port") if isinstance(entry, dict) else None
            return port if isinstance(port, int) else None
        return None
    found = _TEXT_PORT["http_port"].search(line)
    return int(found.group(1)) if found and found.group(1) != "None" else None
