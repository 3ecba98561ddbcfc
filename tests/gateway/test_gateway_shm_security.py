"""Shared memory that only its owner can touch: the attacks of issue 20, tried for real.

Another user's /dev/shm object must be neither read nor written through the
gateway or a worker; one client must not unregister, re-point, see or use
another's region; quotas hold. The "other user" is a real process that drops to
uid 65534 (`tests.as_user`), so the server tells who it is the way it does in
production: from the kernel's socket table.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._methods import Method
from rsgw.config._config import AuthConfig, ShmConfig
from tests.gateway.fleet import open_fleet
from tests.helpers import in_thread

NOBODY = 65534
ROOT = Path(__file__).resolve().parents[2]
SECRET = b"the other tenant's tensor bytes!" * 4  # 128 bytes
BYTES = 64

as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or not Path("/proc/net/tcp").exists(),
    reason="needs root (to run a client as another user) and Linux /proc/net/tcp",
)


@contextlib.contextmanager
def shm_object(uid: int | None = None, data: bytes = SECRET) -> Iterator[str]:
    """A POSIX shm object holding `data`, mode 0600, owned by `uid` (default: us)."""
    key = f"/rsgw-sec-{uuid.uuid4().hex[:10]}"
    path = "/dev/shm" + key
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(fd, data.ljust(2 * BYTES, b"\0"))
        if uid is not None:
            os.fchown(fd, uid, uid)
        yield key
    finally:
        os.close(fd)
        os.unlink(path)


def read_object(key: str) -> bytes:
    with open("/dev/shm" + key, "rb") as f:
        return f.read()


def register_body(name: str, key: str, size: int = 2 * BYTES) -> bytes:
    return pb.SystemSharedMemoryRegisterRequest(
        name=name, key=key, byte_size=size
    ).SerializeToString()


def unregister_body(name: str = "") -> bytes:
    return pb.SystemSharedMemoryUnregisterRequest(name=name).SerializeToString()


def status_body(name: str = "") -> bytes:
    return pb.SystemSharedMemoryStatusRequest(name=name).SerializeToString()


def ipc_body(key: str) -> bytes:
    return pb.IsSameIPCNamespaceRequest(name=key).SerializeToString()


def shm_infer_body(region: str, output_region: str | None = None) -> bytes:
    """`simple` with both inputs read from `region` (and outputs written to another)."""
    request = pb.ModelInferRequest(model_name="simple")
    for i, name in enumerate(("INPUT0", "INPUT1")):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.parameters["shared_memory_region"].string_param = region
        tensor.parameters["shared_memory_byte_size"].int64_param = BYTES
        tensor.parameters["shared_memory_offset"].int64_param = i * BYTES
    if output_region is not None:
        for i, name in enumerate(("OUTPUT0", "OUTPUT1")):
            out = request.outputs.add(name=name)
            out.parameters["shared_memory_region"].string_param = output_region
            out.parameters["shared_memory_byte_size"].int64_param = BYTES
            out.parameters["shared_memory_offset"].int64_param = i * BYTES
    return request.SerializeToString()


def as_user(
    uid: int, target: str, calls: list[tuple[Method, bytes]], holding: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """Each call's (status name, details), made by a process running as `uid`."""
    return [(code, details) for code, details, _ in as_user_raw(uid, target, calls, holding)]


