"""Which POSIX shared memory objects a client may have the gateway or a worker map.

Registering a region makes the server open `/dev/shm/<key>` read-write with its
own rights, and then read it (inputs) and write it (outputs) for the client. A
client must not get through the server what it could not open itself: another
user's object, a database's shared buffers, another tenant's tensors, another
process's of the same user. So the client proves it could: its connection is on
loopback, and the process at the other end (`rsgw.base._peer.Peer.pids`) has the object
open or mapped, as a client that created it or opened it to fill it does. The
gateway proves it the same way to its workers: it holds the object open while it
registers it there. Where the client's process cannot be seen (another PID
namespace), the object must belong to the user the client runs as. Clients in the
same process (an embedding application) are the server itself.

A client on another host cannot share this host's /dev/shm at all, so its
registrations are refused, unless `shm.allow_remote_clients` says that pods with
the node's IPC namespace reach the gateway by their own addresses; those then may
only name objects under `shm.key_prefix`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import GrpcError, shown
from rsgw.base._peer import IN_PROCESS, LOOPBACK, Peer, holds_file
from rsgw.base._status import StatusCode

SHM_ROOT = "/dev/shm/"
#: The tensor parameter that names a region instead of carrying the bytes.
REGION_PARAMETER = "shared_memory_region"


def object_path(key: str) -> str | None:
    """The file behind POSIX shm object `key` (glibc's rules), or None for an invalid name."""
    name = key.lstrip("/")
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        return None
    return SHM_ROOT + name


def check_access(
    client: Peer, key: str, *, allow_remote: bool = False, key_prefix: str = ""
) -> None:
    """Raise PERMISSION_DENIED unless `client` may register POSIX object `key`.

    A key that names no object passes: the worker's open then fails with the
    precise error Triton gives (the client learns nothing it could not by
    `shm_open` itself).
    """
    if key_prefix and not key.lstrip("/").startswith(key_prefix.lstrip("/")):
        raise _denied(key, f"keys must start with '{key_prefix}' here")
    if client.kind == IN_PROCESS:
        return
    if client.kind != LOOPBACK:
        if allow_remote:
            return
        raise _denied(
            key,
            "system shared memory can only be registered by a client on this host "
            "(connect through 127.0.0.1 or ::1)",
        )
    path = object_path(key)
    if path is None:
        return
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode):
        return  # the worker refuses it with its own message
    pids = client.pids()
    if os.getpid() in pids:
        return  # a client inside this very process (an embedding application, a test)
    if pids:
        if any(holds_file(pid, path) for pid in pids):
            return
        raise _denied(
            key,
            "this client does not have it open or mapped; a client registers only the "
            "objects it created or opened itself (as tritonclient's shared memory helpers do)",
        )
    # The client's process cannot be seen (another PID namespace): its user must own it.
    uid = client.uid()
    if uid is None:
        raise _denied(key, "the user of this client cannot be told, so it cannot prove access")
    if uid != info.st_uid:
        raise _denied(key, "the object belongs to another user than this client's")


@contextlib.contextmanager
def held_open(key: str) -> Iterator[None]:
    """Hold POSIX object `key` open meanwhile (read-only), if it exists: the gateway's
    proof to a worker that it may have the worker map it (see the module docstring)."""
    path = object_path(key) if key else None
    fd = -1
    if path is not None:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def may_see(client: Peer, key: str, *, allow_remote: bool = False, key_prefix: str = "") -> bool:
    """`check_access` as a yes/no (IsSameIPCNamespace must not tell what exists)."""
    try:
        check_access(client, key, allow_remote=allow_remote, key_prefix=key_prefix)
    except GrpcError:
        return False
    return True


def regions_named(request: pb.ModelInferRequest) -> set[str]:
    """The shared memory regions a request's inputs and outputs name."""
    return {
        tensor.parameters[REGION_PARAMETER].string_param
        for tensors in (request.inputs, request.outputs)
        for tensor in tensors
        if REGION_PARAMETER in tensor.parameters
    }


def not_yours(region: str) -> GrpcError:
    """The refusal of another client's region (to use, unregister or register again)."""
    return GrpcError(
        StatusCode.PERMISSION_DENIED,
        f"shared memory region '{shown(region)}' was registered by another client",
    )


def _denied(key: str, why: str) -> GrpcError:
    return GrpcError(
        StatusCode.PERMISSION_DENIED,
        f"may not register shared memory object '{shown(key)}': {why}",
    )
