"""A real etcd for tests (Debian's `etcd-server`), started on loopback in a temporary directory.

`.ci/run` installs etcd; where it is missing, the tests that need it skip, except
under CI=1, where they fail (the Prometheus tests do the same). etcd cannot be told
to bind port 0, so two free ports are found first and handed to it; `EtcdProcess`
can be stopped and continued (SIGSTOP/SIGCONT) and killed, as the failure tests need.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ETCD = shutil.which("etcd")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EtcdProcess:
    """One single-member etcd cluster on loopback."""

    def __init__(self, directory: Path) -> None:
        assert ETCD is not None
        self.port = _free_port()
        peer = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        client = f"http://{self.endpoint}"
        self.log = open(directory / "etcd.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [
                ETCD,
                "--name=test",
                f"--data-dir={directory / 'data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=test=http://127.0.0.1:{peer}",
                "--log-level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{client}/health", timeout=1).json().get("health") == "true":
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd did not start: {(directory / 'etcd.log').read_text()}")
            time.sleep(0.05)

    def pause(self) -> None:
        """SIGSTOP, and wait until the kernel has stopped it (a signal is not a stop yet:
        a thread still running may answer one more request)."""
        os.kill(self.process.pid, signal.SIGSTOP)
        stat = Path(f"/proc/{self.process.pid}/stat")
        deadline = time.monotonic() + 5
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
            if time.monotonic() > deadline:
                raise RuntimeError("etcd did not stop")
            time.sleep(0.005)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGCONT)
        self.process.kill()
        self.process.wait(10)
        self.log.close()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    if ETCD is None:
        if os.environ.get("CI"):
            pytest.fail("etcd is not installed (.ci/run installs Debian's etcd-server)")
        pytest.skip("etcd is not installed (Debian's etcd-server)")
    process = EtcdProcess(tmp_path)
    try:
        yield process
    finally:
        process.stop()
