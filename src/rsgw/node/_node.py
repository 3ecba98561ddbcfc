"""The node file: which workers a node runs, on which GPUs and ports (docs/original.md §8.5).

Pure apart from `load_node` reading the file. The supervisor (`rsgw node`) and
`probe_worker_ready` read the same `NodeConfig`, so they always agree on which worker
listens where.

Worker synthesis, in order:

1. `gpus` resolves to a tuple of GPU ids: `auto` counts the GPUs the caller saw
   (`visible_gpus`; with none we simulate 4 and say so in `notes`), an integer N means
   GPUs 0..N-1, a list names them (ordinals or UUID strings).
2. Without a `workers:` list there is one worker per GPU, named worker0..N-1. With one,
   the list is the workers; worker i takes its own `gpu:` or else the i-th GPU id (or i).
3. Worker i listens on its own `port:` or `base_port + i`, and serves metrics on
   `metrics_base_port + i` when that key is set. A base of 0 gives every worker port 0
   ("pick a free port", docs/product.md §2); the supervisor then learns the bound ports.
4. A worker's settings are `global` deep-merged with its own override blocks.
5. `server:` says what serves each GPU (`rsgw.node._servers`): rsgw's simulated worker
   (the default), the `triton` or `mlserver` preset, or any command. A server of its
   own names its workers after their GPUs (gpu0..), serves REST on `http_base_port + i`
   and metrics on `metrics_base_port + i` (defaults 8180 and 9100: Triton always
   serves all three), and gets the worker's own `env:` on top of the server's.

Checked: every port is in range and no non-zero port (gRPC or metrics) is used twice;
worker names are unique and fit in `REACTANT_GATEWAY_WORKER_NAMES`; every worker named
under `models:` exists. Each `ConfigError` starts with the file and names the key and
the bad value. Unknown top-level keys are noted, not rejected: node files are shared
with the original's workers, which may read keys rsgw does not.
"""

from __future__ import annotations

import os
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeGuard

from rsgw.base._errors import ConfigError
from rsgw.base._values import read_yaml, show
from rsgw.config._blocks import MAX_MESSAGE_BYTES
from rsgw.node._servers import (
    DEFAULT_HTTP_BASE_PORT,
    ServerSpec,
    parse_env,
    parse_server,
    server_from_flags,
)
from rsgw.worker.models._catalogue import BUILTIN_SETS

# The default node (docs/original.md §8.5's template): what `rsgw node` runs without a file.
DEFAULT_BASE_PORT = 8080
DEFAULT_METRICS_BASE_PORT = 9100
DEFAULT_WORKER_HOST = "127.0.0.1"
# docs/product.md §6: `gpus: auto` with no visible GPU simulates this many.
SIMULATED_GPUS = 4
BUILTIN_MODEL_REPO = "builtin"
DEFAULT_NODE_TEMPLATE: Mapping[str, object] = MappingProxyType(
    {
        "model_repo": BUILTIN_MODEL_REPO,
        "base_port": DEFAULT_BASE_PORT,
        "metrics_base_port": DEFAULT_METRICS_BASE_PORT,
        "gpus": "auto",
    }
)
# Where a worker is dialled when it binds a wildcard address.
LOOPBACK = "127.0.0.1"
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})

_NODE_KEYS = (
    "model_repo",
    "base_port",
    "metrics_base_port",
    "gpus",
    "global",
    "workers",
    "models",
    "shared_host_weights",
    "server",
    "http_base_port",
)
_WORKER_KEYS = ("name", "gpu", "host", "port", "env")
# The worker message limits the embedded gateway mirrors (docs/original.md §8.5).
MIRRORED_LIMITS = ("max_recv_msg_bytes", "max_send_msg_bytes")

