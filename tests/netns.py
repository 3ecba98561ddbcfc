"""Another host on this machine: a network namespace joined to ours by a veth pair.

A test that must see what a client on another host sees (a peer that is not on
loopback) runs that client in `OtherHost`: its own network namespace, with one
address on a point-to-point link to this one. The gateway under test listens on
0.0.0.0 here and is reached there at `gateway_address`. Needs root (CAP_NET_ADMIN)
and iproute2; `other_host()` skips the test without them, except under CI (`CI=1`),
where `.ci/run` installs iproute2 and a skip would hide the test.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

import pytest

_COUNTER = itertools.count()


@dataclass(frozen=True)
class OtherHost:
    """A network namespace; commands run there with `command`."""

    name: str
    #: This host's address on the link, as the other host reaches it.
    gateway_address: str
    #: The other host's own address.
    address: str

    def command(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]


def _cannot(why: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI must run this test)")
    pytest.skip(why)


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def other_host() -> Iterator[OtherHost]:
    """A fresh namespace and link for the duration of the block (see the module docstring)."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        _cannot("needs root and iproute2 to make a network namespace")
    number = next(_COUNTER)
    tag = f"{os.getpid() % 10000}x{number}"
    name, here, there = f"rsgw-{tag}", f"rh{tag}", f"rn{tag}"
    subnet = f"10.{200 + os.getpid() % 50}.{number % 250}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        _cannot(f"cannot make a network namespace: {exc.stderr.decode().strip()}")
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", name)
        _ip("addr", "add", f"{subnet}.1/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"{subnet}.2/30", "dev", there)
        _ip("netns", "exec", name, "ip", "link", "set", there, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield OtherHost(name, f"{subnet}.1", f"{subnet}.2")
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", here)
        _ip("netns", "del", name)
