"""Model control, the IPC namespace probe and compaction through the gateway.

Each is a fan-out (`rsgw.gateway.calls._broadcast`) with its own rule:
- RepositoryModelLoad goes to the workers that should hold the model (its
  lpt_packing placement, every worker in the other modes), all or nothing: where
  some loaded and others failed, the ones that loaded unload again;
- RepositoryModelUnload goes everywhere and succeeds if any worker unloaded;
  either answers once the routing table agrees (the prober rediscovers first);
- IsSameIPCNamespace is true only if every worker sees the client's region (any of
  them may serve a later ModelInfer; one that does not implement the call cannot
  say so), and never says anything about another user's objects;
- CompactMemory compacts every worker and sums the models they reloaded.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import GrpcError, RsgwError
from rsgw.base._methods import Method
from rsgw.base._shm_access import may_see
from rsgw.base._status import StatusCode
from rsgw.grpc._metering import metered
from rsgw.grpc._typed import typed_unary

if TYPE_CHECKING:
    from rsgw.base._call import CallContext, UnaryHandler
    from rsgw.config._blocks import ShmConfig
    from rsgw.gateway.calls._broadcast import FanOut
    from rsgw.gateway.fleet._pool import WorkerPool
    from rsgw.gateway.fleet._prober import Prober
    from rsgw.gateway.observe._metrics import GatewayMetrics

logger = logging.getLogger(__name__)

#: Deadline of IsSameIPCNamespace calls to workers.
IPC_DEADLINE = 5.0
#: CompactMemory and model loads may move weights: at least this long (the original's
#: 300 s floor for compaction).
SLOW_MIN_DEADLINE = 300.0


class FleetCalls:
    """Model control, IsSameIPCNamespace and CompactMemory; see the module docstring."""

    def __init__(
        self,
        pool: WorkerPool,
        prober: Prober,
        metrics: GatewayMetrics,
        fan: FanOut,
        shm: ShmConfig,
    ) -> None:
        self.pool = pool
        self.prober = prober
        self.metrics = metrics
        self.fan = fan
        self.shm = shm

    def handlers(self) -> dict[Method, UnaryHandler]:
        """The handler table of these RPCs."""
        return {
            Method.REPOSITORY_MODEL_LOAD: typed_unary(
                pb.RepositoryModelLoadRequest, self.model_load
            ),
            Method.REPOSITORY_MODEL_UNLOAD: typed_unary(
                pb.RepositoryModelUnloadRequest, self.model_unload
            ),
            Method.IPC_NAMESPACE: typed_unary(
                pb.IsSameIPCNamespaceRequest, self.is_same_ipc_namespace
            ),
            Method.COMPACT_MEMORY: typed_unary(cpb.CompactMemoryRequest, self.compact_memory),
        }

    async def model_load(
        self, request: pb.RepositoryModelLoadRequest, call: CallContext
    ) -> pb.RepositoryModelLoadResponse:
        """Load on every worker that should hold the model; undone if any fails."""
        method = Method.REPOSITORY_MODEL_LOAD
        with metered(call, self.metrics.observer(method.rpc)):
            urls = self.fan.targets.holders(request.model_name, method)
            undo = self.fan.undoer(
                Method.REPOSITORY_MODEL_UNLOAD,
                pb.RepositoryModelUnloadRequest(model_name=request.model_name).SerializeToString(),
            )
            deadline = self.fan.deadline(call, SLOW_MIN_DEADLINE)
            await self.fan.all_or_nothing(method, request.SerializeToString(), urls, deadline, undo)
            await self.prober.discovery.rediscover()
            return pb.RepositoryModelLoadResponse()

    async def model_unload(
        self, request: pb.RepositoryModelUnloadRequest, call: CallContext
    ) -> pb.RepositoryModelUnloadResponse:
        """Unload everywhere it is held; succeeds if any worker did."""
        method = Method.REPOSITORY_MODEL_UNLOAD
        with metered(call, self.metrics.observer(method.rpc)):
            body = request.SerializeToString()
            urls = self.fan.targets.every(method)
            await self.fan.any_succeeds(method, body, urls, self.fan.deadline(call), gated=False)
            await self.prober.discovery.rediscover()
            return pb.RepositoryModelUnloadResponse()

    # -- answered by asking everyone ----------------------------------------------------

    async def is_same_ipc_namespace(
        self, request: pb.IsSameIPCNamespaceRequest, call: CallContext
    ) -> pb.IsSameIPCNamespaceResponse:
        """True only if every worker sees the client's region (any may serve it later)."""
        method = Method.IPC_NAMESPACE
        with metered(call, self.metrics.observer(method.rpc)):
            shm = self.shm
            if not may_see(
                call.client,
                request.name,
                allow_remote=shm.allow_remote_clients,
                key_prefix=shm.key_prefix,
            ):
                return pb.IsSameIPCNamespaceResponse(same=False)  # nothing about others' objects
            deadline = min(call.deadline, trio.current_time() + IPC_DEADLINE)
            members = self.fan.targets.members()
            urls = self.fan.targets.capable(members, method)  # one that lacks it: false
            results = await self.fan.ask(
                method, request.SerializeToString(), urls, deadline, gated=False
            )
            same = bool(results) and len(urls) == len(members)
            for url, result in results.items():
                if isinstance(result, RsgwError):
                    logger.warning(
                        "IsSameIPCNamespace failed on a worker; counting it as false",
                        extra={"worker": self.pool.label(url), "error": str(result)},
                    )
                    same = False
                elif not pb.IsSameIPCNamespaceResponse.FromString(result).same:
                    same = False
            return pb.IsSameIPCNamespaceResponse(same=same)

    async def compact_memory(
        self, request: cpb.CompactMemoryRequest, call: CallContext
    ) -> cpb.CompactMemoryResponse:
        """Compact every worker; the answer sums the models they reloaded."""
        method = Method.COMPACT_MEMORY
        with metered(call, self.metrics.observer(method.rpc)):
            urls = self.fan.targets.every(method)
            deadline = self.fan.deadline(call, SLOW_MIN_DEADLINE)
            results = await self.fan.ask(
                method, request.SerializeToString(), urls, deadline, gated=False
            )
            failed = [url for url in urls if isinstance(results[url], RsgwError)]
            if failed and len(failed) == len(urls):
                raise GrpcError(
                    StatusCode.UNAVAILABLE,
                    f"compaction failed on every worker ({self.fan.why(failed, results)})",
                )
            reloaded = sum(
                cpb.CompactMemoryResponse.FromString(r).reloaded_models
                for r in results.values()
                if isinstance(r, bytes)
            )
            return cpb.CompactMemoryResponse(reloaded_models=reloaded)
