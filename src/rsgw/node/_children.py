"""One supervised child process of a node: started, relayed, restarted, stopped.

`rsgw.node._supervisor` starts a node as a set of these. A `Child` is a task that
starts its process, relays its output line by line to our stderr behind a
`[worker0] ` / `[gateway] ` prefix, waits for it to exit and starts it again after a
backoff (`Backoff`, which doubles from 1 s to 30 s and starts over once a run lasted a
minute). `WorkerChild` and `GatewayChild` say what to run (`rsgw.node._supervision`
builds the command lines and environments, purely) and how a restart keeps the ports
the first run reported; `CommandChild` runs a server of its own (Triton, MLServer, any
command: `rsgw.node._servers`) on ports the node chose, and calls it ready when its
own ServerReady says so.

Invariants:
- A port picked at start-up (port 0) is pinned: a restarted child binds the port its
  first run got, so the gateway's worker list and a client's target stay valid.
- A child process never outlives its task: leaving `_run_once` by any route (exit,
  cancellation, error) stops the process, SIGTERM then SIGKILL after the stop grace
  (`DEFAULT_STOP_GRACE`), shielded and bounded.
- rsgw's children share our process group (no new session), so Ctrl-C in a terminal
  reaches them too and they stop on their own; our SIGTERM is then a no-op. A server of
  its own runs in a session of its own, since it may start processes of its own
  (Triton's Python-backend stubs): it gets SIGTERM, and once it is gone, or after the
  grace, its whole process group gets SIGKILL, so nothing of it is left behind.
- A child that exits with an error (status > 0) before it was ever ready is not
  restarted: a usage or configuration error would only repeat. `ChildFailed` carries
  the node's one line about it, and ends the node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, NoReturn

import trio

from rsgw.base._errors import RsgwError
from rsgw.node._node import NodeConfig, WorkerSpec
from rsgw.node._probe import server_ready
from rsgw.node._servers import exit_failure, last_line, spawn_failure, startup_failure
from rsgw.node._supervision import (
    Backoff,
    cuda_device,
    gateway_command,
    parse_serving,
    pinned_gateway_env,
    serving_http_port,
    worker_command,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

# SIGTERM to SIGKILL. With `_KILL_WAIT` after it this stays inside docs/product.md §6's 5 s.
DEFAULT_STOP_GRACE = 3.0
_KILL_WAIT = 1.0
# How long we keep relaying a child's output after it exited (a grandchild may hold the
# pipe open; ours never fork, so this is only a bound).
_RELAY_DRAIN_SECONDS = 1.0
# A line longer than this is relayed in pieces rather than buffered without limit.
_MAX_LINE_BYTES = 65536

# How many of a child's last output lines are kept for the node's failure line.
_TAIL_LINES = 20
# How often a server of its own is asked ServerReady while it starts.
READY_POLL_SECONDS = 0.5

GATEWAY = "gateway"


class ChildFailed(RsgwError):
    """A child failed in a way a restart cannot fix; the message is the node's one line."""


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a process group (none left: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _stop_process(process: trio.Process, grace: float, group: bool = False) -> bool:
    """SIGTERM, wait up to `grace`, then SIGKILL; bounded. Call it shielded.

    With `group` (a child in a session of its own) the leader gets the SIGTERM and the
    whole group the SIGKILL, also after the leader exited on its own.

    Returns whether the process was still running (False: it had exited already).
    """
    if process.poll() is not None:
        if group:
            _kill_group(process.pid)
        return False
    process.terminate()
    with trio.move_on_after(grace):
        await process.wait()
        if group:
            _kill_group(process.pid)
        return True
    logger.warning("process ignored SIGTERM; killing it", extra={"pid": process.pid})
    if group:
        _kill_group(process.pid)
    else:
        process.kill()
    with trio.move_on_after(_KILL_WAIT):
        await process.wait()
    return True


class Child:
    """One supervised process: started, relayed, restarted. Subclasses say what to run."""

    serving_event = ""
    # A server of its own: a session of its own, stopped as a process group.
    new_session = False

    def __init__(self, name: str, sink: Callable[[str], None], stop_grace: float) -> None:
        self.name = name
        self.process: trio.Process | None = None
        self.starts = 0
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self.http_port: int | None = None
        # Set by the first serving line (or ServerReady); restarts keep it set.
        self.serving = trio.Event()
        self.cwd: str | None = None
        self._prefix = f"[{name}] "
        self._sink = sink
        self._stop_grace = stop_grace
        self._retired = False
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        # Called with its name when a restarted run is ready (a server of its own).
        self.on_return: Callable[[str], Awaitable[None]] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        raise NotImplementedError

    def pin(self, grpc_port: int, metrics_port: int | None, http_port: int | None = None) -> None:
        """The child reported its bound ports; make restarts bind the same ones."""

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    async def supervise(self, backoff: Backoff) -> NoReturn:
        """Run the child forever, restarting it after `backoff` whenever it exits."""
        while True:
            started = trio.current_time()
            try:
                pid, returncode = await self._run_once()
            except OSError as exc:  # the program is missing, or not executable
                reason = f"{exc.strerror or exc}" + (f": {exc.filename!r}" if exc.filename else "")
                if not self.serving.is_set():
                    raise ChildFailed(spawn_failure(self.name, self.command(), reason)) from None
                pid, returncode = 0, 127  # it ran before: retried as an exit
                self._tail.append(reason)
            if self._retired:
                await trio.sleep_forever()
            if returncode > 0 and not self.serving.is_set():
                raise ChildFailed(exit_failure(self.name, returncode, self.command(), self._tail))
            delay = backoff.after_exit(trio.current_time() - started)
            logger.warning(
                "process exited; restarting",
                extra={
                    "child": self.name,
                    "pid": pid,
                    "returncode": returncode,
                    "ran_s": round(trio.current_time() - started, 3),
                    "restart_in_s": delay,
                    "last_line": last_line(self._tail),
                },
            )
            await trio.sleep(delay)

    async def retire(self, grace: float) -> None:
        """Stop the child for good: SIGTERM, `grace` seconds to drain and exit, then SIGKILL."""
        self._retired = True
        if self.process is not None:
            with trio.CancelScope(shield=True):
                await _stop_process(self.process, grace, self.new_session)

    async def _run_once(self) -> tuple[int, int]:
        process = await trio.lowlevel.open_process(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            cwd=self.cwd,
            start_new_session=self.new_session,
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
                watch = trio.CancelScope()
                nursery.start_soon(self._watch_ready, watch)
                try:
                    await process.wait()
                finally:
                    watch.cancel()
                    with trio.CancelScope(shield=True):
                        if await _stop_process(process, self._stop_grace, self.new_session):
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
                await _stop_process(process, self._stop_grace, self.new_session)
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

    async def _watch_ready(self, scope: trio.CancelScope) -> None:
        """Learn when this run is ready, where the child's own log line does not say."""

    def _shown(self, text: str) -> bool:
        """Whether an output line is relayed (all are kept for the failure line)."""
        return True

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        self._tail.append(text)
        if self._shown(text):
            self._sink(self._prefix + text + "\n")
        ports = parse_serving(text, self.serving_event)
        if ports is not None:
            self.grpc_port, self.metrics_port = ports
            self.http_port = serving_http_port(text)
            self.pin(*ports, http_port=self.http_port)
            self.serving.set()


class WorkerChild(Child):
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

    def pin(self, grpc_port: int, metrics_port: int | None, http_port: int | None = None) -> None:
        self.spec = dataclasses.replace(self.spec, port=grpc_port, metrics_port=metrics_port)


class GatewayChild(Child):
    serving_event = "gateway serving"

    def __init__(self, env: dict[str, str], sink: Callable[[str], None], grace: float) -> None:
        super().__init__(GATEWAY, sink, grace)
        self._env = env

    def command(self) -> list[str]:
        return gateway_command(sys.executable)

    def environment(self) -> dict[str, str]:
        return self._env

    def pin(self, grpc_port: int, metrics_port: int | None, http_port: int | None = None) -> None:
        self._env = pinned_gateway_env(self._env, grpc_port, metrics_port, http_port)

    def _shown(self, text: str) -> bool:
        # Its one-line failure (`rsgw run: ...`) is the node's to report, in the words
        # of `rsgw node` (`exit_failure`), or logged with the restart (`last_line`).
        return not text.startswith("rsgw run: ")


class CommandChild(Child):
    """A server of its own on one GPU: Triton, MLServer, any KServe V2 server.

    Ready when its own ServerReady says so, polled over gRPC every
    `READY_POLL_SECONDS` while a run starts; on its first start it has
    `startup_seconds` to get there, or the node fails with `startup_failure`.
    """

    new_session = True

    def __init__(
        self,
        spec: WorkerSpec,
        argv: list[str],
        env: dict[str, str],
        sink: Callable[[str], None],
        stop_grace: float,
        *,
        cwd: str | None,
        startup_seconds: float,
    ) -> None:
        super().__init__(spec.name, sink, stop_grace)
        self.spec = spec
        self.cwd = cwd
        self.grpc_port, self.metrics_port = spec.port, spec.metrics_port
        self.http_port = spec.http_port
        self._argv = argv
        self._env = env
        self._startup_seconds = startup_seconds

    def command(self) -> list[str]:
        return self._argv

    def environment(self) -> dict[str, str]:
        return self._env

    async def supervise(self, backoff: Backoff) -> NoReturn:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._startup_deadline)
            await super().supervise(backoff)
        raise AssertionError("unreachable: supervise returns only by raising")

    async def _startup_deadline(self) -> None:
        with trio.move_on_after(self._startup_seconds):
            await self.serving.wait()
            return
        raise ChildFailed(startup_failure(self.name, self._startup_seconds, self._argv, self._tail))

    async def _watch_ready(self, scope: trio.CancelScope) -> None:
        with scope:
            returning = self.serving.is_set()
            started = trio.current_time()
            # Polling on purpose: a server of its own tells nobody when it is ready.
            while not await server_ready(self.spec.dial_host, self.spec.port):  # noqa: ASYNC110
                await trio.sleep(READY_POLL_SECONDS)
            logger.info(
                "worker ready",
                extra={
                    "child": self.name,
                    "pid": self.pid,
                    "grpc_port": self.spec.port,
                    "http_port": self.spec.http_port,
                    "metrics_port": self.spec.metrics_port,
                    "ready_after_s": round(trio.current_time() - started, 3),
                },
            )
            self.serving.set()
            if returning and self.on_return is not None:
                await self.on_return(self.name)
