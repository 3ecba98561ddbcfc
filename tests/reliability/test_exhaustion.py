"""Out of file descriptors: refuse what does not fit, keep serving, never exit.

Real processes under `prlimit` with a small, fixed descriptor limit (so our own
raise of the soft limit cannot help): a worker asked for more shared memory regions
than it may hold refuses them RESOURCE_EXHAUSTED and still takes new connections;
a gateway whose clients take every descriptor waits at accept() and serves again
once they let go.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from collections.abc import Iterator
from multiprocessing import shared_memory

import grpc
import pytest

from rsgw._proto import grpc_predict_v2_pb2 as pb
from tests.helpers import (
    WorkerProcess,
    check_simple,
    start_rsgw_process,
    start_worker_process,
    unary_call,
    wait_until,
)

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")

FD_LIMIT = 128
LIMITED = ("prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", "--")
REGISTER = "/inference.GRPCInferenceService/SystemSharedMemoryRegister"


@pytest.fixture
def limited_worker() -> Iterator[WorkerProcess]:
    worker = start_worker_process(prefix=LIMITED)
    yield worker
    worker.stop()


def _register(target: str, name: str, key: str) -> grpc.StatusCode:
    request = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=64)
    try:
        unary_call(target, REGISTER, request.SerializeToString())
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_shm_registrations_past_the_limit_are_refused_and_the_worker_serves_on(
    limited_worker: WorkerProcess,
) -> None:
    region = shared_memory.SharedMemory(create=True, size=4096)
    try:
        key = "/" + region.name.lstrip("/")
        codes = [_register(limited_worker.target, f"r{i}", key) for i in range(FD_LIMIT)]
        assert codes[0] is grpc.StatusCode.OK
        refused = codes.index(grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert refused <= FD_LIMIT // 2
        assert set(codes[refused:]) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        # New connections still work (each test helper call opens one).
        for seed in range(3):
            check_simple(limited_worker.target, seed)
        assert limited_worker.process.poll() is None
    finally:
        region.close()
        region.unlink()


def test_a_gateway_out_of_descriptors_waits_and_serves_again(
    limited_worker: WorkerProcess,
) -> None:
    env = dict(os.environ)
    env |= {
        "REACTANT_GATEWAY_WORKERS": limited_worker.target,
        "REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_METRICS": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_HTTP": "127.0.0.1:0",
    }
    gateway = start_rsgw_process("run", event="gateway serving", env=env, prefix=LIMITED)
    hogs: list[socket.socket] = []
    try:
        target = f"127.0.0.1:{gateway.grpc_port}"
        check_simple(target)
        for _ in range(FD_LIMIT + 32):  # more than the gateway can hold
            with contextlib.suppress(OSError):
                hogs.append(socket.create_connection(("127.0.0.1", gateway.grpc_port), 2))
        wait_until(
            lambda: "cannot accept a connection now" in gateway.log(), what="the accept warning"
        )
        assert gateway.process.poll() is None
        for hog in hogs:
            hog.close()
        hogs.clear()
        check_simple(target, seed=1)  # serves again once descriptors are free
        assert gateway.process.poll() is None
    finally:
        for hog in hogs:
            hog.close()
        gateway.stop()