GpuId = int | str
#: What the caller saw of the machine's GPUs: a count (CUDA_VISIBLE_DEVICES, whose
#: entries the ordinals map through), the UUIDs `nvidia-smi -L` listed, or None.
Visible = int | tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One worker of the node: its name, GPU, where it listens, and its settings."""

    name: str
    gpu: GpuId
    host: str
    # 0 = pick a free port at start-up.
    port: int
    # None = no metrics server; 0 = pick a free port.
    metrics_port: int | None
    # A server of its own's REST port (None for rsgw's worker, which serves none).
    http_port: int | None = None
    # Added to its environment (a server of its own), over the server's `env`.
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # `global` deep-merged with this worker's own override blocks (read-only, nested).
    settings: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def dial_host(self) -> str:
        """The address to reach this worker at from the node: loopback for a wildcard bind."""
        return LOOPBACK if self.host in _WILDCARDS else self.host


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """A validated node file. Build it with `load_node` or `parse_node`."""

    source: str
    model_repo: str
    base_port: int
    metrics_base_port: int | None
    # The resolved GPU ids (`gpus: auto` already counted).
    gpus: tuple[GpuId, ...]
    workers: tuple[WorkerSpec, ...]
    # model -> the workers it is resident (`device`) on.
    models: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    global_settings: Mapping[str, object] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    shared_host_weights: bool = False
    # What serves each GPU (rsgw's simulated worker by default).
    server: ServerSpec = field(default_factory=ServerSpec)
    # What the supervisor should log (simulated GPUs, ignored keys); no part of equality.
    notes: tuple[str, ...] = field(default=(), compare=False)

    def worker(self, name: str) -> WorkerSpec | None:
        """The worker called `name`, or None."""
        return next((w for w in self.workers if w.name == name), None)

    def models_on(self, worker: str) -> tuple[str, ...]:
        """The models the node file makes resident on `worker`, sorted."""
        return tuple(sorted(m for m, names in self.models.items() if worker in names))


# ---------------------------------------------------------------------------
# Parsing. Helpers raise ConfigError starting with the key path; parse_node prefixes
# the source.


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _port(value: object, key: str) -> int:
    if not _is_int(value) or not 0 <= value <= 65535:
        raise ConfigError(f"{key} must be a port number in 0..65535, got {show(value)}")
    return value


def _mapping(value: object, key: str) -> Mapping[Hashable, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping, got {show(value)}")
    return value


def _gpu_id(value: object, key: str) -> GpuId:
    if _is_int(value) and value >= 0:
        return value
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ConfigError(f"{key} must be a GPU ordinal >= 0 or a GPU UUID string, got {show(value)}")


def _gpus(value: object, visible_gpus: Visible, notes: list[str]) -> tuple[GpuId, ...]:
    if isinstance(value, str) and value.strip().lower() == "auto":
        if isinstance(visible_gpus, tuple) and visible_gpus:
            return visible_gpus
        if isinstance(visible_gpus, int) and visible_gpus:
            return tuple(range(visible_gpus))
        notes.append(f"gpus: auto found no visible GPU; simulating {SIMULATED_GPUS} GPUs")
        return tuple(range(SIMULATED_GPUS))
    if _is_int(value) and value >= 0:
        return tuple(range(value))
    if isinstance(value, list) and value:
        ids = [_gpu_id(v, f"gpus[{i}]") for i, v in enumerate(value)]
        for i, gpu in enumerate(ids):
            if gpu in ids[:i]:
                raise ConfigError(f"gpus[{i}] lists GPU {gpu!r} a second time")
        return tuple(ids)
    raise ConfigError(
        "gpus must be 'auto', a GPU count >= 0, or a non-empty list of GPU ordinals "
        f"or UUIDs, got {show(value)}"
    )


def _freeze(value: object) -> object:
    """A read-only deep copy: mappings become mapping proxies, lists tuples."""
    if isinstance(value, Mapping):
        return _frozen(value)
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _frozen(m: Mapping[Any, Any]) -> Mapping[str, object]:
    # Top-level keys are checked to be strings; nested keys are kept as YAML gave them.
    return MappingProxyType({k: _freeze(v) for k, v in m.items()})


def _deep_merge(base: Mapping[Hashable, Any], over: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
    """`over` on top of `base`; where both hold a mapping, merge those the same way."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            merged[key] = _deep_merge(below, value)
        else:
            merged[key] = value
    return merged


def _global(value: object) -> Mapping[Hashable, Any]:
    settings = _mapping(value, "global")
    for key in settings:
        if not isinstance(key, str):
            raise ConfigError(f"global keys must be strings, got {show(key)}")
    grpc = _mapping(settings.get("grpc"), "global.grpc")
    for key in MIRRORED_LIMITS:
        limit = grpc.get(key)
        if limit is not None and not (_is_int(limit) and 0 < limit <= MAX_MESSAGE_BYTES):
            raise ConfigError(
                f"global.grpc.{key} must be an integer in 1..{MAX_MESSAGE_BYTES}, got {show(limit)}"
            )
    return settings


