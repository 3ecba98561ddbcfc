"""The KServe V2 / Triton RPCs about the server and its models, beyond ModelInfer.

Three kinds, by who can answer:
- **The gateway itself**: ServerLive (true while it serves), ServerReady (the rule of
  `/readyz`: some worker is ready), ServerMetadata (the fleet's identity as its ready
  workers report it, with the extensions every one of them has; `server_metadata:` in
  gateway.yml overrides the name and the version).
- **One replica of the model**, routed by the request's model name (field 1, read from
  the raw bytes as ModelInfer's is) with ModelInfer's failover rule: ModelReady,
  ModelMetadata, ModelConfig. ModelStatistics of one model asks every replica and
  sums their answers: each replica holds a share of the model's work, and one
  share is not the model's statistics. A model no worker serves
  is NOT_FOUND in Triton's words; one whose replicas are all down is UNAVAILABLE
  (ModelReady answers `ready: false` for both, as Triton does).
- **Every worker, merged**: ModelStatistics with no name (per model and version, the
  counts and durations add, the last inference is the latest; memory usage is listed
  per worker, it does not add up across GPUs) and RepositoryIndex (one row per model
  and version: READY if any replica is, else the first worker's state and reason).

These calls are not admitted against the inference cap and do not go through the
scheduler: they are cheap, and a client makes them before its first inference.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING

import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._version import __version__
from rsgw.base._errors import DecodeError, GrpcError, RsgwError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._config import ServerMetadataConfig
from rsgw.gateway.fleet._pool import fan_out
from rsgw.grpc._metering import metered
from rsgw.grpc._typed import typed_unary
from rsgw.runtime._logging import log_limited
from rsgw.scheduling.calls._merge import merge_indexes, merge_statistics
from rsgw.scheduling.calls._plan import RouteWalk, no_ready_replica
from rsgw.scheduling.calls._routing import READY_STATE
from rsgw.scheduling.calls._wire import peek_header

if TYPE_CHECKING:
    from rsgw.base._call import CallContext, UnaryHandler
    from rsgw.gateway.calls._broadcast import Targets
    from rsgw.gateway.calls._resolve import Resolver
    from rsgw.gateway.fleet._pool import WorkerPool
    from rsgw.gateway.fleet._prober import Prober
    from rsgw.gateway.observe._metrics import GatewayMetrics

logger = logging.getLogger(__name__)

#: Deadline of the gateway's own calls to workers for these RPCs.
DEFAULT_DEADLINE = 10.0
#: What ServerMetadata says when no worker answers.
FALLBACK_NAME = "rsgw"

#: The RPCs routed to one replica of the model their request names.
_ROUTED = (
    Method.MODEL_READY,
    Method.MODEL_METADATA,
    Method.MODEL_CONFIG,
    Method.MODEL_STATISTICS,
)
_NOT_READY = pb.ModelReadyResponse(ready=False).SerializeToString()


class ModelCalls:
    """The handlers of the RPCs above, over the gateway's pool and prober."""

    def __init__(
        self,
        pool: WorkerPool,
        prober: Prober,
        metrics: GatewayMetrics,
        resolver: Resolver,
        targets: Targets,
        *,
        request_timeout: float = DEFAULT_DEADLINE,
        identity: ServerMetadataConfig | None = None,
    ) -> None:
        self.pool = pool
        self.identity = identity or ServerMetadataConfig()
        self.prober = prober
        self.metrics = metrics
        self.resolver = resolver
        self.targets = targets
        self.request_timeout = request_timeout
        self._turn = itertools.count()

    def handlers(self) -> dict[Method, UnaryHandler]:
        table: dict[Method, UnaryHandler] = {
            Method.SERVER_LIVE: typed_unary(pb.ServerLiveRequest, self.server_live),
            Method.SERVER_READY: typed_unary(pb.ServerReadyRequest, self.server_ready),
            Method.SERVER_METADATA: typed_unary(pb.ServerMetadataRequest, self.server_metadata),
            Method.REPOSITORY_INDEX: typed_unary(pb.RepositoryIndexRequest, self.repository_index),
        }
        for method in _ROUTED:
            table[method] = self._routed(method)
        return table

    # -- answered by the gateway --------------------------------------------------------

    async def server_live(
        self, request: pb.ServerLiveRequest, call: CallContext
    ) -> pb.ServerLiveResponse:
        with metered(call, self.metrics.observer(Method.SERVER_LIVE.rpc)):
            return pb.ServerLiveResponse(live=True)

    async def server_ready(
        self, request: pb.ServerReadyRequest, call: CallContext
    ) -> pb.ServerReadyResponse:
        with metered(call, self.metrics.observer(Method.SERVER_READY.rpc)):
            return pb.ServerReadyResponse(ready=self.prober.serving)

    async def server_metadata(
        self, request: pb.ServerMetadataRequest, call: CallContext
    ) -> pb.ServerMetadataResponse:
        """The ready workers' name and version, and the extensions all of them have."""
        with metered(call, self.metrics.observer(Method.SERVER_METADATA.rpc)):
            ready = self.targets.ready(Method.SERVER_METADATA)
            results = await self._everyone(ready, Method.SERVER_METADATA, b"", call)
            answers = [
                pb.ServerMetadataResponse.FromString(reply)
                for url in ready
                if isinstance(reply := results.get(url), bytes)
            ]
            if answers:
                first = answers[0]
                common = set(first.extensions).intersection(*(a.extensions for a in answers))
                name, version = first.name, first.version
                extensions = [e for e in first.extensions if e in common]
            else:
                name, version, extensions = FALLBACK_NAME, __version__, []
            return pb.ServerMetadataResponse(
                name=self.identity.name or name,
                version=self.identity.version or version,
                extensions=extensions,
            )

    # -- routed to one replica ----------------------------------------------------------

    def _routed(self, method: Method) -> UnaryHandler:
        observe = self.metrics.observer(method.rpc)

        async def handler(body: bytes, call: CallContext) -> bytes:
            with metered(call, observe) as meter:
                try:
                    model, _ = peek_header(body)
                except DecodeError as exc:
                    raise GrpcError(
                        StatusCode.INVALID_ARGUMENT, f"malformed {method.rpc}Request: {exc}"
                    ) from exc
                if not model and method is Method.MODEL_STATISTICS:
                    return await self._all_statistics(body, call)
                try:
                    deadline = None if method is Method.MODEL_READY else call.deadline
                    replicas = await self.resolver.resolve(model, method, deadline)
                except GrpcError:
                    if method is Method.MODEL_READY:
                        return _NOT_READY
                    meter.label = self.resolver.label(model)
                    raise
                meter.label = model
                if method is Method.MODEL_STATISTICS:
                    return await self._model_statistics(model, replicas, body, call)
                return await self._forward(method, model, replicas, body, call)

        return handler

    async def _forward(
        self, method: Method, model: str, replicas: tuple[str, ...], body: bytes, call: CallContext
    ) -> bytes:
        """One replica answers, in rotation; the others only if it certainly did not."""
        start = next(self._turn) % len(replicas)
        order = replicas[start:] + replicas[:start]
        walk = RouteWalk(model, order, replicas, 0)
        deadline = min(call.deadline, trio.current_time() + self.request_timeout)
        while (url := walk.next(_never_full)) is not None:
            try:
                return await self.pool.channels[url].unary(method.wire, body, deadline=deadline)
            except RsgwError as exc:
                expired = trio.current_time() >= deadline
                answer = walk.failed(url, exc, expired=expired, who=self.pool.public_name(url))
                if answer is not None:
                    raise answer from exc
        raise walk.outcome()

    # -- merged over every worker -------------------------------------------------------

    async def _model_statistics(
        self, model: str, replicas: tuple[str, ...], body: bytes, call: CallContext
    ) -> bytes:
        """One model's statistics summed over its replicas (each holds a share of its work)."""
        results = await self._everyone(replicas, Method.MODEL_STATISTICS, body, call)
        answers = [r for r in results.values() if isinstance(r, bytes)]
        if not answers:
            first = next(iter(results.values()))
            if isinstance(first, GrpcError):
                raise GrpcError(first.code, first.message)
            raise no_ready_replica(model)
        merged = merge_statistics([pb.ModelStatisticsResponse.FromString(r) for r in answers])
        return merged.SerializeToString()

    async def _all_statistics(self, body: bytes, call: CallContext) -> bytes:
        ready = self.targets.ready(Method.MODEL_STATISTICS)
        results = await self._everyone(ready, Method.MODEL_STATISTICS, body, call)
        answers = [
            pb.ModelStatisticsResponse.FromString(reply)
            for url in ready
            if isinstance(reply := results.get(url), bytes)
        ]
        if ready and not answers:
            raise GrpcError(StatusCode.UNAVAILABLE, "no worker answered ModelStatistics")
        return merge_statistics(answers).SerializeToString()

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, call: CallContext
    ) -> pb.RepositoryIndexResponse:
        """One row per model and version: READY if any replica is.

        Workers without a RepositoryIndex of their own are listed by what discovery
        found them serving (ready, no version).
        """
        with metered(call, self.metrics.observer(Method.REPOSITORY_INDEX.rpc)):
            body = request.SerializeToString()
            members = self.targets.members()
            urls = self.targets.capable(members, Method.REPOSITORY_INDEX)
            results = await self._everyone(urls, Method.REPOSITORY_INDEX, body, call)
            answers = [
                pb.RepositoryIndexResponse.FromString(reply)
                for url in urls  # configured order: "the first worker's reason" is stable
                if isinstance(reply := results.get(url), bytes)
            ]
            unindexed = set(members) - set(urls)
            if unindexed:
                answers.append(self._discovered_on(unindexed))
            return merge_indexes(answers)

    def _discovered_on(self, urls: set[str]) -> pb.RepositoryIndexResponse:
        """The models discovery found ready on `urls`, as index rows."""
        served = sorted(
            model
            for model, replicas in self.prober.discovery.table.models.items()
            if urls & set(replicas)
        )
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponse.ModelIndex(name=model, state=READY_STATE)
                for model in served
            ]
        )

    async def _everyone(
        self, urls: tuple[str, ...] | list[str], method: Method, body: bytes, call: CallContext
    ) -> dict[str, bytes | RsgwError]:
        deadline = min(call.deadline, trio.current_time() + self.request_timeout)

        async def one(url: str) -> bytes:
            return await self.pool.channels[url].unary(method.wire, body, deadline=deadline)

        results = await fan_out(urls, one)
        for url, result in results.items():
            if isinstance(result, RsgwError):
                worker = self.pool.label(url)
                extra = {"rpc": method.rpc, "worker": worker, "error": str(result)}
                log_limited(
                    logger, logging.WARNING, "worker did not answer", extra, (method.rpc, worker)
                )
        return results


def _never_full(url: str) -> bool:
    return False
