"""Who may register which POSIX shared memory object; whose socket a loopback peer is."""

from __future__ import annotations

import os
import socket

import pytest

from rsgw.base._errors import GrpcError
from rsgw.base._peer import (
    IN_PROCESS,
    LOOPBACK,
    REMOTE,
    Peer,
    is_loopback,
    owner_in_row,
    socket_owner,
)
from rsgw.base._shm_access import check_access, may_see
from rsgw.base._status import StatusCode


def test_remote_clients_are_refused_unless_allowed() -> None:
    remote = Peer(REMOTE, "10.1.2.3:5000")
    with pytest.raises(GrpcError) as caught:
        check_access(remote, "/x")
    assert caught.value.code is StatusCode.PERMISSION_DENIED
    assert "client on this host" in caught.value.message
    check_access(remote, "/x", allow_remote=True)
    assert not may_see(remote, "/x")


def test_in_process_clients_are_the_servers_own_user() -> None:
    check_access(Peer(IN_PROCESS, "memory"), "/anything")


def test_key_prefix_applies_to_everyone() -> None:
    with pytest.raises(GrpcError, match="must start with 'rsgw-'"):
        check_access(Peer(IN_PROCESS), "/other", key_prefix="rsgw-")
    check_access(Peer(IN_PROCESS), "/rsgw-mine", key_prefix="rsgw-")


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shm on /dev/shm only")
def test_a_loopback_client_of_unknown_user_cannot_prove_access() -> None:
    key = f"/rsgw-access-{os.getpid()}"
    fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        peer = Peer(LOOPBACK, "127.0.0.1:1", ends=("127.0.0.1", 1, "127.0.0.1", 2))
        with pytest.raises(GrpcError, match="cannot be told"):
            check_access(peer, key)
        assert may_see(peer, "/no-such-object")  # nothing to protect: the worker says no
    finally:
        os.close(fd)
        os.unlink("/dev/shm" + key)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("x", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_owner_in_row_reads_the_uid_column() -> None:
    row = (
        "   3: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000"
        "        0 123 1 0000000000000000 20 4 30 10 -1"
    )
    assert owner_in_row(row, {("0100007F", "1F90", "0100007F", "D431")}) == 1000
    assert owner_in_row(row, {("0100007F", "1F91", "0100007F", "D431")}) is None
    assert owner_in_row("garbage", set()) is None


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="Linux only")
@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_socket_owner_finds_our_own_sockets(family: socket.AddressFamily) -> None:
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    try:
        server = socket.socket(family)
        server.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host} here")
    with server:
        server.listen()
        with socket.create_connection((host, server.getsockname()[1])) as client:
            accepted, _ = server.accept()
            with accepted:
                theirs, ours = accepted.getpeername(), accepted.getsockname()
                assert socket_owner(theirs[0], theirs[1], ours[0], ours[1]) == os.geteuid()
                assert client.fileno() >= 0
