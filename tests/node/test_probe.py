"""`probe_worker_ready`: which worker it asks, and what it answers (docs/original.md §8.5).

The ready and not-ready answers come from real gRPC servers on loopback port 0: a
simulated worker, and scripted servers for what a healthy simulated worker never does
(answer ready=false, or never answer). The node files name the bound ports.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import yaml

import rsgw
from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._call import CallContext
from rsgw.grpc._server import GrpcServer
from rsgw.node._node import load_node
from rsgw.node._probe import PROBE_DEADLINE_SECONDS, probe_address, server_ready
from rsgw.worker._worker import WorkerConfig, open_worker
from rsgw.worker.models._catalogue import builtin_catalogue

SERVER_READY = "/inference.GRPCInferenceService/ServerReady"


def write_node(tmp_path: Path, workers: list[dict[str, object]]) -> Path:
    path = tmp_path / "node.yml"
    path.write_text(yaml.safe_dump({"model_repo": "builtin", "workers": workers}))
    return path


def free_port() -> int:
    """A port nothing listens on (bound and closed again; probing it is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def scripted_server(
    handler: Callable[[bytes, CallContext], Awaitable[bytes]],
) -> AsyncIterator[int]:
    """A gRPC server whose ServerReady is `handler`; yields its port."""
    server = GrpcServer({SERVER_READY: handler})
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(server.serve, "127.0.0.1", 0)
        yield port
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def simulated_worker(name: str = "w") -> AsyncIterator[int]:
    config = WorkerConfig(
        name=name, port=0, metrics_port=-1, catalogue=builtin_catalogue(), host="127.0.0.1"
    )
    async with open_worker(config) as worker:
        yield worker.grpc_port


async def test_ready_worker_of_a_multi_worker_node(tmp_path: Path) -> None:
    async with simulated_worker() as port:
        node = write_node(
            tmp_path, [{"name": "a", "port": free_port()}, {"name": "b", "port": port}]
        )
        assert await rsgw.probe_worker_ready(node, "b") is True
        # Nothing listens on a's port: refused, so not ready (and no exception).
        assert await rsgw.probe_worker_ready(node, "a") is False


async def test_sole_worker_is_the_default_and_probed_on_the_public_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/product.md §6: a single-worker node's worker binds the public gRPC address, so
    # its node-file port (here a dead one) is not where it listens.
    node = write_node(tmp_path, [{"name": "only", "port": free_port()}])
    async with simulated_worker() as port:
        monkeypatch.setenv("REACTANT_GATEWAY_LISTEN_GRPC", f"0.0.0.0:{port}")
        assert await rsgw.probe_worker_ready(node) is True
        assert await rsgw.probe_worker_ready(str(node), "only") is True


async def test_a_worker_answering_not_ready_is_not_ready(tmp_path: Path) -> None:
    async def not_ready(body: bytes, call: CallContext) -> bytes:
        return pb.ServerReadyResponse(ready=False).SerializeToString()

    async with scripted_server(not_ready) as port:
        node = write_node(tmp_path, [{"name": "a", "port": port}, {"name": "b", "port": 1}])
        assert await rsgw.probe_worker_ready(node, "a") is False


async def test_a_hung_worker_is_not_ready_after_the_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def hang(body: bytes, call: CallContext) -> bytes:
        await trio.sleep_forever()

    async with scripted_server(hang) as port:
        # The deadline itself, timed without probe_worker_ready's GPU count (a thread,
        # during which the autojump clock may move).
        start = trio.current_time()
        assert await server_ready("127.0.0.1", port) is False
        assert trio.current_time() - start == pytest.approx(PROBE_DEADLINE_SECONDS, abs=0.1)
        node = write_node(tmp_path, [{"name": "a", "port": port}, {"name": "b", "port": 1}])
        assert await rsgw.probe_worker_ready(node, "a") is False


@pytest.mark.parametrize(
    ("workers", "choice", "message"),
    [
        ([{"name": "a", "port": 9001}, {"name": "b", "port": 9002}], None, "node has 2 workers"),
        ([{"name": "a", "port": 9001}, {"name": "b", "port": 9002}], "zz", "worker 'zz' not"),
        ([{"name": "a", "port": 9001}], "zz", "worker 'zz' not defined in node"),
        ([{"name": "a", "port": 0}, {"name": "b", "port": 9002}], "a", "port 0"),
    ],
)
async def test_bad_worker_choice_raises_config_error(
    tmp_path: Path, workers: list[dict[str, object]], choice: str | None, message: str
) -> None:
    with pytest.raises(rsgw.ConfigError, match=message):
        await rsgw.probe_worker_ready(write_node(tmp_path, workers), choice)


async def test_missing_or_invalid_node_file_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(rsgw.ConfigError, match="node file not found"):
        await rsgw.probe_worker_ready(tmp_path / "absent.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("base_port: 8080\n")
    with pytest.raises(rsgw.ConfigError, match="model_repo is required"):
        await rsgw.probe_worker_ready(bad)


def test_probe_address_follows_the_node_file_and_the_public_port(tmp_path: Path) -> None:
    node = load_node(
        write_node(tmp_path, [{"name": "a"}, {"name": "b", "port": 9050, "host": "0.0.0.0"}])
    )
    assert probe_address(node, "a", {}) == ("127.0.0.1", 8080)
    assert probe_address(node, "b", {}) == ("127.0.0.1", 9050)
    sole = load_node(write_node(tmp_path, [{"name": "a", "port": 9050}]))
    assert probe_address(sole, None, {}) == ("127.0.0.1", 8001)
    env = {"REACTANT_GATEWAY_LISTEN_GRPC": "10.0.0.1:7001"}
    assert probe_address(sole, "a", env) == ("127.0.0.1", 7001)
    with pytest.raises(rsgw.ConfigError, match="public gRPC port, which is 0"):
        probe_address(sole, None, {"REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:0"})
