"""The worker's system shared-memory registry (docs/original.md §8.1).

Clients (tritonclient, the gateway) create POSIX shared-memory objects, fill them
with input tensors and register them here under a region name; ModelInfer then
names the region instead of shipping the bytes, and outputs can be written back
into a region the same way.

Theory of operation
-------------------

* A region is an `mmap` of the POSIX object `/dev/shm/<key>`, covering exactly the
  registered `[offset, offset + byte_size)` window, rounded down to the page
  boundary that `mmap` insists on. Each mapping remembers that `delta` so region
  offsets translate to mapping offsets by one addition.
* The client owns the object. We open it with `os.open` and map it; we never
  create, resize or unlink it. That is why `multiprocessing.shared_memory` is out:
  on Python 3.11 its resource tracker unlinks every segment the process attached
  to when the process exits, which would delete the client's region the moment a
  worker stops (docs/product.md §5).
* The table maps a name to an immutable `_Mapping`. Registering, replacing and
  unregistering swap table entries under a lock and only then close the old
  `mmap`, so the table never holds a closed mapping.
* Reads and writes do not take the lock: they fetch the mapping, check bounds and
  copy. A copy that races a replace or an unregister may find its `mmap` already
  closed; CPython then raises `ValueError`, which we report as the region being
  unregistered (FAILED_PRECONDITION), the same answer the call would have got a
  moment later. A copy never outlives the GIL-held slice operation, and we never
  hand out views into a mapping, so closing never fails on exported buffers.

Not handled: a client that *shrinks* a registered object with `ftruncate` makes
later accesses past the new end raise SIGBUS and kill the worker. Real Triton
servers have the same exposure; detecting it would cost an `fstat` per access.
"""

from __future__ import annotations

import dataclasses
import errno
import mmap
import os
import resource
import stat
import sys
import threading
from dataclasses import dataclass

from rsgw.base._errors import FailedPrecondition, GrpcError, InvalidRequest, NotFound, shown
from rsgw.base._shm_access import REGION_PARAMETER as REGION_PARAMETER
from rsgw.base._shm_access import SHM_ROOT as SHM_ROOT
from rsgw.base._shm_access import not_yours as not_yours
from rsgw.base._shm_access import object_path
from rsgw.base._shm_access import regions_named as regions_named
from rsgw.base._status import StatusCode

#: `mmap` offsets must be multiples of this (the page size on Linux).
_GRANULARITY = mmap.ALLOCATIONGRANULARITY

#: glibc's `shm_open` refuses to follow symlinks; so do we, so that a key cannot
#: be used to open (read-write!) a file outside the shm filesystem.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """One registered region as SystemSharedMemoryStatus reports it."""

    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class _Mapping:
    """A registered region and the `mmap` behind it.

    `mm` starts at the page boundary at or below `status.offset`; region offset 0
    is mapping offset `delta`.
    """

    status: RegionStatus
    mm: mmap.mmap
    delta: int
    #: Who registered it (`CallContext.owner`): only they may use or unregister it.
    owner: str = ""


def _unregistered(name: str) -> FailedPrecondition:
    return FailedPrecondition(f"unregistered shared memory region: {name}")


