"""Which server a node runs on each GPU: rsgw's simulated worker, a preset, or any command.

Pure apart from `repository_models` listing a model repository's folders (as
`load_node` reads its file). A node on a real GPU box runs one inference server per
GPU (issue 50): a single Triton loads a model on every GPU its instance groups name,
so placing models per GPU (lpt_packing) needs one server per GPU. Whatever the server,
the node supervises it the same way: it fills the worker's placeholders into the
command, gives it its GPU in `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES`, waits
for its own ServerReady over gRPC, and tells the gateway where it listens.

The node file's `server:` is one of
- `rsgw` (the default): rsgw's simulated worker, as `rsgw.node._supervision.worker_command`
  builds it;
- `triton` / `mlserver`: a preset command (`PRESETS`), plus the block's `args`;
- a mapping `{command: ...}`: any KServe V2 server, its argv a list or a shell-like string.

A mapping may also set `preset`, `args`, `env` (added to every worker's environment;
a worker's own `env:` goes on top), `startup_seconds` (how long the first start may
take to answer ServerReady: Triton can load for minutes) and `work_dir` (where each
worker gets a folder of its own, `{workdir}`). Every string of the command, the args
and the env values may name the placeholders in `PLACEHOLDERS`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import string
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rsgw.base._errors import ConfigError
from rsgw.base._values import show

RSGW = "rsgw"
TRITON = "triton"
MLSERVER = "mlserver"
COMMAND = "command"
SERVER_KINDS = (RSGW, TRITON, MLSERVER, COMMAND)

#: What `{...}` may name in a worker's command, args and env values.
PLACEHOLDERS = (
    "name",
    "index",
    "gpu",
    "cuda_visible_devices",
    "host",
    "grpc_port",
    "http_port",
    "metrics_port",
    "workdir",
    "model_repo",
)
#: A server of its own (not rsgw's worker) serves REST here + i unless told otherwise.
DEFAULT_HTTP_BASE_PORT = 8180
#: Triton loading large models on a cold GPU takes minutes; a server that is not ready
#: after this on its first start is a failure the node reports and exits on.
DEFAULT_STARTUP_SECONDS = 600.0
_SERVER_KEYS = ("preset", "command", "args", "env", "startup_seconds", "work_dir")

#: The presets' commands. Triton in explicit model control mode: under lpt_packing the
#: gateway loads each model only on the GPUs its placement names (`repository.models`);
#: otherwise `--load-model=*` loads the whole repository at start, as a plain Triton does.
PRESETS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        TRITON: (
            "tritonserver",
            "--model-repository={model_repo}",
            "--model-control-mode=explicit",
            "--grpc-address={host}",
            "--grpc-port={grpc_port}",
            "--http-address={host}",
            "--http-port={http_port}",
            "--allow-metrics=true",
            "--metrics-address={host}",
            "--metrics-port={metrics_port}",
        ),
        # MLServer reads its ports from the environment (`preset_environment`): the
        # repository's settings.json stays the operator's, shared by every worker.
        MLSERVER: ("mlserver", "start", "{model_repo}"),
    }
)
TRITON_LOAD_ALL = "--load-model=*"


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """What serves each GPU of the node, as the node file's `server:` says."""

    kind: str = RSGW
    # `command`: the argv template; a preset: its `PRESETS` entry.
    command: tuple[str, ...] = ()
    # Appended to a preset's command (or a command's).
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    startup_seconds: float = DEFAULT_STARTUP_SECONDS
    # None: a folder under the system's temporary directory, chosen at start-up.
    work_dir: str | None = None

    @property
    def external(self) -> bool:
        """Whether the node runs a server of its own (not rsgw's simulated worker)."""
        return self.kind != RSGW


def _check_template(text: str, where: str) -> str:
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc} in {text!r} (write {{{{ and }}}} for braces)") from None
    for name in names:
        if name not in PLACEHOLDERS:
            raise ConfigError(
                f"{where} names an unknown placeholder {{{name}}} in {text!r} "
                f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})"
            )
    return text


def _argv(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            parts = shlex.split(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc} in {value!r}") from None
    elif isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        parts = [str(v) for v in value]
    else:
        raise ConfigError(f"{where} must be a command line or a list of strings, got {show(value)}")
    return tuple(_check_template(p, where) for p in parts)


def parse_env(value: object, where: str) -> Mapping[str, str]:
    """An `env:` block: variable names to string values (numbers are written out)."""
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where} must be a mapping of variable names to values, got {show(value)}"
        )
    env: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key or "=" in key:
            raise ConfigError(f"{where} keys must be variable names, got {show(key)}")
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise ConfigError(f"{where}.{key} must be a string or a number, got {show(item)}")
        env[key] = _check_template(str(item), f"{where}.{key}")
    return MappingProxyType(env)


def parse_server(value: object) -> ServerSpec:
    """The node file's `server:` (None: rsgw's simulated worker).

    Raises:
        ConfigError: an unknown preset or key, a command that is not a command line, an
            unknown placeholder, a bad environment or start-up timeout.
    """
    if value is None:
        return ServerSpec()
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"server must be one of {', '.join(SERVER_KINDS[:3])} or a mapping with a "
            f"command, got {show(value)}"
        )
    return _server_block(value)


