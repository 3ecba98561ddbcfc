"""What a node will run: each child's command line, environment and folder (pure).

`rsgw node` lays out its children (`ServerRun`, `GatewayRun`) before it starts
anything, from the node, the environment and what the shell (`rsgw.node._supervisor`)
found out: the free ports it picked for a server of its own, the work folder, the
repository's models and the gateway.yml. The supervisor starts that; `rsgw node
--dry-run` prints it (`render_plan`), so an operator sees every command and the
gateway's configuration before anything runs, and both come from the same code.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rsgw.base._errors import ConfigError
from rsgw.base._values import split_host_port
from rsgw.config._blocks import DEFAULT_LISTEN_HTTP, check_listen
from rsgw.config._config import (
    ENV_PREFIX,
    config_file_root,
    env_name,
    find_config_file,
    load_config,
)
from rsgw.node._node import NodeConfig, WorkerSpec
from rsgw.node._servers import (
    placeholder_values,
    repository_models,
    server_argv,
    worker_additions,
)
from rsgw.node._supervision import (
    OPERATOR_VARIABLES,
    cuda_device,
    file_sets,
    file_value,
    gateway_command,
    gateway_environment,
    public_addresses,
    sole_worker,
    worker_command,
)

LPT_PACKING = "lpt_packing"
#: A worker as `render_plan` shows it: name, argv, the variables the node adds, folder.
ShownWorker = tuple[str, Sequence[str], Mapping[str, str], str | None]


@dataclass(frozen=True, slots=True)
class ServerRun:
    """One server of its own as the node starts it."""

    spec: WorkerSpec
    argv: tuple[str, ...]
    # What the node adds to its own environment for this worker (GPU, ports, `env:`).
    additions: Mapping[str, str]
    cwd: str


@dataclass(frozen=True, slots=True)
class GatewayRun:
    """The gateway in front as the node starts it."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    # The variables of `env` the node set (the rest are the operator's own).
    additions: Mapping[str, str]


def scheduling_mode(env: Mapping[str, str], gateway_yml: Mapping[Any, Any] | None) -> str:
    """The gateway's scheduling mode as the environment (which wins) or the file say it."""
    given = env.get(env_name("scheduling.mode"), "").strip() or file_value(
        gateway_yml, "scheduling.mode"
    )
    return str(given or "round_robin").strip().lower()


def handed_models(
    env: Mapping[str, str], gateway_yml: Mapping[Any, Any] | None, models: Sequence[str]
) -> dict[str, str]:
    """`repository.models` for the gateway: under lpt_packing, the repository's models,
    so it loads each only on the workers its placement names; nothing when the operator
    set the key (environment or file) or another mode runs."""
    variable = env_name("repository.models")
    if (
        scheduling_mode(env, gateway_yml) != LPT_PACKING
        or not models
        or env.get(variable, "").strip()
        or file_sets(gateway_yml, "repository.models")
    ):
        return {}
    return {variable: ",".join(models)}


def server_runs(
    node: NodeConfig,
    env: Mapping[str, str],
    specs: Sequence[WorkerSpec],
    work_root: str,
    *,
    load_all: bool,
) -> list[ServerRun]:
    """Each worker of a node running a server of its own, its ports already chosen."""
    runs = []
    for index, spec in enumerate(specs):
        device = cuda_device(spec.gpu, env)
        cwd = os.path.join(work_root, spec.name)
        values = placeholder_values(
            name=spec.name,
            index=index,
            gpu=spec.gpu,
            device=device,
            host=spec.host,
            grpc_port=spec.port,
            http_port=spec.http_port,
            metrics_port=spec.metrics_port,
            workdir=cwd,
            model_repo=node.model_repo,
        )
        argv = server_argv(node.server, values, load_all=load_all)
        additions = worker_additions(node.server, values, spec.env, load_all=load_all)
        runs.append(ServerRun(spec, tuple(argv), additions, cwd))
    return runs