def same_ipc_namespace(key: str) -> bool:
    """Tell whether this process can open POSIX shm object `key` read-only.

    The gateway asks this (IsSameIPCNamespace) to decide whether a client's region
    can be handed to the worker by key or must be copied: a worker in another IPC
    namespace (another container) sees a different `/dev/shm`. Opening the object
    is the honest test; we close it at once and never register anything.

    Args:
        key: the POSIX shm object name, with or without its leading slash.

    Returns:
        True iff `key` names a regular shm object we could open; False for "",
        invalid names, missing objects and permission errors.
    """
    path = object_path(key)
    if path is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def already_registered(name: str) -> GrpcError:
    return GrpcError(StatusCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")


def _map_object(name: str, key: str, offset: int, byte_size: int) -> _Mapping:
    """Open object `key` read-write and map `[offset, offset + byte_size)` of it.

    Raises:
        InvalidRequest: the key is invalid or missing, cannot be opened or mapped,
            or the window does not fit inside the object.
    """
    path = object_path(key)
    if path is None:
        raise InvalidRequest(
            f"unable to open shared memory object '{key}' for region '{name}': invalid name"
        )
    try:
        fd = os.open(path, os.O_RDWR | _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno in _OUT_OF_RESOURCES:
            raise _out_of_resources(name, exc) from exc
        raise InvalidRequest(
            f"unable to open shared memory object '{key}' for region '{name}': {exc.strerror}"
        ) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidRequest(
                f"unable to open shared memory object '{key}' for region '{name}': "
                "not a regular shared memory object"
            )
        if offset + byte_size > info.st_size:
            raise InvalidRequest(
                f"shared memory region '{name}' (key '{key}'): offset {offset} + byte_size "
                f"{byte_size} = {offset + byte_size} exceeds the object's size of "
                f"{info.st_size} bytes"
            )
        start = offset - offset % _GRANULARITY
        delta = offset - start
        try:
            if sys.version_info >= (3, 13):
                # Without trackfd=False the mmap keeps a dup of the fd for its
                # lifetime: one open file per region, for nothing we use.
                mm = mmap.mmap(fd, delta + byte_size, offset=start, trackfd=False)
            else:
                mm = mmap.mmap(fd, delta + byte_size, offset=start)
        except (OSError, ValueError) as exc:
            if isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES:
                raise _out_of_resources(name, exc) from exc
            # ValueError: the object shrank between fstat and mmap.
            raise InvalidRequest(
                f"unable to map shared memory object '{key}' for region '{name}' "
                f"(offset {offset}, byte_size {byte_size}): {exc}"
            ) from exc
    finally:
        os.close(fd)
    return _Mapping(RegionStatus(name, key, offset, byte_size), mm, delta)


#: Errors that say the worker is out of something, not that the request is wrong.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def _out_of_resources(name: str, exc: OSError) -> GrpcError:
    return GrpcError(
        StatusCode.RESOURCE_EXHAUSTED,
        f"failed to register shared memory region '{shown(name)}': {exc.strerror}",
    )


def _check_window(region: str, size: int, offset: int, byte_size: int, what: str) -> None:
    """Raise InvalidRequest unless `[offset, offset + byte_size)` lies within `[0, size)`."""
    if offset < 0:
        raise InvalidRequest(
            f"shared memory region '{region}': {what} offset must be >= 0, got {offset}"
        )
    if byte_size < 0:
        raise InvalidRequest(
            f"shared memory region '{region}': {what} byte_size must be >= 0, got {byte_size}"
        )
    if offset + byte_size > size:
        raise InvalidRequest(
            f"shared memory region '{region}': {what} offset {offset} + byte_size "
            f"{byte_size} = {offset + byte_size} exceeds the region's byte_size {size}"
        )


def default_max_regions() -> int:
    """Half the process's soft limit on open files (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(16, soft // 2)


class ShmRegistry:
    """Regions registered by clients, each an mmap of a POSIX shm object.

    One registry per worker. Methods are synchronous: registering does a few
    system calls and reading or writing is a `memcpy`, both far cheaper than a
    thread hop. They are safe to call from several threads (see the module's
    theory of operation), so a caller may copy large tensors off the event loop.

    Resource handling: every registered region holds one mapping (and, before
    Python 3.13, one file descriptor inside it) until it is unregistered, replaced
    or `close()` runs. Nothing here ever unlinks a client's object.
    """

    def __init__(self, max_regions: int | None = None) -> None:
        self._regions: dict[str, _Mapping] = {}
        self._lock = threading.Lock()
        #: Regions held at once. Each may hold a file descriptor, so by default half
        #: the process's descriptor limit: a client registering without end gets
        #: RESOURCE_EXHAUSTED while connections and the rest still have room.
        self.max_regions = default_max_regions() if max_regions is None else max_regions

    def __len__(self) -> int:
        return len(self._regions)

    def register(self, name: str, key: str, offset: int, byte_size: int, owner: str = "") -> None:
        """Attach `[offset, offset + byte_size)` of POSIX object `key` as region `name`.

        A name that is already registered is ALREADY_EXISTS, in Triton's words,
        and the region stays as it was (the original replaced it; Triton's clients
        expect the refusal, docs/product.md). A restarted worker has no regions,
        so registering again after a restart succeeds.

        Args:
            name: the region name clients will put in `shared_memory_region`.
            key: the POSIX shm object name, as tritonclient sends it ("/input0").
            offset: where the region starts inside the object; need not be
                page-aligned.
            byte_size: the region's length, > 0.
            owner: who registers it; only they may use and unregister it (the
                caller has checked they may map `key`: `rsgw.base._shm_access`).

        Raises:
            InvalidRequest: empty name or key, a negative offset, a byte_size
                that is not positive, a window past the object's end, or an
                object that cannot be opened and mapped read-write.
            GrpcError: ALREADY_EXISTS, the name is registered.
        """
        if not name:
            raise InvalidRequest("shared memory region name must not be empty")
        if not key:
            raise InvalidRequest(f"shared memory region '{name}': key must not be empty")
        if offset < 0:
            raise InvalidRequest(
                f"shared memory region '{name}' (key '{key}'): offset must be >= 0, got {offset}"
            )
        if byte_size <= 0:
            raise InvalidRequest(
                f"shared memory region '{name}' (key '{key}'): byte_size must be > 0, "
                f"got {byte_size}"
            )
        if name in self._regions:
            raise already_registered(name)
        if len(self._regions) >= self.max_regions:
            raise GrpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"failed to register shared memory region '{shown(name)}': this worker already "
                f"holds {len(self._regions)} regions, its limit; unregister some first",
            )
        mapping = _map_object(name, key, offset, byte_size)
        mapping = dataclasses.replace(mapping, owner=owner)
        with self._lock:
            if name in self._regions:  # registered meanwhile (the registry is thread-safe)
                mapping.mm.close()
                raise already_registered(name)
            self._regions[name] = mapping

    def unregister(self, name: str, owner: str = "") -> None:
        """Detach `owner`'s region `name`, or every region of `owner`'s if `name` is "".

        Idempotent: an unknown name is not an error, so a client can clean up
        without first asking what is registered.

        Raises:
            GrpcError: PERMISSION_DENIED, region `name` is someone else's.
        """
        with self._lock:
            if name:
                mapping = self._regions.get(name)
                if mapping is not None and mapping.owner != owner:
                    raise not_yours(name)
                dropped = [] if mapping is None else [self._regions.pop(name)]
            else:
                dropped = [m for m in self._regions.values() if m.owner == owner]
                for mapping in dropped:
                    del self._regions[mapping.status.name]
            for mapping in dropped:
                mapping.mm.close()

    def check_owner(self, region: str, owner: str) -> None:
        """PERMISSION_DENIED if `region` is registered by another than `owner`."""
        mapping = self._regions.get(region)
        if mapping is not None and mapping.owner != owner:
            raise not_yours(region)

    def status(self, name: str = "", owner: str = "") -> list[RegionStatus]:
        """Describe `owner`'s regions (sorted by name), or only region `name`.

        Raises:
            NotFound: `name` is not registered by `owner` (Triton answers NOT_FOUND here;
                another's region is not admitted to exist).
        """
        if not name:
            with self._lock:  # iterating while another thread registers would raise
                regions = [m for m in self._regions.values() if m.owner == owner]
            return sorted((m.status for m in regions), key=lambda s: s.name)
        mapping = self._regions.get(name)
        if mapping is None or mapping.owner != owner:
            raise NotFound(f"unregistered shared memory region: {name}")
        return [mapping.status]

    def require(self, region: str) -> None:
        """Check that `region` is registered (before work that will write to it).

        Raises:
            FailedPrecondition: `region` is not registered.
        """
        if region not in self._regions:
            raise _unregistered(region)

    def read(self, region: str, offset: int, byte_size: int) -> bytes:
        """Return a copy of `byte_size` bytes at `offset` within `region`.

        We copy rather than hand out a view: a view would pin the mapping (a
        later unregister would fail on the exported buffer) and would see the
        client's later writes mid-inference.

        Args:
            region: a registered region name.
            offset: relative to the region's own registered offset.
            byte_size: how many bytes to read; 0 gives b"".

        Raises:
            FailedPrecondition: `region` is not registered, or was detached
                during the read.
            InvalidRequest: the window does not lie within the region.
        """
        mapping = self._regions.get(region)
        if mapping is None:
            raise _unregistered(region)
        _check_window(region, mapping.status.byte_size, offset, byte_size, "read")
        start = mapping.delta + offset
        try:
            return mapping.mm[start : start + byte_size]
        except ValueError as exc:  # "mmap closed or invalid": detached under us
            raise _unregistered(region) from exc

    def write(
        self,
        region: str,
        offset: int,
        data: bytes | bytearray | memoryview,
        *,
        byte_size: int | None = None,
    ) -> None:
        """Copy `data` into `region` at `offset`.

        Args:
            region: a registered region name.
            offset: relative to the region's own registered offset.
            data: the bytes to write (any C-contiguous buffer layout is fine).
            byte_size: the size of the slot the client reserved at `offset`
                (its `shared_memory_byte_size`); the slot must lie within the
                region and `data` must fit in it. None means the slot runs to the
                region's end.

        Raises:
            FailedPrecondition: `region` is not registered, or was detached
                during the write.
            InvalidRequest: the slot does not lie within the region, or `data`
                is larger than the slot.
        """
        mapping = self._regions.get(region)
        if mapping is None:
            raise _unregistered(region)
        view = memoryview(data)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        view = view.cast("B")
        size = mapping.status.byte_size
        if byte_size is None:
            _check_window(region, size, offset, view.nbytes, "write")
        else:
            _check_window(region, size, offset, byte_size, "write slot")
            if view.nbytes > byte_size:
                raise InvalidRequest(
                    f"shared memory region '{region}': {view.nbytes} bytes do not fit "
                    f"the slot of byte_size {byte_size} at offset {offset}"
                )
        start = mapping.delta + offset
        try:
            mapping.mm[start : start + view.nbytes] = view
        except ValueError as exc:  # "mmap closed or invalid": detached under us
            raise _unregistered(region) from exc

    def close(self) -> None:
        """Unmap every region; the client's objects stay (we never unlink them).

        The registry stays usable: later registrations work as on a new one.
        """
        self.unregister("")