def _server_block(block: Mapping[Hashable, Any]) -> ServerSpec:
    for key in block:
        if key not in _SERVER_KEYS:
            raise ConfigError(f"server: unknown key {show(key)} (known: {', '.join(_SERVER_KEYS)})")
    preset, command = block.get("preset"), block.get("command")
    if preset is not None and command is not None:
        raise ConfigError("server: give a preset or a command, not both")
    if command is not None:
        kind, argv = COMMAND, _argv(command, "server.command")
        if not argv:
            raise ConfigError("server.command is empty")
    else:
        preset = RSGW if preset is None else preset
        if not isinstance(preset, str) or preset.strip().lower() not in SERVER_KINDS[:3]:
            raise ConfigError(
                f"server must be one of {', '.join(SERVER_KINDS[:3])} or a mapping with a "
                f"command, got {show(preset)}"
            )
        kind = preset.strip().lower()
        argv = PRESETS.get(kind, ())
    args = () if block.get("args") is None else _argv(block["args"], "server.args")
    if kind == RSGW and (args or block.get("env") is not None):
        raise ConfigError("server.args and server.env are for a server of its own, not rsgw's")
    startup = block.get("startup_seconds", DEFAULT_STARTUP_SECONDS)
    if isinstance(startup, bool) or not isinstance(startup, int | float) or not startup > 0:
        raise ConfigError(f"server.startup_seconds must be seconds > 0, got {show(startup)}")
    work_dir = block.get("work_dir")
    if work_dir is not None and (not isinstance(work_dir, str) or not work_dir.strip()):
        raise ConfigError(f"server.work_dir must be a folder's path, got {show(work_dir)}")
    return ServerSpec(
        kind=kind,
        command=argv,
        args=args,
        env=parse_env(block.get("env"), "server.env"),
        startup_seconds=float(startup) if math.isfinite(startup) else math.inf,
        work_dir=None if work_dir is None else work_dir.strip(),
    )


def server_from_flags(
    current: ServerSpec, *, server: str | None, command: str | None
) -> ServerSpec:
    """The node file's server with `rsgw node --server` / `--command` on top.

    A flag replaces what runs; the block's env, start-up timeout and work dir stay,
    its args only with the same preset.

    Raises:
        ConfigError: both flags, or a command that is not a command line.
    """
    if server is not None and command is not None:
        raise ConfigError("--server and --command name what to run twice; give one")
    if command is not None:
        return dataclasses.replace(
            current, kind=COMMAND, command=_argv(command, "--command"), args=()
        )
    if server is not None and server != current.kind:
        return dataclasses.replace(current, kind=server, command=PRESETS.get(server, ()), args=())
    return current


# ---------------------------------------------------------------------------
# One worker's command line and environment.


def fill(template: str, values: Mapping[str, object]) -> str:
    """`template` with its placeholders filled (`_check_template` vetted their names)."""
    return template.format_map(values)


def server_argv(server: ServerSpec, values: Mapping[str, object], *, load_all: bool) -> list[str]:
    """The worker's command line: the server's command and args, placeholders filled.

    Args:
        server: the node's server (not `rsgw`).
        values: the worker's placeholder values (`placeholder_values`).
        load_all: the gateway does not place models on its own, so a Triton in explicit
            model control mode must load its whole repository at start.
    """
    argv = [fill(part, values) for part in (*server.command, *server.args)]
    if server.kind == TRITON and load_all and not any(a.startswith("--load-model") for a in argv):
        argv.append(TRITON_LOAD_ALL)
    return argv


def preset_environment(
    server: ServerSpec, values: Mapping[str, object], *, load_all: bool = True
) -> dict[str, str]:
    """What a preset sets in its worker's environment: MLServer's ports and host, which
    it reads from `MLSERVER_*` (its settings' environment override), and, when the
    gateway places the models (not `load_all`), no model loaded at start."""
    if server.kind != MLSERVER:
        return {}
    env = {
        "MLSERVER_HOST": str(values["host"]),
        "MLSERVER_GRPC_PORT": str(values["grpc_port"]),
        "MLSERVER_HTTP_PORT": str(values["http_port"]),
        "MLSERVER_METRICS_PORT": str(values["metrics_port"]),
    }
    if not load_all:
        env["MLSERVER_LOAD_MODELS_AT_STARTUP"] = "false"
    return env


def worker_additions(
    server: ServerSpec,
    values: Mapping[str, object],
    own_env: Mapping[str, str],
    *,
    load_all: bool = True,
) -> dict[str, str]:
    """The variables the node adds to one worker's environment, in order of precedence:
    the server's `env`, the worker's own `env`, then its GPU and the preset's ports
    (which the gateway is told about, so an `env:` cannot move them)."""
    out = {k: fill(v, values) for k, v in server.env.items()}
    out |= {k: fill(v, values) for k, v in own_env.items()}
    device = str(values["cuda_visible_devices"])
    out |= {"CUDA_VISIBLE_DEVICES": device, "NVIDIA_VISIBLE_DEVICES": device}
    return out | preset_environment(server, values, load_all=load_all)


