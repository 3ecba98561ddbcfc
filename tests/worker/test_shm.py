"""Tests for the worker's system shared-memory registry (rsgw.worker._shm).

Regions are real POSIX objects, made the way clients make them: with
tritonclient's helpers (what users run) and with plain `os.open` on /dev/shm
(which lets us choose sizes and contents byte by byte). Every key is unique per
test and unlinked afterwards.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.utils.shared_memory as triton_shm

from rsgw.base._errors import FailedPrecondition, GrpcError, InvalidRequest, NotFound
from rsgw.base._status import StatusCode
from rsgw.worker._shm import SHM_ROOT, RegionStatus, ShmRegistry, same_ipc_namespace

PAGE = 4096
MakeObject = Callable[..., str]


def _path(key: str) -> str:
    return SHM_ROOT + key.lstrip("/")


def _pattern(size: int) -> bytes:
    """Bytes whose value depends on their position, so misplaced reads show."""
    return bytes((i * 7 + i // 256) % 256 for i in range(size))


def _unique_key() -> str:
    return f"/rsgw-test-{uuid.uuid4().hex}"


@pytest.fixture
def make_object() -> Iterator[MakeObject]:
    """Create POSIX shm objects directly; unlink them all at the end."""
    made: list[str] = []

    def make(size: int, content: bytes | None = None) -> str:
        key = _unique_key()
        fd = os.open(_path(key), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        made.append(key)
        try:
            os.ftruncate(fd, size)
            if content is not None:
                os.pwrite(fd, content, 0)
        finally:
            os.close(fd)
        return key

    yield make
    for key in made:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_path(key))


@pytest.fixture
def registry() -> Iterator[ShmRegistry]:
    reg = ShmRegistry()
    yield reg
    reg.close()


@pytest.fixture
def triton_region() -> Iterator[Callable[[str, int], tuple[object, str]]]:
    """Create regions with tritonclient; destroy (and so unlink) them at the end."""
    handles: list[object] = []

    def make(name: str, size: int) -> tuple[object, str]:
        key = _unique_key()
        handle = triton_shm.create_shared_memory_region(name, key, size)
        handles.append(handle)
        return handle, key

    yield make
    for handle in handles:
        triton_shm.destroy_shared_memory_region(handle)


# --- the happy paths ------------------------------------------------------------------


def test_tritonclient_input_round_trip(
    registry: ShmRegistry, triton_region: Callable[[str, int], tuple[object, str]]
) -> None:
    handle, key = triton_region("input_simple", 128)
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.ones(16, dtype=np.int32)
    triton_shm.set_shared_memory_region(handle, [in0, in1])

    registry.register("input_simple", key, 0, 128)

    assert registry.status() == [RegionStatus("input_simple", key, 0, 128)]
    assert registry.read("input_simple", 0, 64) == in0.tobytes()
    assert registry.read("input_simple", 64, 64) == in1.tobytes()
    assert registry.read("input_simple", 8, 8) == in0[2:4].tobytes()
    assert registry.read("input_simple", 128, 0) == b""


def test_tritonclient_sees_written_output(
    registry: ShmRegistry, triton_region: Callable[[str, int], tuple[object, str]]
) -> None:
    handle, key = triton_region("output_simple", 128)
    registry.register("output_simple", key, 0, 128)
    out0 = np.arange(16, dtype=np.int32) * 3
    out1 = -np.arange(16, dtype=np.int32).reshape(4, 4)

    registry.write("output_simple", 0, out0.tobytes(), byte_size=64)
    # A multi-dimensional, non-byte buffer is written by its bytes.
    registry.write("output_simple", 64, out1.data, byte_size=64)

    got0 = triton_shm.get_contents_as_numpy(handle, np.int32, [16])
    got1 = triton_shm.get_contents_as_numpy(handle, np.int32, [4, 4], offset=64)
    np.testing.assert_array_equal(got0, out0)
    np.testing.assert_array_equal(got1, out1)


def test_non_contiguous_buffer_is_written_by_value(
    registry: ShmRegistry, make_object: MakeObject
) -> None:
    key = make_object(64)
    registry.register("r", key, 0, 64)
    strided = np.arange(16, dtype=np.int32)[::2]
    assert not strided.flags.c_contiguous
    registry.write("r", 4, strided.data)
    assert registry.read("r", 4, 32) == strided.tobytes()


@pytest.mark.parametrize("offset", [1, 100, PAGE - 1, PAGE, PAGE + 904, 2 * PAGE + 1])
def test_unaligned_region_offsets(
    registry: ShmRegistry, make_object: MakeObject, offset: int
) -> None:
    content = _pattern(3 * PAGE + 300)
    key = make_object(len(content), content)
    registry.register("r", key, offset, 200)

    assert registry.status("r") == [RegionStatus("r", key, offset, 200)]
    assert registry.read("r", 0, 200) == content[offset : offset + 200]
    assert registry.read("r", 150, 50) == content[offset + 150 : offset + 200]

    registry.write("r", 10, b"xyz")
    fd = os.open(_path(key), os.O_RDONLY)
    try:
        assert os.pread(fd, 3, offset + 10) == b"xyz"
        # Nothing around the slot moved.
        assert os.pread(fd, 10, offset) == content[offset : offset + 10]
        assert os.pread(fd, 5, offset + 13) == content[offset + 13 : offset + 18]
    finally:
        os.close(fd)


def test_region_may_end_exactly_at_object_end(
    registry: ShmRegistry, make_object: MakeObject
) -> None:
    content = _pattern(1000)
    key = make_object(1000, content)
    registry.register("tail", key, 900, 100)
    assert registry.read("tail", 0, 100) == content[900:]


def test_key_without_leading_slash(registry: ShmRegistry, make_object: MakeObject) -> None:
    key = make_object(16, b"0123456789abcdef")
    registry.register("r", key.lstrip("/"), 4, 4)
    assert registry.read("r", 0, 4) == b"4567"
    assert registry.status("r")[0].key == key.lstrip("/")


def test_status_lists_all_sorted_or_the_named_one(
    registry: ShmRegistry, make_object: MakeObject
) -> None:
    key = make_object(PAGE)
    registry.register("b", key, 0, 10)
    registry.register("a", key, 10, 20)
    registry.register("c", key, 30, 40)

    assert registry.status() == [
        RegionStatus("a", key, 10, 20),
        RegionStatus("b", key, 0, 10),
        RegionStatus("c", key, 30, 40),
    ]
    assert registry.status("") == registry.status()
    assert registry.status("c") == [RegionStatus("c", key, 30, 40)]


def test_status_of_unknown_region_is_not_found(registry: ShmRegistry) -> None:
    with pytest.raises(NotFound, match=r"^unregistered shared memory region: nope$") as info:
        registry.status("nope")
    assert info.value.grpc_status is StatusCode.NOT_FOUND


def test_unregister_one_is_idempotent(registry: ShmRegistry, make_object: MakeObject) -> None:
    key = make_object(64)
    registry.register("a", key, 0, 32)
    registry.register("b", key, 32, 32)

    registry.unregister("a")
    registry.unregister("a")
    registry.unregister("never-registered")

    assert [s.name for s in registry.status()] == ["b"]
    with pytest.raises(FailedPrecondition, match=r"^unregistered shared memory region: a$"):
        registry.read("a", 0, 1)
    assert registry.read("b", 0, 1) == b"\0"


def test_unregister_all(registry: ShmRegistry, make_object: MakeObject) -> None:
    key = make_object(64)
    for name in ("a", "b", "c"):
        registry.register(name, key, 0, 64)
    registry.unregister("")
    assert registry.status() == []
    registry.unregister("")  # and again, on an empty registry
    for name in ("a", "b", "c"):
        with pytest.raises(
            FailedPrecondition, match=rf"^unregistered shared memory region: {name}$"
        ):
            registry.read(name, 0, 1)


def test_registering_a_name_twice_is_already_exists(
    registry: ShmRegistry, make_object: MakeObject
) -> None:
    key = make_object(8, b"abcdefgh")
    registry.register("r", key, 0, 8)
    for other in (make_object(8, b"22222222"), key):  # another object, or the same again
        with pytest.raises(GrpcError) as caught:
            registry.register("r", other, 0, 4)
        assert (caught.value.code, caught.value.message) == (
            StatusCode.ALREADY_EXISTS,
            "shared memory region 'r' already in manager",
        )
    assert registry.status() == [RegionStatus("r", key, 0, 8)]  # untouched
    assert registry.read("r", 0, 8) == b"abcdefgh"
    registry.unregister("r")
    registry.register("r", key, 2, 4)  # free again once unregistered
    assert registry.read("r", 0, 4) == b"cdef"


def test_registry_is_usable_after_close(registry: ShmRegistry, make_object: MakeObject) -> None:
    key = make_object(8, b"abcdefgh")
    registry.register("r", key, 0, 8)
    registry.close()
    assert registry.status() == []
    registry.register("r", key, 0, 8)
    assert registry.read("r", 0, 3) == b"abc"


# --- register errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key_kind", "offset", "byte_size", "message"),
    [
        ("", "ok", 0, 8, "shared memory region name must not be empty"),
        ("r", "empty", 0, 8, "shared memory region 'r': key must not be empty"),
        ("r", "ok", -1, 8, "shared memory region 'r' (key '{key}'): offset must be >= 0, got -1"),
        ("r", "ok", 0, 0, "shared memory region 'r' (key '{key}'): byte_size must be > 0, got 0"),
        ("r", "ok", 0, -5, "shared memory region 'r' (key '{key}'): byte_size must be > 0, got -5"),
        (
            "r",
            "ok",
            0,
            101,
            "shared memory region 'r' (key '{key}'): offset 0 + byte_size 101 = 101 "
            "exceeds the object's size of 100 bytes",
        ),
        (
            "r",
            "ok",
            60,
            41,
            "shared memory region 'r' (key '{key}'): offset 60 + byte_size 41 = 101 "
            "exceeds the object's size of 100 bytes",
        ),
        (
            "r",
            "ok",
            100,
            1,
            "shared memory region 'r' (key '{key}'): offset 100 + byte_size 1 = 101 "
            "exceeds the object's size of 100 bytes",
        ),
        (
            "r",
            "missing",
            0,
            8,
            "unable to open shared memory object '{key}' for region 'r': No such file or directory",
        ),
    ],
)
def test_register_errors(
    registry: ShmRegistry,
    make_object: MakeObject,
    name: str,
    key_kind: str,
    offset: int,
    byte_size: int,
    message: str,
) -> None:
    key = {"ok": make_object(100), "empty": "", "missing": _unique_key()}[key_kind]
    with pytest.raises(InvalidRequest) as info:
        registry.register(name, key, offset, byte_size)
    assert str(info.value) == message.format(key=key)
    assert info.value.grpc_status is StatusCode.INVALID_ARGUMENT
    assert registry.status() == []


@pytest.mark.parametrize("key", ["/", "//", "/.", "/..", "../../etc/passwd", "/a/b", "/x\0y"])
def test_register_rejects_keys_that_are_not_shm_names(registry: ShmRegistry, key: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        registry.register("r", key, 0, 8)
    assert (
        str(info.value)
        == f"unable to open shared memory object '{key}' for region 'r': invalid name"
    )


def test_register_rejects_a_symlink(registry: ShmRegistry, make_object: MakeObject) -> None:
    target = make_object(64)
    link = _unique_key()
    os.symlink(_path(target), _path(link))
    try:
        with pytest.raises(InvalidRequest, match=rf"^unable to open shared memory object '{link}'"):
            registry.register("r", link, 0, 8)
        assert not same_ipc_namespace(link)
    finally:
        os.unlink(_path(link))


def test_register_rejects_a_directory(registry: ShmRegistry) -> None:
    key = _unique_key()
    os.mkdir(_path(key))
    try:
        with pytest.raises(InvalidRequest, match=rf"^unable to open shared memory object '{key}'"):
            registry.register("r", key, 0, 8)
        assert not same_ipc_namespace(key)
    finally:
        os.rmdir(_path(key))


# --- read and write errors --------------------------------------------------------------


def test_read_and_write_of_unknown_region_fail_precondition(registry: ShmRegistry) -> None:
    message = r"^unregistered shared memory region: ghost$"
    with pytest.raises(FailedPrecondition, match=message) as info:
        registry.read("ghost", 0, 4)
    assert info.value.grpc_status is StatusCode.FAILED_PRECONDITION
    # Even with bad numbers, the missing region is what we report.
    with pytest.raises(FailedPrecondition, match=message):
        registry.read("ghost", -1, -1)
    with pytest.raises(FailedPrecondition, match=message):
        registry.write("ghost", 0, b"x")
    with pytest.raises(FailedPrecondition, match=message):
        registry.write("ghost", 0, b"x", byte_size=1)


@pytest.mark.parametrize(
    ("offset", "byte_size", "message"),
    [
        (-1, 4, "shared memory region 'r': read offset must be >= 0, got -1"),
        (0, -4, "shared memory region 'r': read byte_size must be >= 0, got -4"),
        (
            0,
            65,
            "shared memory region 'r': read offset 0 + byte_size 65 = 65 exceeds "
            "the region's byte_size 64",
        ),
        (
            60,
            8,
            "shared memory region 'r': read offset 60 + byte_size 8 = 68 exceeds "
            "the region's byte_size 64",
        ),
        (
            65,
            0,
            "shared memory region 'r': read offset 65 + byte_size 0 = 65 exceeds "
            "the region's byte_size 64",
        ),
    ],
)
def test_read_outside_region(
    registry: ShmRegistry, make_object: MakeObject, offset: int, byte_size: int, message: str
) -> None:
    # The object is bigger than the region: the region's bounds are what count.
    key = make_object(PAGE)
    registry.register("r", key, 100, 64)
    with pytest.raises(InvalidRequest) as info:
        registry.read("r", offset, byte_size)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("offset", "data", "slot", "message"),
    [
        (-1, b"x", None, "shared memory region 'r': write offset must be >= 0, got -1"),
        (
            0,
            b"x" * 65,
            None,
            "shared memory region 'r': write offset 0 + byte_size 65 = 65 "
            "exceeds the region's byte_size 64",
        ),
        (
            62,
            b"xyz",
            None,
            "shared memory region 'r': write offset 62 + byte_size 3 = 65 "
            "exceeds the region's byte_size 64",
        ),
        (
            0,
            b"x" * 9,
            8,
            "shared memory region 'r': 9 bytes do not fit the slot of byte_size 8 at offset 0",
        ),
        (
            32,
            b"x",
            40,
            "shared memory region 'r': write slot offset 32 + byte_size 40 = 72 "
            "exceeds the region's byte_size 64",
        ),
        (0, b"x", -1, "shared memory region 'r': write slot byte_size must be >= 0, got -1"),
    ],
)
def test_write_outside_region_or_slot(
    registry: ShmRegistry,
    make_object: MakeObject,
    offset: int,
    data: bytes,
    slot: int | None,
    message: str,
) -> None:
    key = make_object(PAGE, b"\xee" * PAGE)
    registry.register("r", key, 100, 64)
    with pytest.raises(InvalidRequest) as info:
        registry.write("r", offset, data, byte_size=slot)
    assert str(info.value) == message
    # A refused write changes nothing.
    assert registry.read("r", 0, 64) == b"\xee" * 64


def test_write_smaller_than_slot_leaves_the_rest(
    registry: ShmRegistry, make_object: MakeObject
) -> None:
    key = make_object(16, b"." * 16)
    registry.register("r", key, 0, 16)
    registry.write("r", 4, b"abc", byte_size=8)
    assert registry.read("r", 0, 16) == b"....abc........."


# --- detaching under a copy -------------------------------------------------------------


def test_copy_from_a_mapping_closed_under_it_fails_precondition(
    registry: ShmRegistry, make_object: MakeObject
) -> None:
    # Single-threaded stand-in for a thread that unregisters between our lookup
    # and our copy: the table still names the mapping, but it is closed.
    key = make_object(64)
    registry.register("r", key, 0, 64)
    registry._regions["r"].mm.close()
    message = r"^unregistered shared memory region: r$"
    with pytest.raises(FailedPrecondition, match=message):
        registry.read("r", 0, 8)
    with pytest.raises(FailedPrecondition, match=message):
        registry.write("r", 0, b"abc")


def test_reads_racing_unregister_and_register(
    registry: ShmRegistry, make_object: MakeObject
) -> None:
    size = 4 * PAGE
    key1 = make_object(size, b"\x01" * size)
    key2 = make_object(size, b"\x02" * size)
    registry.register("r", key1, 0, size)
    stop = threading.Event()
    seen: set[bytes] = set()
    unexpected: list[BaseException] = []
    detached = 0

    def reader() -> None:
        nonlocal detached
        while not stop.is_set():
            try:
                data = registry.read("r", 0, size)
            except FailedPrecondition:
                detached += 1
            except BaseException as exc:  # collected and asserted on below
                unexpected.append(exc)
                return
            else:
                seen.add(data)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(300):
            registry.unregister("r")
            registry.register("r", key1 if i % 2 else key2, 0, size)
    finally:
        stop.set()
        thread.join()

    assert unexpected == []
    assert seen <= {b"\x01" * size, b"\x02" * size}


# --- same_ipc_namespace -------------------------------------------------------------------


def test_same_ipc_namespace(
    make_object: MakeObject, triton_region: Callable[[str, int], tuple[object, str]]
) -> None:
    key = make_object(16)
    _, triton_key = triton_region("probe", 16)
    assert same_ipc_namespace(key)
    assert same_ipc_namespace(key.lstrip("/"))
    assert same_ipc_namespace(triton_key)
    assert not same_ipc_namespace("")
    assert not same_ipc_namespace(_unique_key())
    assert not same_ipc_namespace("/")
    assert not same_ipc_namespace("../../etc/passwd")


def test_same_ipc_namespace_works_on_a_read_only_object(make_object: MakeObject) -> None:
    key = make_object(16)
    os.chmod(_path(key), 0o400)
    assert same_ipc_namespace(key)


# --- the client owns the objects ------------------------------------------------------------


def test_close_never_unlinks(
    triton_region: Callable[[str, int], tuple[object, str]], make_object: MakeObject
) -> None:
    handle, key = triton_region("keep", 64)
    plain_key = make_object(64)
    triton_shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)])
    reg = ShmRegistry()
    reg.register("keep", key, 0, 64)
    reg.register("plain", plain_key, 0, 64)
    reg.unregister("plain")
    reg.close()

    assert os.path.exists(_path(key))
    assert os.path.exists(_path(plain_key))
    np.testing.assert_array_equal(
        triton_shm.get_contents_as_numpy(handle, np.int32, [16]), np.arange(16, dtype=np.int32)
    )


def test_a_worker_process_exiting_never_unlinks(
    triton_region: Callable[[str, int], tuple[object, str]],
) -> None:
    # The failure multiprocessing.shared_memory would cause: its resource tracker
    # unlinks what the exiting process attached to. Exit without close() too.
    _, key = triton_region("keep", 64)
    script = (
        "import sys; from rsgw.worker._shm import ShmRegistry; r = ShmRegistry(); "
        "r.register('keep', sys.argv[1], 0, 64); r.write('keep', 0, b'from-worker')"
    )
    subprocess.run([sys.executable, "-c", script, key], check=True, timeout=60)
    assert os.path.exists(_path(key))
    fd = os.open(_path(key), os.O_RDONLY)
    try:
        assert os.pread(fd, 11, 0) == b"from-worker"
    finally:
        os.close(fd)
