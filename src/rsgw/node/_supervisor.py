"""The node supervisor (`rsgw node`): one OS process per worker, and the gateway in front.

Theory of operation (docs/product.md §6, docs/original.md §8.5). Every child is a `_Child`: a
task that starts its process, relays its output line by line to our stderr behind a
`[worker0] ` / `[gateway] ` prefix, waits for it to exit and starts it again after a
backoff that doubles from 1 s to 30 s (and starts over once a run lasted a minute).
Start-up goes in dependency order:

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
- A child process never outlives its task: leaving `_run_once` by any route (exit,
  cancellation, error) stops the process, SIGTERM then SIGKILL after
  `DEFAULT_STOP_GRACE`, shielded and bounded, so on SIGTERM or Ctrl-C every child is
  gone and every port free within docs/product.md §6's 5 s. All children stop in parallel.
- Children share our process group (no new session), so Ctrl-C in a terminal reaches
  them too and they stop on their own; our SIGTERM is then a no-op.

A single-worker node runs no gateway: its worker binds the public addresses itself
(`REACTANT_GATEWAY_LISTEN_GRPC` / `_METRICS`, default 0.0.0.0:8001 / 0.0.0.0:8002), so a
client's endpoint does not change between one GPU and eight. Its node-file host and
ports are not used (they are the internal ports behind a gateway); `rsgw probe` knows
this (`probe_address`).

What to run is decided in `rsgw.node._supervision` (pure: backoff, GPUs, addresses, command
and log lines); this module runs it. Of a worker's node-file settings we pass on
`scheduler.discipline` (`--discipline`), `memory.weight_cache_bytes`
(`--weight-cache-bytes`) and the node's `models:` residency (`--pin`).

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
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import trio

from rsgw._blocks import DEFAULT_SHUTDOWN_GRACE_SECONDS
from rsgw._config import env_name, find_config_file
from rsgw._net import bind_tcp, split_host_port
from rsgw.node._node import NodeConfig, WorkerSpec
from rsgw.node._supervision import (
    Backoff,
    cuda_device,
    drain_grace,
    gateway_command,
    gateway_environment,
    parse_serving,
    pinned_gateway_env,
    public_addresses,
    sole_worker,
    worker_command,
)

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)

# SIGTERM to SIGKILL. With `_KILL_WAIT` after it this stays inside docs/product.md §6's 5 s.
DEFAULT_STOP_GRACE = 3.0
# A draining child is SIGKILLed this long after its own grace has passed.
_DRAIN_MARGIN = 5.0
DEFAULT_DRAIN_GRACE = DEFAULT_SHUTDOWN_GRACE_SECONDS
_KILL_WAIT = 1.0
# How long start-up waits for a worker with a fixed port before starting the gateway.
DEFAULT_WORKER_START_WAIT = 30.0
# How long we keep relaying a child's output after it exited (a grandchild may hold the
# pipe open; ours never fork, so this is only a bound).
_RELAY_DRAIN_SECONDS = 1.0
# A line longer than this is relayed in pieces rather than buffered without limit.
_MAX_LINE_BYTES = 65536

GATEWAY = "gateway"


def _write_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


# ---------------------------------------------------------------------------
# The Trio shell: one task per child process.


async def _stop_process(process: trio.Process, grace: float) -> bool:
    """SIGTERM, wait up to `grace`, then SIGKILL; bounded. Call it shielded.

    Returns whether the process was still running (False: it had exited already).
    """
    if process.poll() is not None:
        return False
    process.terminate()
    with trio.move_on_after(grace):
        await process.wait()
        return True
    logger.warning("process ignored SIGTERM; killing it", extra={"pid": process.pid})
    process.kill()
    with trio.move_on_after(_KILL_WAIT):
        await process.wait()
    return True


class _Child:
    """One supervised process: started, relayed, restarted. Subclasses say what to run."""

    serving_event = ""

    def __init__(self, name: str, sink: Callable[[str], None], stop_grace: float) -> None:
        self.name = name
        self.process: trio.Process | None = None
        self.starts = 0
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        # Set by the first serving line; restarts keep it set.
        self.serving = trio.Event()
        self._prefix = f"[{name}] "
        self._sink = sink
        self._stop_grace = stop_grace
        self._retired = False

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        raise NotImplementedError

    def pin(self, grpc_port: int, metrics_port: int | None) -> None:
        """The child reported its bound ports; make restarts bind the same ones."""

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    async def supervise(self, backoff: Backoff) -> NoReturn:
        """Run the child forever, restarting it after `backoff` whenever it exits."""
        while True:
            started = trio.current_time()
            pid, returncode = await self._run_once()
            if self._retired:
                await trio.sleep_forever()
            delay = backoff.after_exit(trio.current_time() - started)
            logger.warning(
                "process exited; restarting",
                extra={
                    "child": self.name,
                    "pid": pid,
                    "returncode": returncode,
                    "ran_s": round(trio.current_time() - started, 3),
                    "restart_in_s": delay,
                },
            )
            await trio.sleep(delay)

    async def retire(self, grace: float) -> None:
        """Stop the child for good: SIGTERM, `grace` seconds to drain and exit, then SIGKILL."""
        self._retired = True
        if self.process is not None:
            with trio.CancelScope(shield=True):
                await _stop_process(self.process, grace)

    async def _run_once(self) -> tuple[int, int]:
        process = await trio.lowlevel.open_process(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=False,
        )
        # No checkpoint between the spawn and this `try`: the process cannot leak.
        try:
            self.process = process
            self.starts += 1
            logger.info(
                "process started",
                extra={"child": self.name, "pid": process.pid, "start": self.starts},
            )
            # Shielded, so a child's last lines are relayed during shutdown too; bounded
            # once the child is gone.
            relay_scope = trio.CancelScope(shield=True)
            async with trio.open_nursery() as nursery:
                assert process.stdout is not None
                nursery.start_soon(self._relay, process.stdout, relay_scope)
                try:
                    await process.wait()
                finally:
                    with trio.CancelScope(shield=True):
                        if await _stop_process(process, self._stop_grace):
                            logger.info(
                                "process stopped",
                                extra={
                                    "child": self.name,
                                    "pid": process.pid,
                                    "returncode": process.returncode,
                                },
                            )
                    relay_scope.deadline = trio.current_time() + _RELAY_DRAIN_SECONDS
        finally:
            # Also reached when the relay failed; a no-op once the process has exited.
            with trio.CancelScope(shield=True):
                await _stop_process(process, self._stop_grace)
            if process.returncode is not None:
                self.process = None
        assert process.returncode is not None
        return process.pid, process.returncode

    async def _relay(self, stream: trio.abc.ReceiveStream, scope: trio.CancelScope) -> None:
        with scope:
            async with stream:
                pending = b""
                while chunk := await stream.receive_some():
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        self._line(line)
                    if len(pending) > _MAX_LINE_BYTES:
                        self._line(pending)
                        pending = b""
                if pending:
                    self._line(pending)

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        self._sink(self._prefix + text + "\n")
        ports = parse_serving(text, self.serving_event)
        if ports is not None:
            self.grpc_port, self.metrics_port = ports
            self.pin(*ports)
            self.serving.set()


class _WorkerChild(_Child):
    serving_event = "worker serving"

    def __init__(
        self,
        spec: WorkerSpec,
        node: NodeConfig,
        env: Mapping[str, str],
        logging_flags: list[str],
        sink: Callable[[str], None],
        stop_grace: float,
    ) -> None:
        super().__init__(spec.name, sink, stop_grace)
        self.spec = spec
        self._node = node
        self._env = dict(env)
        self._env["CUDA_VISIBLE_DEVICES"] = cuda_device(spec.gpu, env)
        self._logging_flags = logging_flags

    def command(self) -> list[str]:
        return worker_command(
            self.spec,
            self._node,
            device=self._env["CUDA_VISIBLE_DEVICES"],
            logging_flags=self._logging_flags,
            executable=sys.executable,
        )

    def environment(self) -> dict[str, str]:
        return self._env

    def pin(self, grpc_port: int, metrics_port: int | None) -> None:
        self.spec = dataclasses.replace(self.spec, port=grpc_port, metrics_port=metrics_port)


class _GatewayChild(_Child):
    serving_event = "gateway serving"

    def __init__(self, env: dict[str, str], sink: Callable[[str], None], grace: float) -> None:
        super().__init__(GATEWAY, sink, grace)
        self._env = env

    def command(self) -> list[str]:
        return gateway_command(sys.executable)

    def environment(self) -> dict[str, str]:
        return self._env

    def pin(self, grpc_port: int, metrics_port: int | None) -> None:
        self._env = pinned_gateway_env(self._env, grpc_port, metrics_port)


@dataclass(eq=False)
class RunningNode:
    """A serving node: its public ports and a live view of its processes."""

    node: NodeConfig
    # The public endpoint: the gateway's, or the sole worker's.
    grpc_port: int
    metrics_port: int | None
    _children: dict[str, _Child]
    _cancel_scope: trio.CancelScope
    _stopped: trio.Event
    #: Seconds the public child gets to drain on `aclose()` (the gateway's
    #: `shutdown.grace_seconds` as the node's environment sets it).
    drain_grace: float = DEFAULT_DRAIN_GRACE

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
        bind_tcp(host, port, backlog=1).close()


async def _wait_serving(child: _Child, bound: float) -> None:
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
    log_format: str = "json",
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
            does not say).
        sink: where relayed child output goes, one prefixed line per call (our stderr).
        backoff: makes each child's restart policy.
        stop_grace: seconds between SIGTERM and SIGKILL when stopping a child.
        worker_start_wait: how long start-up waits for a fixed-port worker.

    Raises:
        ConfigError: a bad public address, or `REACTANT_GATEWAY_FILE` names no file.
        ListenError: a fixed port (a worker's, or the public ones) is already taken.
        Both are raised before any process starts.

    Cancellation:
        Every child is stopped (SIGTERM, SIGKILL after `stop_grace`) in parallel,
        shielded, before this returns; nothing is left running.

    Error handling:
        A child that exits, for any reason, is restarted after its backoff; the exit
        is logged with its return code. Its own output says why.
    """
    for note in node.notes:
        logger.warning(note)
    logging_flags = ["--log-level", log_level, "--log-format", log_format]
    grpc, metrics = public_addresses(env)
    yml_mounted = False
    gateway_env: dict[str, str] | None = None
    if len(node.workers) == 1:
        specs = [sole_worker(node, env)]
        if split_host_port(grpc)[0] != split_host_port(metrics)[0]:
            logger.warning(
                "single worker binds its metrics on the public gRPC host",
                extra={"grpc": grpc, "metrics": metrics},
            )
        public_ports: list[tuple[str, int]] = []
    else:
        specs = list(node.workers)
        yml_mounted = find_config_file(env) is not None
        # With a gateway.yml the gateway's listen addresses are its own business.
        public_ports = [] if yml_mounted else [split_host_port(grpc), split_host_port(metrics)]
        gateway_env = dict(env)
        gateway_env.setdefault(env_name("logging.level"), log_level)
        gateway_env.setdefault(env_name("logging.format"), log_format)
    _check_free(public_ports + [(s.host, p) for s in specs for p in (s.port, s.metrics_port) if p])
    workers = [_WorkerChild(s, node, env, logging_flags, sink, stop_grace) for s in specs]
    children: dict[str, _Child] = {w.name: w for w in workers}
    stopped = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(worker.supervise, backoff())
            async with trio.open_nursery() as waits:
                for worker in workers:
                    bound = math.inf if worker.spec.port == 0 else worker_start_wait
                    waits.start_soon(_wait_serving, worker, bound)
            public: _Child = workers[0]
            if gateway_env is not None:
                gateway_env = gateway_environment(
                    node,
                    gateway_env,
                    gateway_yml_mounted=yml_mounted,
                    workers=[w.spec for w in workers],
                )
                public = children[GATEWAY] = _GatewayChild(gateway_env, sink, stop_grace)
                nursery.start_soon(public.supervise, backoff())
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
        stopped.set()
        logger.info("node stopped")


def _log_serving(running: RunningNode, workers: list[_WorkerChild]) -> None:
    pids = running.pids()
    logger.info(
        "node serving",
        extra={
            "grpc_port": running.grpc_port,
            "metrics_port": running.metrics_port,
            "gateway_pid": pids.get(GATEWAY),
            "workers": {
                w.name: {"pid": w.pid, "grpc_port": w.grpc_port, "metrics_port": w.metrics_port}
                for w in workers
            },
            "gpus": [str(g) for g in running.node.gpus],
        },
    )
