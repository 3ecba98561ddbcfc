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
import logging
import os
from collections.abc import Mapping
from typing import Protocol

import trio
from google.protobuf.message import DecodeError

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import ConfigError
from rsgw.base._methods import Method
from rsgw.grpc._client import Channel
from rsgw.node._gpus import visible_gpu_count
from rsgw.node._node import LOOPBACK, NodeConfig, load_node
from rsgw.node._supervision import public_addresses
from rsgw.runtime._net import split_host_port

logger = logging.getLogger(__name__)


class HasPort(Protocol):
    """What `repack_after_return` reads of the gateway child: its bound gRPC port."""

    grpc_port: int | None


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
    if len(node.workers) != 1 or node.server.external:
        # A server of its own is always behind the gateway, on its own port.
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


def probe_target(node: NodeConfig, worker: str | None = None) -> tuple[str, int]:
    """Where `probe_worker_ready` calls ServerReady: the sole worker, or the one named.

    Raises:
        ConfigError: no worker named and the node has more than one; an unknown name; a
            worker whose port is 0 (only known once it has started).
    """
    if worker is None:
        if len(node.workers) != 1:
            raise ConfigError(f"node has {len(node.workers)} workers; specify which to probe")
        spec = node.workers[0]
    else:
        found = node.worker(worker)
        if found is None:
            raise ConfigError(f"worker '{worker}' not defined in node")
        spec = found
    if not spec.port:
        raise ConfigError(f"worker '{spec.name}' has port 0 (picked at start-up); cannot probe it")
    return spec.dial_host, spec.port


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


async def request_repack(host: str, port: int) -> str | None:
    """Ask the gateway on `host:port` for a repack now, as `rsgw ctl repack --wait 0` does.

    The node asks when a server of its own came back from a restart under lpt_packing:
    it comes back empty (explicit model control), and the gateway carries its placement
    out again at a repack, loading there what it places there.

    Returns:
        None when the gateway took the request, else why not (one line: refused,
        TLS or a token required, no answer within `PROBE_DEADLINE_SECONDS`).
    """
    request = cpb.RepackRequest(wait_seconds=0).SerializeToString()
    with trio.move_on_after(PROBE_DEADLINE_SECONDS):
        try:
            async with trio.open_nursery() as nursery:
                channel = Channel(f"{host}:{port}", nursery)
                try:
                    deadline = trio.current_time() + PROBE_DEADLINE_SECONDS
                    await channel.unary(Method.REPACK.wire, request, deadline=deadline)
                finally:
                    await channel.aclose()
                    nursery.cancel_scope.cancel()
        except Exception as exc:  # whatever went wrong, the node reports it and goes on
            return str(exc) or type(exc).__name__
        return None
    return f"no answer within {PROBE_DEADLINE_SECONDS:g} s"


async def repack_after_return(gateway: HasPort, env: Mapping[str, str], worker: str) -> None:
    """`request_repack` of the node's gateway (on its bound gRPC port and the public gRPC
    host, loopback for a wildcard), logged either way."""
    port = gateway.grpc_port
    if port is None:
        return
    host = split_host_port(public_addresses(env)[0])[0]
    problem = await request_repack(LOOPBACK if host in ("", "0.0.0.0", "::") else host, port)
    if problem is None:
        logger.info("asked the gateway to repack: a worker came back", extra={"worker": worker})
    else:
        logger.warning(
            "could not ask the gateway to repack (rsgw ctl repack does the same)",
            extra={"worker": worker, "error": problem},
        )