def placeholder_values(
    *,
    name: str,
    index: int,
    gpu: int | str,
    device: str,
    host: str,
    grpc_port: int,
    http_port: int | None,
    metrics_port: int | None,
    workdir: str,
    model_repo: str,
) -> dict[str, object]:
    """The values of `PLACEHOLDERS` for one worker."""
    return {
        "name": name,
        "index": index,
        "gpu": gpu,
        "cuda_visible_devices": device,
        "host": host,
        "grpc_port": grpc_port,
        "http_port": "" if http_port is None else http_port,
        "metrics_port": "" if metrics_port is None else metrics_port,
        "workdir": workdir,
        "model_repo": model_repo,
    }


# ---------------------------------------------------------------------------
# The GPUs `nvidia-smi -L` lists.


def listed_gpu_uuids(listing: str) -> tuple[str, ...] | None:
    """The UUIDs of `nvidia-smi -L`'s `GPU n: NAME (UUID: GPU-...)` lines; None when a
    GPU line carries none (an old driver), so the caller counts instead."""
    uuids: list[str] = []
    for line in listing.splitlines():
        if not line.startswith("GPU "):
            continue
        _, found, rest = line.partition("(UUID: ")
        if not found or ")" not in rest:
            return None
        uuids.append(rest.split(")", 1)[0].strip())
    return tuple(uuids)


# ---------------------------------------------------------------------------
# What the gateway in front is told.


def repository_models(kind: str, repo: str) -> tuple[str, ...]:
    """The models of a Triton or MLServer repository, sorted (empty for others, or when
    `repo` is not a folder).

    Triton: each folder of `repo` holding a `config.pbtxt` or a numeric version folder.
    MLServer: each `model-settings.json` under `repo`, named by its `name` or its folder.
    """
    if kind not in (TRITON, MLSERVER) or not os.path.isdir(repo):
        return ()
    names: set[str] = set()
    if kind == TRITON:
        for entry in sorted(os.scandir(repo), key=lambda e: e.name):
            if entry.is_dir() and (
                os.path.isfile(os.path.join(entry.path, "config.pbtxt"))
                or any(p.isdigit() for p in os.listdir(entry.path))
            ):
                names.add(entry.name)
        return tuple(sorted(names))
    for folder, _, files in os.walk(repo):
        if "model-settings.json" in files:
            names.add(_mlserver_name(os.path.join(folder, "model-settings.json"), folder))
    return tuple(sorted(names))


def _mlserver_name(path: str, folder: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError):
        settings = None
    name = settings.get("name") if isinstance(settings, dict) else None
    return name if isinstance(name, str) and name else os.path.basename(folder)


# ---------------------------------------------------------------------------
# The node's one line when a child fails in a way no restart can fix.


def last_line(tail: Sequence[str]) -> str | None:
    """The child's last non-blank output line, or None if it printed nothing."""
    return next((line.strip() for line in reversed(tail) if line.strip()), None)


def _said(tail: Sequence[str]) -> str:
    line = last_line(tail)
    return "it printed nothing" if line is None else f"its last line: {line}"


def exit_failure(child: str, returncode: int, argv: Sequence[str], tail: Sequence[str]) -> str:
    """The node's line for a child that exited with an error before it was ever ready:
    a usage or configuration error that a restart would only repeat.

    The gateway's own line (`rsgw run: FILE: KEY ...`) is passed on in the words of the
    command the operator typed (`rsgw node` adds its own prefix); a worker's names the
    worker, its exit status, its command and what it said last.
    """
    if child == "gateway":
        line = last_line(tail)
        if line is not None and line.startswith("rsgw run: "):
            return f"gateway: {line.removeprefix('rsgw run: ')}"
        return f"gateway exited with status {returncode} before it served; {_said(tail)}"
    return (
        f"worker '{child}' exited with status {returncode} before it was ready "
        f"(command: {shlex.join(argv)}); {_said(tail)}"
    )


def startup_failure(child: str, seconds: float, argv: Sequence[str], tail: Sequence[str]) -> str:
    """The node's line for a worker that did not answer ServerReady in its start-up time."""
    return (
        f"worker '{child}' not ready after {seconds:g} s (server.startup_seconds; "
        f"command: {shlex.join(argv)}); {_said(tail)}"
    )


def check_repository(kind: str, repo: str, source: str) -> None:
    """A preset's model repository must be a folder (the node checks before it starts).

    Raises:
        ConfigError: naming the source, the folder and how to give one.
    """
    if kind in (TRITON, MLSERVER) and not os.path.isdir(repo):
        raise ConfigError(
            f"{source}: model_repo {repo!r} is not a folder; the {kind} server serves a "
            "model repository (model_repo: DIR in the node file, or --models DIR)"
        )


def spawn_failure(child: str, argv: Sequence[str], reason: str) -> str:
    """The node's line for a worker whose command could not be started at all (no such
    program, not executable): `reason` is the system's (`No such file or directory`)."""
    return f"worker '{child}' could not be started (command: {shlex.join(argv)}): {reason}"