def gateway_run(
    node: NodeConfig,
    env: Mapping[str, str],
    specs: Sequence[WorkerSpec],
    *,
    gateway_yml: Mapping[Any, Any] | None,
    logging: tuple[str, str],
    executable: str,
    extra: Mapping[str, str] | None = None,
) -> GatewayRun:
    """The gateway in front of `specs`: `gateway_environment` plus `extra` (the models
    handed to lpt_packing).

    Raises:
        ConfigError: a worker's port is still 0 (see `gateway_environment`).
    """
    full = gateway_environment(
        node, env, gateway_yml=gateway_yml, workers=specs, logging=logging
    ) | dict(extra or {})
    # What the node set: what it changed, and the variables its own flags put in `env`
    # (those the operator's environment did not set, as `rsgw node` lists them).
    operator = env.get(OPERATOR_VARIABLES)
    mine = set() if operator is None else {k for k in env if k.startswith(ENV_PREFIX)}
    mine -= set((operator or "").split(","))
    additions = {
        k: v for k, v in full.items() if k != OPERATOR_VARIABLES and (env.get(k) != v or k in mine)
    }
    return GatewayRun(tuple(gateway_command(executable)), full, additions)


def check_config(gateway_env: Mapping[str, str]) -> None:
    """The gateway's configuration as it will read it, checked now.

    Raises:
        ConfigError: `gateway: ` and the gateway's own one line.
    """
    try:
        load_config(None, gateway_env)
    except ConfigError as exc:
        raise ConfigError(f"gateway: {exc}") from None


def check_gateway(
    node: NodeConfig,
    env: Mapping[str, str],
    specs: list[WorkerSpec],
    gateway_yml: Mapping[Any, Any] | None,
    logging: tuple[str, str],
) -> None:
    """`check_config` for rsgw's workers: those on port 0 stand in with distinct
    placeholder ports (their own are known only once they serve)."""
    if len(specs) < 2:
        return
    count = len(specs)
    stand_ins = [
        dataclasses.replace(
            s,
            port=s.port or i + 1,
            metrics_port=count + i + 1 if s.metrics_port == 0 else s.metrics_port,
        )
        for i, s in enumerate(specs)
    ]
    check_config(
        gateway_environment(node, env, gateway_yml=gateway_yml, workers=stand_ins, logging=logging)
    )


def rsgw_workers(
    node: NodeConfig,
    env: Mapping[str, str],
    specs: Sequence[WorkerSpec],
    logging: tuple[str, str],
    executable: str,
) -> list[ShownWorker]:
    """rsgw's simulated workers as `render_plan` shows them: name, argv, GPU."""
    flags = ["--log-level", logging[0], "--log-format", logging[1]]
    out: list[ShownWorker] = []
    for spec in specs:
        device = cuda_device(spec.gpu, env)
        argv = worker_command(spec, node, device=device, logging_flags=flags, executable=executable)
        out.append((spec.name, argv, {"CUDA_VISIBLE_DEVICES": device}, None))
    return out


def render_plan(
    node: NodeConfig,
    workers: Sequence[ShownWorker],
    gateway: GatewayRun | None,
    notes: Sequence[str] = (),
) -> str:
    """`rsgw node --dry-run`'s text: one shell line per child, as the node would run it.

    Args:
        node: the node.
        workers: each worker's name, argv, the variables the node adds, and its folder.
        gateway: the gateway in front, or None (a single rsgw worker serves itself).
        notes: lines to print first, as comments.
    """
    kind = node.server.kind
    lines = [f"# rsgw node --dry-run: {len(workers)} worker(s), server {kind}; nothing started"]
    lines += [f"# {note}" for note in (*node.notes, *notes)]
    for (name, argv, additions, cwd), spec in zip(workers, node.workers, strict=True):
        lines.append(f"# worker {name} on GPU {spec.gpu}")
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in additions.items())
        command = f"{assigns} {shlex.join(argv)}" if assigns else shlex.join(argv)
        lines.append(f"cd {shlex.quote(cwd)} && {command}" if cwd else command)
    if gateway is not None:
        lines.append("# gateway in front (rsgw run), configured by its environment:")
        for key in sorted(gateway.additions):
            lines.append(f"{key}={shlex.quote(gateway.additions[key])} \\")
        lines.append(shlex.join(gateway.argv))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# The whole node, as the supervisor starts it and `--dry-run` prints it.


