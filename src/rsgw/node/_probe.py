"""`probe_worker_ready`: a worker's KServe ServerReady, as a container health check.

docs/original.md §8.5: resolve the worker's port from the node file, call ServerReady on
127.0.0.1 with a 5 s deadline, and answer its `ready`, or false on any failure (refused,
reset, hung, a bad reply). The original is a replacement for a Go healthprobe binary, so
the answer is a bool for `rsgw probe`'s exit status, never an exception about the
worker; only a bad node file or worker choice raises, since no retry can fix those.

Where the worker listens follows the supervisor, not just the node file: the worker of
a single-worker node binds the public gRPC address itself (docs/product.md §6; see
`rsgw.node._supervisor`), so that is where we probe it. GPUs are counted as the supervisor
counts them, so `gpus: auto` synthesizes the same workers here as there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

import trio
from google.protobuf.message import DecodeError

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import ConfigError
from rsgw.base._methods import Method
from rsgw.grpc._client import Channel
from rsgw.node._gpus import visible_gpu_count
from rsgw.node._node import LOOPBACK, NodeConfig, load_node, probe_target
from rsgw.node._supervision import public_addresses
from rsgw.runtime._net import split_host_port

# docs/original.md §8.5: the probe's deadline.
PROBE_DEADLINE_SECONDS = 5.0
_READY_REQUEST = pb.ServerReadyRequest().SerializeToString()


def probe_address(
    node: NodeConfig, worker: str | None = None, env: Mapping[str, str] = os.environ
) -> tuple[str, int]:
    """Where the supervisor runs `worker` (or the node's only worker), to dial from the node.

    Raises:
        ConfigError: no worker named on a node with several (`node has N workers;
            specify which to probe`), an unknown name (`worker '<w>' not defined in
            node`), or a port picked at start-up (0), which no file can tell us.
    """
    if len(node.workers) != 1:
        return probe_target(node, worker)
    if worker is not None and node.worker(worker) is None:
        raise ConfigError(f"worker '{worker}' not defined in node")
    # The sole worker binds the public host (0.0.0.0 by default); we dial loopback.
    port = split_host_port(public_addresses(env)[0])[1]
    if not port:
        raise ConfigError(
            f"worker '{node.workers[0].name}' serves the public gRPC port, which is 0 "
            "(picked at start-up); cannot probe it"
        )
    return LOOPBACK, port


async def server_ready(host: str, port: int) -> bool:
    """One ServerReady call with a `PROBE_DEADLINE_SECONDS` deadline; False on any failure."""
    reply: bytes | None = None
    with trio.move_on_after(PROBE_DEADLINE_SECONDS):
        # The health-check boundary: whatever went wrong, the answer is "not ready".
        with contextlib.suppress(Exception):
            async with trio.open_nursery() as nursery:
                channel = Channel(f"{host}:{port}", nursery)
                try:
                    deadline = trio.current_time() + PROBE_DEADLINE_SECONDS
                    reply = await channel.unary(
                        Method.SERVER_READY.wire, _READY_REQUEST, deadline=deadline
                    )
                finally:
                    await channel.aclose()
                    nursery.cancel_scope.cancel()
    if reply is None:
        return False
    try:
        return bool(pb.ServerReadyResponse.FromString(reply).ready)
    except DecodeError:  # an answer that is not a ServerReadyResponse: not ready
        return False


async def probe_worker_ready(node_file: str | os.PathLike[str], worker: str | None = None) -> bool:
    """Whether a worker of the node in `node_file` answers ServerReady with ready.

    Args:
        node_file: the node file the supervisor runs (docs/original.md §8.5).
        worker: the worker's name; may be omitted when the node has one worker.

    Returns:
        The worker's `ready`, or False if it could not be reached, did not answer within
        5 s, or answered with an error.

    Raises:
        ConfigError: the node file is missing or invalid, or the worker choice is (see
            `probe_address`).
    """
    gpus = await trio.to_thread.run_sync(visible_gpu_count)
    node = load_node(node_file, visible_gpus=gpus)
    host, port = probe_address(node, worker)
    return await server_ready(host, port)
