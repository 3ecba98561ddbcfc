"""The node supervisor (`rsgw node`): one OS process per worker, and the gateway in front.

Theory of operation (docs/product.md §6, docs/original.md §8.5). Every child is a `Child`
(`rsgw.node._children`): a task that starts its process, relays its output line by line
to our stderr behind a `[worker0] ` / `[gateway] ` prefix, waits for it to exit and starts
it again after a backoff that doubles from 1 s to 30 s (and starts over once a run lasted
a minute). Start-up goes in dependency order:

1. Every worker starts at once. We wait for each one's "worker serving" line: without a
   bound for a worker whose node-file port is 0 (the gateway cannot be told where it
   is before then), for at most `DEFAULT_WORKER_START_WAIT` otherwise (the gateway
   probes late workers itself, so one broken worker must not keep the node down).
2. With two workers or more, the gateway starts with `gateway_environment(...)`: the
   workers' bound ports, names and limits, and an infinite startup wait.
3. Once the public endpoint serves (the gateway's "gateway serving" line, or the sole
   worker's), we log "node serving" with the public ports and every pid, and hand out
   a `RunningNode`.

Invariants:
- A port picked at start-up (port 0) is pinned: a restarted child binds the port its
  first run got, so the gateway's worker list and a client's target stay valid.
- A child process never outlives its task: leaving its `_run_once` by any route (exit,
  cancellation, error) stops the process, SIGTERM then SIGKILL after
  `DEFAULT_STOP_GRACE`, shielded and bounded, so on SIGTERM or Ctrl-C every child is
  gone and every port free within docs/product.md §6's 5 s. All children stop in parallel.
- Children share our process group (no new session), so Ctrl-C in a terminal reaches
  them too and they stop on their own; our SIGTERM is then a no-op.

A server of its own (`server: triton`, `mlserver` or a command; `rsgw.node._servers`)
runs as `rsgw.node._plan` lays it out: its ports picked free here when
the node file says 0 (it cannot report what it bound), ready when its own ServerReady
says so, and always behind the gateway, even on one GPU, so the public ports stay
rsgw's. The gateway's configuration is checked here, before any process starts: a bad
value in `--config` is one line, not a gateway restarting forever. A child that exits
with an error before it was ever ready ends the node with one line (`ChildFailed`).

A single rsgw worker runs no gateway: its worker binds the public addresses itself
(`REACTANT_GATEWAY_LISTEN_GRPC` / `_METRICS`, default 0.0.0.0:8001 / 0.0.0.0:8002), so a
client's endpoint does not change between one GPU and eight. Its node-file host and
ports are not used (they are the internal ports behind a gateway); `rsgw probe` knows
this (`probe_address`).

What to run is decided in `rsgw.node._supervision` and `rsgw.node._plan` (pure);
`rsgw.node._children` runs each process and this module the node.

Not done: a single worker ignores `listen:` in a mounted gateway.yml (only the
environment is read); the rest of a worker's node-file settings is not passed to
`rsgw worker`, which has no flags for it.
If the supervisor itself is SIGKILLed its children live on: Linux would need
PR_SET_PDEATHSIG in a `preexec_fn`, which is unsafe in a threaded parent. In a container
the supervisor is PID 1 and its children die with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from rsgw.base._errors import ListenError
from rsgw.config._blocks import DEFAULT_SHUTDOWN_GRACE_SECONDS
from rsgw.node._children import (
    DEFAULT_STOP_GRACE,
    GATEWAY,
    Child,
    CommandChild,
    GatewayChild,
    WorkerChild,
)
from rsgw.node._node import NodeConfig, WorkerSpec
from rsgw.node._plan import (
    LPT_PACKING,
    GatewayRun,
    ServerRun,
    check_gateway,
    external_layout,
    layout,
    plan_text,
    scheduling_mode,
)
from rsgw.node._probe import repack_after_return
from rsgw.node._supervision import (
    Backoff,
    drain_grace,
    gateway_environment,
)
from rsgw.runtime._logging import resolve_format
from rsgw.runtime._net import bind_tcp

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)

# A draining child is SIGKILLed this long after its own grace has passed.
_DRAIN_MARGIN = 5.0
DEFAULT_DRAIN_GRACE = DEFAULT_SHUTDOWN_GRACE_SECONDS
# How long start-up waits for a worker with a fixed port before starting the gateway.
DEFAULT_WORKER_START_WAIT = 30.0


def _write_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


@dataclass(eq=False)
class RunningNode:
    """A serving node: its public ports and a live view of its processes."""

    node: NodeConfig
    # The public endpoint: the gateway's, or the sole worker's.
    grpc_port: int
    metrics_port: int | None
    _children: dict[str, Child]
    _cancel_scope: trio.CancelScope
    _stopped: trio.Event
    #: Seconds the public child gets to drain on `aclose()` (the gateway's
    #: `shutdown.grace_seconds` as the node's environment sets it).
    drain_grace: float = DEFAULT_DRAIN_GRACE

    @property
    def http_port(self) -> int | None:
        """The public REST port (the gateway's; None without a gateway)."""
        gateway = self._children.get(GATEWAY)
        return None if gateway is None else gateway.http_port

    @property
    def has_gateway(self) -> bool:
        return GATEWAY in self._children

    def pids(self) -> dict[str, int | None]:
        """Each child's current pid (None while it waits to be restarted)."""
        return {name: child.pid for name, child in self._children.items()}

    def starts(self) -> dict[str, int]:
        """How many times each child was started (1 until its first restart)."""
        return {name: child.starts for name, child in self._children.items()}

    def worker_ports(self) -> dict[str, tuple[int | None, int | None]]:
        """Each worker's bound (gRPC, metrics) ports."""
        return {
            name: (child.grpc_port, child.metrics_port)
            for name, child in self._children.items()
            if name != GATEWAY
        }

    def reload(self) -> None:
        """Pass SIGHUP on to every child: each reads its certificates (and tokens) again."""
        for child in self._children.values():
            if child.process is not None and child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGHUP)

    async def aclose(self) -> None:
        """Drain, then stop the node; returns once every child is gone.

        The gateway goes first: it drains (SIGTERM; calls in flight get its
        `shutdown.grace_seconds`) while its workers still serve those calls, and is
        killed only `_DRAIN_MARGIN` seconds after its grace. Then every worker stops
        as on cancellation (within about 5 s). A single-worker node drains its worker
        the same way.
        """
        public = self._children.get(GATEWAY) or next(iter(self._children.values()))
        logger.info("node stopping", extra={"drain_grace_s": self.drain_grace})
        await public.retire(self.drain_grace + _DRAIN_MARGIN)
        self._cancel_scope.cancel()
        await self._stopped.wait()