@dataclass(frozen=True, slots=True)
class Layout:
    """The workers to start, the gateway.yml the gateway reads, and the fixed addresses
    that must be free before anything starts."""

    specs: list[WorkerSpec]
    gateway_yml: Mapping[Any, Any] | None
    addresses: list[tuple[str, int]]
    # A sole rsgw worker binds its metrics on the public gRPC host, not the one asked.
    split_hosts: bool = False


def layout(node: NodeConfig, env: Mapping[str, str]) -> Layout:
    """The node's `Layout`; the gateway.yml is read now, so a bad file is one line before
    any process starts.

    Raises:
        ConfigError: a bad public address, or `REACTANT_GATEWAY_FILE` names no file.
    """
    grpc, metrics = public_addresses(env)
    gateway_yml: Mapping[Any, Any] | None = None
    public: list[tuple[str, int]] = []
    split = False
    if len(node.workers) == 1 and not node.server.external:
        specs = [sole_worker(node, env)]
        split = split_host_port(grpc)[0] != split_host_port(metrics)[0]
    else:
        specs = list(node.workers)
        yml_path = find_config_file(env)
        gateway_yml = None if yml_path is None else config_file_root(yml_path)
        if gateway_yml is None:  # with a gateway.yml its listen addresses are its own
            http = env.get(env_name("listen.http"), "").strip() or DEFAULT_LISTEN_HTTP
            http = check_listen(http, env_name("listen.http"))
            public = [split_host_port(a) for a in (grpc, metrics, http)]
    fixed = [(s.host, p) for s in specs for p in (s.port, s.metrics_port, s.http_port) if p]
    return Layout(specs, gateway_yml, public + fixed, split)


def external_layout(
    node: NodeConfig,
    env: Mapping[str, str],
    specs: Sequence[WorkerSpec],
    gateway_yml: Mapping[Any, Any] | None,
    logging: tuple[str, str],
    work_root: str,
    executable: str,
) -> tuple[list[ServerRun], GatewayRun | None]:
    """The servers of a node running a server of its own, and the gateway in front, its
    configuration checked (`check_config`); no gateway while a port is still 0.

    Under lpt_packing the repository's models are handed to the gateway to place; a
    Triton then loads nothing at start. Otherwise (or when the operator names the
    models) every Triton loads its whole repository.
    """
    extra = handed_models(env, gateway_yml, repository_models(node.server.kind, node.model_repo))
    runs = server_runs(node, env, specs, work_root, load_all=not extra)
    if any(0 in (s.port, s.http_port, s.metrics_port) for s in specs):
        return runs, None
    front = gateway_run(
        node,
        env,
        specs,
        gateway_yml=gateway_yml,
        logging=logging,
        executable=executable,
        extra=extra,
    )
    check_config(front.env)
    return runs, front


def plan_text(
    node: NodeConfig,
    env: Mapping[str, str],
    logging: tuple[str, str],
    executable: str,
    work_root: str,
) -> str:
    """`rsgw node --dry-run`: `render_plan` of the node's `layout`, ports as the node file
    gives them (0: picked at start-up, so the gateway's list is shown only without), and
    `work_root` where no `server.work_dir` is given.

    Raises:
        ConfigError: as the supervisor would before its first process.
    """
    laid = layout(node, env)
    specs, gateway_yml = laid.specs, laid.gateway_yml
    notes: list[str] = []
    front: GatewayRun | None = None
    if any(s.port == 0 or 0 in (s.metrics_port, s.http_port) for s in specs):
        notes.append("ports of 0 are picked at start-up; the gateway is told them then")
    if node.server.external:
        root = node.server.work_dir or work_root
        runs, front = external_layout(node, env, specs, gateway_yml, logging, root, executable)
        workers: list[ShownWorker] = [(r.spec.name, r.argv, r.additions, r.cwd) for r in runs]
    else:
        check_gateway(node, env, specs, gateway_yml, logging)
        workers = rsgw_workers(node, env, specs, logging, executable)
        if len(specs) > 1 and not notes:
            front = gateway_run(
                node, env, specs, gateway_yml=gateway_yml, logging=logging, executable=executable
            )
    return render_plan(node, workers, front, notes)