def _name(value: object, key: str) -> str:
    # A name travels in the comma-separated REACTANT_GATEWAY_WORKER_NAMES and in log
    # prefixes, so a comma or whitespace in it would split or blur it.
    if not isinstance(value, str) or not re.fullmatch(r"[^\s,]+", value):
        raise ConfigError(
            f"{key} must be a non-empty name without commas or whitespace, got {show(value)}"
        )
    return value


def _offset(base: int, i: int, key: str, worker: str) -> int:
    if base == 0:
        return 0
    if base + i > 65535:
        raise ConfigError(f"{key} + {i} for worker '{worker}' is {base + i}, past port 65535")
    return base + i


def _workers(
    raw: Mapping[Hashable, Any],
    gpus: tuple[GpuId, ...],
    base_port: int,
    metrics_base_port: int | None,
    settings: Mapping[Hashable, Any],
    http_base_port: int | None = None,
    prefix: str = "worker",
) -> tuple[WorkerSpec, ...]:
    entries = raw.get("workers")
    if entries is None:
        if not gpus:
            raise ConfigError("gpus is 0 and there is no workers: list, so the node has no workers")
        entries = [{"name": f"{prefix}{i}"} for i in range(len(gpus))]
    elif not isinstance(entries, list) or not entries:
        raise ConfigError(f"workers must be a non-empty list of mappings, got {show(entries)}")
    workers: list[WorkerSpec] = []
    for i, entry in enumerate(entries):
        where = f"workers[{i}]"
        m = _mapping(entry, where)
        if m.get("name") is None:
            raise ConfigError(f"{where}.name is required")
        name = _name(m["name"], f"{where}.name")
        if any(w.name == name for w in workers):
            raise ConfigError(f"{where}.name duplicates an earlier worker: '{name}'")
        host = m.get("host", DEFAULT_WORKER_HOST)
        if not isinstance(host, str) or not host.strip():
            raise ConfigError(f"{where}.host must be a non-empty string, got {show(host)}")
        overrides = {k: v for k, v in m.items() if k not in _WORKER_KEYS}
        for key in overrides:
            if not isinstance(key, str):
                raise ConfigError(f"{where} keys must be strings, got {show(key)}")
        if "port" in m and m["port"] is not None:
            port = _port(m["port"], f"{where}.port")
        else:
            port = _offset(base_port, i, "base_port", name)
        workers.append(
            WorkerSpec(
                name=name,
                gpu=_gpu_id(m["gpu"], f"{where}.gpu")
                if m.get("gpu") is not None
                else (gpus[i] if i < len(gpus) else i),
                host=host.strip(),
                port=port,
                metrics_port=None
                if metrics_base_port is None
                else _offset(metrics_base_port, i, "metrics_base_port", name),
                http_port=None
                if http_base_port is None
                else _offset(http_base_port, i, "http_base_port", name),
                env=parse_env(m.get("env"), f"{where}.env"),
                settings=_frozen(_deep_merge(settings, overrides)),
            )
        )
    return tuple(workers)


def _check_ports(workers: tuple[WorkerSpec, ...]) -> None:
    """No non-zero port may be used twice, gRPC or metrics (0 means "pick a free one")."""
    users: dict[int, str] = {}
    for w in workers:
        for port, what in ((w.port, "gRPC"), (w.metrics_port, "metrics"), (w.http_port, "HTTP")):
            if not port:
                continue
            user = f"worker '{w.name}' ({what})"
            if port in users:
                raise ConfigError(f"port {port} is used twice: by {users[port]} and by {user}")
            users[port] = user


def _models(value: object, workers: tuple[WorkerSpec, ...]) -> dict[str, tuple[str, ...]]:
    names = [w.name for w in workers]
    models: dict[str, tuple[str, ...]] = {}
    for model, listed in _mapping(value, "models").items():
        where = f"models.{model}"
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"models keys must be model names, got {show(model)}")
        if not isinstance(listed, list) or not listed:
            raise ConfigError(
                f"{where} must be a non-empty list of worker names, got {show(listed)}"
            )
        for i, worker in enumerate(listed):
            if worker not in names:
                raise ConfigError(
                    f"{where}[{i}]: worker {show(worker)} not defined in node "
                    f"(workers: {', '.join(names)})"
                )
            if worker in listed[:i]:
                raise ConfigError(f"{where}[{i}] lists worker '{worker}' a second time")
        models[model] = tuple(listed)
    return models


