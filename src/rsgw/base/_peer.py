"""Who is at the other end of a connection: its address, certificate and, on this host, user.

Shared memory is only safe to hand out to a client that could open the object
itself. Over TCP a server cannot ask the kernel for its peer's credentials the way
a Unix socket can (SO_PEERCRED), but for a loopback connection the client's socket
is in this host's socket table: `/proc/net/tcp` (and `tcp6`) lists every socket
with its local and remote address and the uid that created it, which is how identd
has always answered. `Peer.uid()` finds the row whose local end is the client's
address and whose remote end is ours, once per connection, on first need (a
shared-memory registration; never a plain inference call).

The same row gives the socket's inode, and the process that holds it is the one
with `socket:[inode]` among its open files (`Peer.pids()`, a scan of /proc done
only when a registration asks). `rsgw.base._shm_access` then asks whether that process
has the shared memory object open or mapped.

A peer that is not a socket (trio memory streams: an embedded, in-process client)
is `IN_PROCESS` and trusted as the server itself.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Literal

import trio

#: Where Linux lists TCP sockets (IPv4, IPv6).
PROC_TCP = ("/proc/net/tcp", "/proc/net/tcp6")

LOOPBACK = "loopback"
REMOTE = "remote"
IN_PROCESS = "in-process"


@dataclass(eq=False)
class Peer:
    """A connection's client, for authorization and shared memory ownership."""

    #: LOOPBACK, REMOTE or IN_PROCESS.
    kind: str
    #: `host:port` (`[host]:port` for IPv6), for logs and `CallContext.peer`.
    address: str = ""
    #: The verified TLS client certificate's identity ("" without one).
    certificate: str = ""
    #: (client host, client port, our host, our port) of a TCP connection.
    ends: tuple[str, int, str, int] | None = None
    _socket: SocketRow | None = field(default=None, repr=False)
    _looked_up: bool = field(default=False, repr=False)
    _pids: tuple[int, ...] | None = field(default=None, repr=False)

    def _row(self) -> SocketRow | None:
        if not self._looked_up:
            self._looked_up = True
            if self.kind == LOOPBACK and self.ends is not None:
                self._socket = socket_row(*self.ends)
        return self._socket

    def uid(self) -> int | None:
        """The uid of the process that opened a loopback connection (cached); else None."""
        row = self._row()
        return None if row is None else row.uid

    def pids(self) -> tuple[int, ...]:
        """The processes holding the client's end of a loopback connection (cached).

        Empty when they cannot be seen (another PID namespace, /proc hidden).
        """
        if self._pids is None:
            row = self._row()
            self._pids = () if row is None else socket_holders(row.inode, row.uid)
        return self._pids

    @property
    def owner(self) -> str:
        """Who owns what this peer registers when no token says: see docs/security.md."""
        if self.certificate:
            return f"certificate:{self.certificate}"
        if self.kind == IN_PROCESS:
            return "in-process"
        uid = self.uid()
        if uid is not None:
            return f"uid:{uid}"
        return f"address:{self.address.rsplit(':', 1)[0]}"


def peer_of(stream: trio.abc.Stream, certificate: str = "") -> Peer:
    """The `Peer` at the other end of `stream` (a socket stream, possibly under TLS)."""
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if not isinstance(stream, trio.SocketStream):
        return Peer(IN_PROCESS, type(stream).__name__, certificate)
    try:
        theirs = stream.socket.getpeername()
        ours = stream.socket.getsockname()
    except OSError:
        return Peer(REMOTE, "unknown", certificate)
    if stream.socket.family not in (socket.AF_INET, socket.AF_INET6):
        return Peer(IN_PROCESS, str(theirs), certificate)
    host, port = str(theirs[0]), int(theirs[1])
    kind = LOOPBACK if is_loopback(host) else REMOTE
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return Peer(kind, shown, certificate, (host, port, str(ours[0]), int(ours[1])))


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@dataclass(frozen=True, slots=True)
class SocketRow:
    """What /proc/net/tcp says of one socket: who created it, and its inode."""

    uid: int
    inode: int


def socket_owner(client_host: str, client_port: int, our_host: str, our_port: int) -> int | None:
    """The uid owning the socket `client_host:client_port` -> `our_host:our_port`, or None."""
    row = socket_row(client_host, client_port, our_host, our_port)
    return None if row is None else row.uid


def socket_row(
    client_host: str, client_port: int, our_host: str, our_port: int
) -> SocketRow | None:
    """The /proc/net/tcp row of socket `client_host:client_port` -> `our_host:our_port`."""
    wanted = {
        (encoded, _hex_port(client_port), peer, _hex_port(our_port))
        for encoded in _proc_addresses(client_host)
        for peer in _proc_addresses(our_host)
    }
    for path in PROC_TCP:
        try:
            with open(path, encoding="ascii", errors="replace") as table:
                next(table, None)  # the header
                for line in table:
                    row = parse_row(line, wanted)
                    if row is not None:
                        return row
        except OSError:
            continue
    return None


def owner_in_row(line: str, wanted: set[tuple[str, str, str, str]]) -> int | None:
    """The uid of one `/proc/net/tcp` row if its (local, remote) ends are `wanted`."""
    row = parse_row(line, wanted)
    return None if row is None else row.uid


def parse_row(line: str, wanted: set[tuple[str, str, str, str]]) -> SocketRow | None:
    """One `/proc/net/tcp` row's uid and inode, if its (local, remote) ends are `wanted`."""
    fields = line.split()
    if len(fields) < 10:
        return None
    local, remote = fields[1].split(":"), fields[2].split(":")
    if len(local) != 2 or len(remote) != 2:
        return None
    if (local[0], local[1], remote[0], remote[1]) not in wanted:
        return None
    try:
        return SocketRow(int(fields[7]), int(fields[9]))
    except ValueError:
        return None


def socket_holders(inode: int, uid: int) -> tuple[int, ...]:
    """The processes (of user `uid`, or any when we cannot tell) with socket `inode` open."""
    target = f"socket:[{inode}]"
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return ()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") == target:
                    found.append(int(entry))
                    break
            except OSError:
                continue
    return tuple(found)


def holds_file(pid: int, path: str) -> bool:
    """Whether process `pid` has file `path` open or mapped."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                return True
        except OSError:
            continue
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            return any(line.rstrip("\n").endswith(" " + path) for line in maps)
    except OSError:
        return False


def _hex_port(port: int) -> str:
    return f"{port:04X}"


def _proc_addresses(host: str) -> list[str]:
    """How `/proc/net/tcp{,6}` spell `host`: each 32-bit word in host byte order, hex."""
    address = ipaddress.ip_address(host.split("%", 1)[0])
    forms = []
    if isinstance(address, ipaddress.IPv6Address):
        forms.append(_words(address.packed))
        if address.ipv4_mapped is not None:
            forms.append(_words(address.ipv4_mapped.packed))
    else:
        forms.append(_words(address.packed))
        forms.append(_words(ipaddress.IPv6Address(f"::ffff:{address}").packed))
    return forms


def _words(packed: bytes) -> str:
    order: Literal["little", "big"] = sys.byteorder
    return "".join(
        f"{int.from_bytes(packed[i : i + 4], order):08X}" for i in range(0, len(packed), 4)
    )