def _check_free(addresses: list[tuple[str, int]]) -> None:
    """Fail now, in one line, if a fixed port is taken: a restart loop would not fix it.

    Racy by nature (the port is free again until the child binds it), but it turns the
    common mistake, a second node or another server on the same ports, into an exit
    instead of a child restarting every 30 s.

    Raises:
        ListenError: an address cannot be bound ("address already in use").
    """
    for host, port in addresses:
        try:
            bind_tcp(host, port, backlog=1).close()
        except ListenError as exc:
            raise ListenError(
                f"{exc} (another rsgw node running? the node's ports: the node file's "
                "base_port and metrics_base_port, and REACTANT_GATEWAY_LISTEN_GRPC, _HTTP "
                "and _METRICS for the gateway's)"
            ) from exc


async def _wait_serving(child: Child, bound: float) -> None:
    with trio.move_on_after(bound):
        await child.serving.wait()
        return
    logger.warning(
        "worker not serving yet; starting the gateway anyway",
        extra={"child": child.name, "waited_s": bound},
    )


async def serve_node(
    node: NodeConfig,
    *,
    env: Mapping[str, str] = os.environ,
    log_level: str = "info",
    log_format: str = "auto",
    sink: Callable[[str], None] = _write_stderr,
    backoff: Callable[[], Backoff] = Backoff,
    stop_grace: float = DEFAULT_STOP_GRACE,
    worker_start_wait: float = DEFAULT_WORKER_START_WAIT,
    task_status: trio.TaskStatus[RunningNode] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the node's workers and, for two or more, the gateway, until cancelled.

    Returns only after `RunningNode.aclose()`, once every child is gone.

    Args:
        node: the validated node (`load_node` / `default_node`).
        env: the environment children inherit; also read for `REACTANT_GATEWAY_LISTEN_*`
            and whether a gateway.yml is mounted.
        log_level, log_format: what children log with (the gateway only where `env`
            does not say). `auto`, in `log_format` or the environment, is resolved
            here, against our stderr: the children's own stderr is a pipe to us.
        sink: where relayed child output goes, one prefixed line per call (our stderr).
        backoff: makes each child's restart policy.
        stop_grace: seconds between SIGTERM and SIGKILL when stopping a child.
        worker_start_wait: how long start-up waits for a fixed-port worker.

    Raises:
        ConfigError: a bad public address, `REACTANT_GATEWAY_FILE` names no file, or the
            gateway would refuse its configuration (`gateway: ...`).
        ListenError: a fixed port (a worker's, or the public ones) is already taken.
        These are raised before any process starts.
        ChildFailed: a child exited with an error before it was ever ready, could not be
            started, or (a server of its own) was not ready within its start-up time;
            every other child is stopped first.

    Cancellation:
        Every child is stopped (SIGTERM, SIGKILL after `stop_grace`) in parallel,
        shielded, before this returns; nothing is left running.

    Error handling:
        A child that exits after it was ready, or dies of a signal, is restarted after
        its backoff; the exit is logged with its return code and last line.
    """
    for note in node.notes:
        logger.warning(note)
    log_format = resolve_format(log_format)
    logging_flags = ["--log-level", log_level, "--log-format", log_format]
    specs, gateway_yml = _plan(node, env)
    logs = (log_level, log_format)
    workers, front = _worker_children(
        node, env, specs, gateway_yml, logs, logging_flags, sink, stop_grace
    )
    children: dict[str, Child] = {w.name: w for w in workers}
    stopped = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(worker.supervise, backoff())
            async with trio.open_nursery() as waits:
                for worker in workers:
                    later = isinstance(worker, WorkerChild) and worker.spec.port == 0
                    bound = math.inf if later else worker_start_wait
                    waits.start_soon(_wait_serving, worker, bound)
            public: Child = workers[0]
            if front is not None or len(node.workers) > 1:
                gateway_env = (
                    front.env
                    if front is not None
                    else _gateway_env(node, env, gateway_yml, workers, logs)
                )
                public = children[GATEWAY] = GatewayChild(dict(gateway_env), sink, stop_grace)
                nursery.start_soon(public.supervise, backoff())
                if front is not None and scheduling_mode(env, gateway_yml) == LPT_PACKING:
                    _repack_on_return(workers, public, env)
            await public.serving.wait()
            assert public.grpc_port is not None
            running = RunningNode(
                node,
                public.grpc_port,
                public.metrics_port,
                children,
                nursery.cancel_scope,
                stopped,
                drain_grace(env),
            )
            _log_serving(running, workers)
            task_status.started(running)
            await trio.sleep_forever()
    finally:
        if node.server.external and node.server.work_dir is None and workers[0].cwd:
            # The folder we made for this run's workers (their children are gone).
            shutil.rmtree(os.path.dirname(workers[0].cwd), ignore_errors=True)
        stopped.set()
        logger.info("node stopped")


def _worker_children(
    node: NodeConfig,
    env: Mapping[str, str],
    specs: list[WorkerSpec],
    gateway_yml: Mapping[Any, Any] | None,
    logs: tuple[str, str],
    logging_flags: list[str],
    sink: Callable[[str], None],
    stop_grace: float,
) -> tuple[list[Child], GatewayRun | None]:
    """The workers to run, and for servers of their own the gateway in front (checked
    before any process starts, as rsgw's workers' gateway is)."""
    if node.server.external:
        runs, front = _external(node, env, specs, gateway_yml, logs)
        return [_command_child(run, node, env, sink, stop_grace) for run in runs], front
    check_gateway(node, env, specs, gateway_yml, logs)
    workers: list[Child] = [
        WorkerChild(s, node, env, logging_flags, sink, stop_grace) for s in specs
    ]
    return workers, None


def _repack_on_return(workers: list[Child], gateway: Child, env: Mapping[str, str]) -> None:
    """A server back from a restart is empty: the gateway places on it again."""
    for worker in workers:
        worker.on_return = partial(repack_after_return, gateway, env)


def _gateway_env(
    node: NodeConfig,
    env: Mapping[str, str],
    gateway_yml: Mapping[Any, Any] | None,
    workers: list[Child],
    logging: tuple[str, str],
) -> dict[str, str]:
    """The environment of the gateway in front of rsgw's workers, their ports bound."""
    specs = [w.spec for w in workers if isinstance(w, WorkerChild)]
    return gateway_environment(node, env, gateway_yml=gateway_yml, workers=specs, logging=logging)


def _plan(
    node: NodeConfig, env: Mapping[str, str]
) -> tuple[list[WorkerSpec], Mapping[Any, Any] | None]:
    """`layout`, logged, once every fixed port is free.

    Raises:
        ConfigError: a bad public address, or `REACTANT_GATEWAY_FILE` names no file.
        ListenError: a fixed port is already taken.
    """
    laid = layout(node, env)
    if laid.split_hosts:
        logger.warning("single worker binds its metrics on the public gRPC host")
    _check_free(laid.addresses)
    return laid.specs, laid.gateway_yml


def _pick_ports(specs: list[WorkerSpec]) -> list[WorkerSpec]:
    """`specs` with every port 0 replaced by a free one: a server of its own cannot say
    which port it bound. All are held open until all are picked, so none repeats."""
    held = []
    try:
        picked = []
        for spec in specs:
            ports = []
            for port in (spec.port, spec.http_port, spec.metrics_port):
                if port == 0:
                    held.append(bind_tcp(spec.host, 0, backlog=1))
                    port = int(held[-1].getsockname()[1])
                ports.append(port)
            grpc, http, metrics = ports
            assert grpc is not None
            picked.append(
                dataclasses.replace(spec, port=grpc, http_port=http, metrics_port=metrics)
            )
        return picked
    finally:
        for sock in held:
            sock.close()


def _external(
    node: NodeConfig,
    env: Mapping[str, str],
    specs: list[WorkerSpec],
    gateway_yml: Mapping[Any, Any] | None,
    logging: tuple[str, str],
) -> tuple[list[ServerRun], GatewayRun]:
    """`external_layout` on free ports picked now and a new work folder (unless the node
    file names one)."""
    root = node.server.work_dir or tempfile.mkdtemp(prefix="rsgw-node-")
    runs, front = external_layout(
        node, env, _pick_ports(specs), gateway_yml, logging, os.path.abspath(root), sys.executable
    )
    assert front is not None  # every port is picked
    return runs, front


def _command_child(
    run: ServerRun,
    node: NodeConfig,
    env: Mapping[str, str],
    sink: Callable[[str], None],
    stop_grace: float,
) -> CommandChild:
    os.makedirs(run.cwd, exist_ok=True)
    return CommandChild(
        run.spec,
        list(run.argv),
        {**env, **run.additions},
        sink,
        stop_grace,
        cwd=run.cwd,
        startup_seconds=node.server.startup_seconds,
    )


def dry_run(
    node: NodeConfig,
    *,
    env: Mapping[str, str] = os.environ,
    log_level: str = "info",
    log_format: str = "auto",
) -> str:
    """What `serve_node` would run, as `rsgw node --dry-run` prints it (`plan_text`);
    nothing starts, and busy ports are not checked: what runs now need not be what will.

    Raises:
        ConfigError: as `serve_node` would before its first process.
    """
    logging_pair = (log_level, resolve_format(log_format))
    root = os.path.join(tempfile.gettempdir(), "rsgw-node-XXXXXX")  # made at start-up
    return plan_text(node, env, logging_pair, sys.executable, root)


def _log_serving(running: RunningNode, workers: list[Child]) -> None:
    pids = running.pids()
    logger.info(
        "node serving",
        extra={
            "grpc_port": running.grpc_port,
            "metrics_port": running.metrics_port,
            "http_port": running.http_port,
            "gateway_pid": pids.get(GATEWAY),
            "workers": {
                w.name: {
                    "pid": w.pid,
                    "grpc_port": w.grpc_port,
                    "metrics_port": w.metrics_port,
                    "http_port": w.http_port,
                }
                for w in workers
            },
            "gpus": [str(g) for g in running.node.gpus],
        },
    )