def parse_node(
    raw: object,
    *,
    source: str,
    visible_gpus: Visible = None,
    gpus: int | None = None,
    base_dir: str | None = None,
    server: str | None = None,
    command: str | None = None,
) -> NodeConfig:
    """Validate a node file's YAML and synthesize its workers.

    Args:
        raw: the YAML root, as `yaml.safe_load` returns it.
        source: where it came from; every error starts with it.
        visible_gpus: the GPUs the caller found (for `gpus: auto`): a count, or the
            UUIDs; None or none means the node simulates `SIMULATED_GPUS`.
        gpus: overrides the file's `gpus` (the `--gpus N` of `rsgw node`).
        server, command: override the file's `server:` (`--server`, `--command`).
        base_dir: a relative `model_repo` path is taken relative to it (the file's folder).

    Raises:
        ConfigError: anything invalid, naming the source, the key and the bad value.
    """
    try:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"node file root must be a mapping, got {show(raw)}")
        notes = [f"unknown node key {show(k)} ignored" for k in raw if k not in _NODE_KEYS]
        repo = raw.get("model_repo")
        if repo is None:
            raise ConfigError(
                "model_repo is required ('builtin', 'triton-docs' or a model catalogue YAML)"
            )
        if not isinstance(repo, str) or not repo.strip():
            raise ConfigError(f"model_repo must be a non-empty string, got {show(repo)}")
        repo = repo.strip()
        if repo not in BUILTIN_SETS and base_dir is not None:
            repo = os.path.join(base_dir, repo)
        spec = server_from_flags(parse_server(raw.get("server")), server=server, command=command)
        base_port = _port(raw.get("base_port", DEFAULT_BASE_PORT), "base_port")
        metrics_base = raw.get("metrics_base_port")
        if metrics_base is None and spec.external:
            metrics_base = DEFAULT_METRICS_BASE_PORT
        metrics_base_port = (
            None if metrics_base is None else _port(metrics_base, "metrics_base_port")
        )
        http_base = raw.get("http_base_port", DEFAULT_HTTP_BASE_PORT if spec.external else None)
        http_base_port = None if http_base is None else _port(http_base, "http_base_port")
        gpu_ids = _gpus(raw.get("gpus", "auto") if gpus is None else gpus, visible_gpus, notes)
        settings = _global(raw.get("global"))
        workers = _workers(
            raw,
            gpu_ids,
            base_port,
            metrics_base_port,
            settings,
            http_base_port,
            prefix="gpu" if spec.external else "worker",
        )
        _check_ports(workers)
        shared = raw.get("shared_host_weights", False)
        if not isinstance(shared, bool):
            raise ConfigError(f"shared_host_weights must be a boolean, got {show(shared)}")
        return NodeConfig(
            source=source,
            model_repo=repo,
            base_port=base_port,
            metrics_base_port=metrics_base_port,
            gpus=gpu_ids,
            workers=workers,
            models=MappingProxyType(_models(raw.get("models"), workers)),
            global_settings=_frozen(settings),
            shared_host_weights=shared,
            server=spec,
            notes=tuple(notes),
        )
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_node(
    path: str | os.PathLike[str],
    *,
    visible_gpus: Visible = None,
    gpus: int | None = None,
    server: str | None = None,
    command: str | None = None,
) -> NodeConfig:
    """Read and validate a node file; a relative `model_repo` is relative to the file.

    Raises:
        ConfigError: the file is missing, unreadable, not YAML or not a valid node file.
    """
    source = os.fspath(path)
    raw = read_yaml(source, what="node file")
    return parse_node(
        raw,
        source=source,
        visible_gpus=visible_gpus,
        gpus=gpus,
        base_dir=os.path.dirname(os.path.abspath(source)),
        server=server,
        command=command,
    )


def default_node(
    *,
    visible_gpus: Visible = None,
    gpus: int | None = None,
    server: str | None = None,
    command: str | None = None,
) -> NodeConfig:
    """The node `rsgw node` runs without a file: `DEFAULT_NODE_TEMPLATE`.

    A server of its own gets no `metrics_base_port` from the template: its own default
    applies (and so do its REST ports).
    """
    raw = dict(DEFAULT_NODE_TEMPLATE)
    return parse_node(
        raw,
        source="<default node>",
        visible_gpus=visible_gpus,
        gpus=gpus,
        server=server,
        command=command,
    )