def as_user_raw(
    uid: int, target: str, calls: list[tuple[Method, bytes]], holding: Sequence[str] = ()
) -> list[tuple[str, str, bytes]]:
    """Each call's (status, details, reply), made by a process running as `uid` that
    holds the objects `holding` open."""
    wire = [[m.path, body.hex(), None] for m, body in calls]
    argv = [str(uid), target, json.dumps(wire), json.dumps(list(holding))]
    done = subprocess.run(
        [sys.executable, "-m", "tests.as_user", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [
        (code, details, bytes.fromhex(reply)) for code, details, reply in json.loads(done.stdout)
    ]


def call(target: str, method: Method, body: bytes, token: str | None = None) -> bytes:
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(target) as channel:
        reply = channel.unary_unary(method.path)(body, metadata=metadata, timeout=10)
    assert isinstance(reply, bytes)
    return reply


def stream_call(target: str, bodies: list[bytes], token: str) -> list[pb.ModelStreamInferResponse]:
    """ModelStreamInfer with `bodies`, as grpcio streams them; every reply."""
    metadata = (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(target) as channel:
        method = channel.stream_stream(Method.MODEL_STREAM_INFER.path)
        replies = method(iter(bodies), metadata=metadata, timeout=10)
        return [pb.ModelStreamInferResponse.FromString(r) for r in replies]


def code_of(target: str, method: Method, body: bytes, token: str | None = None) -> str:
    try:
        call(target, method, body, token)
    except grpc.RpcError as exc:
        return exc.code().name  # type: ignore[no-any-return]
    return "OK"


@as_root
async def test_another_users_object_can_be_neither_read_nor_written() -> None:
    async with open_fleet(2) as fleet:
        with shm_object() as victim, shm_object(uid=NOBODY, data=b"\1" * 128) as own:
            for target in (fleet.target, fleet.worker_url(0)):  # the gateway, and a worker
                results = await in_thread(
                    lambda: as_user(
                        NOBODY,
                        target,  # noqa: B023
                        [
                            (Method.SHM_REGISTER, register_body("steal", victim)),
                            (Method.MODEL_INFER, shm_infer_body("steal")),
                        ],
                    )
                )
                (register, _), (infer, _) = results
                assert register == "PERMISSION_DENIED", results
                assert "does not have it open or mapped" in results[0][1]
                assert infer != "OK"
            # The attacker's own object registers, computes and is written as usual.
            results = await in_thread(
                lambda: as_user(
                    NOBODY,
                    fleet.target,
                    [
                        (Method.SHM_REGISTER, register_body("mine", own)),
                        (Method.MODEL_INFER, shm_infer_body("mine", "mine")),
                        (Method.SHM_UNREGISTER, unregister_body("mine")),
                    ],
                    holding=[own],
                )
            )
            assert [code for code, _ in results] == ["OK"] * 3, results
            written = np.frombuffer(read_object(own)[: 2 * BYTES], dtype=np.int32)
            assert written[:16].tolist() == [2 * 0x01010101] * 16  # OUTPUT0 = a + b
            assert read_object(victim).startswith(SECRET)


@as_root
async def test_is_same_ipc_namespace_answers_only_for_the_clients_own_objects() -> None:
    async with open_fleet(1) as fleet:
        with shm_object() as victim, shm_object(uid=NOBODY) as own:
            wire = [(Method.IPC_NAMESPACE, ipc_body(k)) for k in (victim, own)]
            for target in (fleet.target, fleet.worker_url(0)):
                answers = await in_thread(
                    lambda: as_user_raw(NOBODY, target, wire, holding=[own])  # noqa: B023
                )
                replies = [reply for _, _, reply in answers]
                same = [pb.IsSameIPCNamespaceResponse.FromString(r).same for r in replies]
                assert same == [False, True], target


ALICE, BOB = "alice-shm-token-0123456789", "bob-shm-token-0123456789ab"


def tokens_file(tmp_path: Path) -> str:
    path = tmp_path / "tokens.yml"
    entries = [
        {"name": "alice", "token": ALICE, "roles": ["infer", "shm"]},
        {"name": "bob", "token": BOB, "roles": ["infer", "shm"]},
    ]
    path.write_text(yaml.safe_dump({"tokens": entries}))
    return str(path)


async def test_one_client_cannot_touch_anothers_region(tmp_path: Path) -> None:
    auth = AuthConfig(tokens_file=tokens_file(tmp_path))
    async with open_fleet(2, auth=auth) as fleet:
        t = fleet.target
        a = np.arange(16, dtype=np.int32)
        with shm_object(data=a.tobytes() + a.tobytes()) as alices, shm_object() as bobs:
            await in_thread(
                lambda: call(t, Method.SHM_REGISTER, register_body("in", alices), ALICE)
            )
            await in_thread(lambda: call(t, Method.SHM_REGISTER, register_body("b", bobs), BOB))
            attempts = {
                "unregister": (Method.SHM_UNREGISTER, unregister_body("in")),
                "re-point": (Method.SHM_REGISTER, register_body("in", bobs)),
                "status": (Method.SHM_STATUS, status_body("in")),
                "use": (Method.MODEL_INFER, shm_infer_body("in")),
            }
            got = {
                what: await in_thread(lambda m=m, b=b: code_of(t, m, b, BOB))  # type: ignore[misc]
                for what, (m, b) in attempts.items()
            }
            assert got == {
                "unregister": "PERMISSION_DENIED",
                "re-point": "PERMISSION_DENIED",
                "status": "NOT_FOUND",
                "use": "PERMISSION_DENIED",
            }
            # Nor through a stream: the message is answered with the refusal.
            replies = await in_thread(lambda: stream_call(t, [shm_infer_body("in")], BOB))
            (only,) = replies
            assert "registered by another client" in only.error_message
            listing = pb.SystemSharedMemoryStatusResponse.FromString(
                await in_thread(lambda: call(t, Method.SHM_STATUS, status_body(), BOB))
            )
            assert set(listing.regions) == {"b"}
            # Bob's unregister-all clears his regions only; Alice computes on her data.
            await in_thread(lambda: call(t, Method.SHM_UNREGISTER, unregister_body(), BOB))
            for _ in range(4):  # every worker
                reply = pb.ModelInferResponse.FromString(
                    await in_thread(
                        lambda: call(t, Method.MODEL_INFER, shm_infer_body("in"), ALICE)
                    )
                )
                out = np.frombuffer(reply.raw_output_contents[0], dtype=np.int32)
                np.testing.assert_array_equal(out, a + a)
            mine = pb.SystemSharedMemoryStatusResponse.FromString(
                await in_thread(lambda: call(t, Method.SHM_STATUS, status_body(), ALICE))
            )
            assert set(mine.regions) == {"in"}


async def test_per_client_quotas(tmp_path: Path) -> None:
    auth = AuthConfig(tokens_file=tokens_file(tmp_path))
    quota = ShmConfig(max_regions_per_client=2, max_bytes_per_client=3 * 2 * BYTES)
    async with open_fleet(1, auth=auth, shm=quota) as fleet:
        t = fleet.target
        with shm_object() as key:
            codes = [
                await in_thread(
                    lambda n=n: code_of(t, Method.SHM_REGISTER, register_body(n, key), ALICE)  # type: ignore[misc]
                )
                for n in ("r1", "r2", "r3")
            ]
            assert codes == ["OK", "OK", "RESOURCE_EXHAUSTED"]
            # Another client has its own quota; bytes count too.
            assert (
                await in_thread(
                    lambda: code_of(t, Method.SHM_REGISTER, register_body("x", key), BOB)
                )
                == "OK"
            )
            big = register_body("y", key, size=2 * BYTES)
            await in_thread(lambda: call(t, Method.SHM_UNREGISTER, unregister_body("r1"), ALICE))
            assert await in_thread(lambda: code_of(t, Method.SHM_REGISTER, big, ALICE)) == "OK"


async def test_key_prefix_policy(tmp_path: Path) -> None:
    async with open_fleet(1, shm=ShmConfig(key_prefix="rsgw-ok-")) as fleet:
        with shm_object() as key:
            with pytest.raises(grpc.RpcError) as caught:
                await in_thread(
                    lambda: call(fleet.target, Method.SHM_REGISTER, register_body("r", key))
                )
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "keys must start with 'rsgw-ok-'" in caught.value.details()


@as_root
async def test_a_process_of_the_same_user_cannot_register_anothers_object() -> None:
    """Root, even: only a process that has the object open or mapped may register it."""
    async with open_fleet(1) as fleet:
        with shm_object() as victim:
            for target in (fleet.target, fleet.worker_url(0)):
                (result,) = await in_thread(
                    lambda: as_user(
                        0,
                        target,  # noqa: B023
                        [(Method.SHM_REGISTER, register_body("steal", victim))],
                    )
                )
                assert result[0] == "PERMISSION_DENIED", result
            # The same process holding it open may.
            (result,) = await in_thread(
                lambda: as_user(
                    0,
                    fleet.target,
                    [(Method.SHM_REGISTER, register_body("ok", victim))],
                    holding=[victim],
                )
            )
            assert result[0] == "OK", result
