"""One supervised child process of a node: started, relayed, restarted, stopped.

`rsgw.node._supervisor` starts a node as a set of these. A `Child` is a task that
starts its process, relays its output line by line to our stderr behind a
`[worker0] ` / `[gateway] ` prefix, waits for it to exit and starts it again after a
backoff (`Backoff`, which doubles from 1 s to 30 s and starts over once a run lasted a
minute). `WorkerChild` and `GatewayChild` say what to run (`rsgw.node._supervision`
builds the command lines and environments, purely) and how a restart keeps the ports
the first run reported.

Invariants:
- A port picked at start-up (port 0) is pinned: a restarted child binds the port its
  first run got, so the gateway's worker list and a client's target stay valid.
- A child process never outlives its task: leaving `_run_once` by any route (exit,
  cancellation, error) stops the process, SIGTERM then SIGKILL after the stop grace
  (`DEFAULT_STOP_GRACE`), shielded and bounded.
- Children share our process group (no new session), so Ctrl-C in a terminal reaches
  them too and they stop on their own; our SIGTERM is then a no-op.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, NoReturn

import trio

from rsgw.node._node import NodeConfig, WorkerSpec
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
    from collections.abc import Callable

logger = logging.getLogger(__name__)

# SIGTERM to SIGKILL. With `_KILL_WAIT` after it this stays inside docs/product.md §6's 5 s.
DEFAULT_STOP_GRACE = 3.0
_KILL_WAIT = 1.0
# How long we keep relaying a child's output after it exited (a grandchild may hold the
# pipe open; ours never fork, so this is only a bound).
_RELAY_DRAIN_SECONDS = 1.0
# A line longer than this is relayed in pieces rather than buffered without limit.
_MAX_LINE_BYTES = 65536

GATEWAY = "gateway"


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


class Child:
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

    def pin(self, grpc_port: int, metrics_port: int | None, http_port: int | None = None) -> None:
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
            self.pin(*ports, http_port=serving_http_port(text))
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
