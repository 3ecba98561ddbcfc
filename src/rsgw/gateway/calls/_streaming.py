"""ModelStreamInfer through the gateway: a bidirectional pass-through, routed per message.

A client's stream may carry requests for several models. Each request is routed by
its own model name (read from the raw bytes, as ModelInfer's is) and goes to that
worker over one upstream stream per worker, opened on first use; each worker's
replies are passed back as they come, in that worker's order, never decoded. So
decoupled models (zero or many responses per request) work unchanged.

How it ends: when the client half-closes, every upstream is half-closed, and the
client's stream ends OK once all of them have. A request the gateway cannot route
(a malformed body, a model no worker serves) is answered on the stream with an
error message, as Triton answers a failed request in a stream, and the stream goes
on. A worker that dies or fails the whole stream ends the client's stream with
UNAVAILABLE (or the worker's status), naming the worker: never a hang.

Scheduling: each request is placed by the scheduler like a unary call, but the
reservation is released at once: replies are not matched to requests here (a
decoupled model's are not even countable), so a stream's requests do not count
toward least_outstanding's in-flight work. Sequence affinity holds in streams as in
unary calls (`rsgw.scheduling.calls._sequences`): a live sequence's requests go to the
worker that took its start.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import trio

from rsgw.base._errors import DecodeError, GrpcError, RsgwError, WorkerUnavailable
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.gateway.observe._propagation import upstream_metadata
from rsgw.grpc._metering import metered
from rsgw.runtime._logging import log_limited
from rsgw.scheduling.calls._sequences import SequenceTable
from rsgw.scheduling.calls._wire import peek_routing, stream_error

if TYPE_CHECKING:
    from rsgw.gateway.calls._resolve import Resolver
    from rsgw.gateway.fleet._pool import WorkerPool
    from rsgw.gateway.observe._metrics import GatewayMetrics
    from rsgw.gateway.observe._tracing import Tracer
    from rsgw.grpc._streams import ClientStream, ServerStream
    from rsgw.grpc.protocol._metadata import HeaderBlock
    from rsgw.scheduling.calls._schedulers import Scheduler

logger = logging.getLogger(__name__)


class StreamProxy:
    """The gateway's ModelStreamInfer; see the module docstring."""

    def __init__(
        self,
        pool: WorkerPool,
        resolver: Resolver,
        scheduler: Scheduler,
        metrics: GatewayMetrics,
        sequences: SequenceTable,
        tracer: Tracer | None = None,
    ) -> None:
        self.pool = pool
        self.resolver = resolver
        self.scheduler = scheduler
        self.sequences = sequences
        #: With tracing on, each worker's stream is a span under the client stream's.
        self.tracer = tracer
        self._observe = metrics.observer(Method.MODEL_STREAM_INFER.rpc)

    async def model_stream_infer(self, stream: ServerStream) -> None:
        with metered(stream.call, self._observe):
            failures: list[GrpcError] = []
            upstreams: dict[str, ClientStream] = {}
            async with contextlib.AsyncExitStack() as opened, trio.open_nursery() as nursery:
                async for body in stream:
                    url = await self._route(stream, body)
                    if url is None:
                        continue
                    upstream = upstreams.get(url)
                    if upstream is None:
                        metadata = upstream_metadata(stream.call.metadata)
                        if self.tracer is not None:
                            metadata = self._traced(url, metadata, opened)
                        try:
                            upstream = await opened.enter_async_context(
                                self.pool.channels[url].stream(
                                    Method.MODEL_STREAM_INFER.wire,
                                    deadline=stream.call.deadline,
                                    metadata=metadata,
                                )
                            )
                        except RsgwError as exc:
                            failures.append(self._failure(url, exc))
                            break
                        upstreams[url] = upstream
                        nursery.start_soon(self._pump, url, upstream, stream, failures, nursery)
                    await upstream.send(body)
                for upstream in upstreams.values():
                    upstream.end()
                if failures:
                    nursery.cancel_scope.cancel()
            if failures:
                raise failures[0]

    def _traced(
        self, url: str, metadata: HeaderBlock, opened: contextlib.AsyncExitStack
    ) -> HeaderBlock:
        """A span for the stream to `url`, under the client stream's, ended when that
        stream closes; the metadata that names it."""
        assert self.tracer is not None
        attempt, metadata = self.tracer.worker_call(self.pool.public_name(url), metadata)

        def closed(kind: type[BaseException] | None, exc: BaseException | None, _: object) -> None:
            if exc is None:
                attempt.end(answered=True)
            else:
                attempt.ended_by(exc)

        opened.push(closed)
        return metadata

    async def _route(self, stream: ServerStream, body: bytes) -> str | None:
        """The worker for one request, or None after answering it with an error."""
        try:
            regions = self.pool.regions.check_request(body, stream.call.owner)
            model, sequence = peek_routing(body)
            if not model:
                raise GrpcError(StatusCode.INVALID_ARGUMENT, "model_name is empty")
            replicas = await self.resolver.resolve(
                model, Method.MODEL_STREAM_INFER, stream.call.deadline
            )
            if regions:
                replicas = self.resolver.holding(replicas, regions)
            self.scheduler.arrived(model)
            now = trio.current_time()
            if sequence is not None and not sequence.start:
                holder = self.sequences.pinned(
                    model, sequence.id, replicas, now, self.pool.public_name
                )
                if holder is not None:
                    replicas = (holder,)
            order, reservation = self.scheduler.select(model, replicas, body)
            self.scheduler.release(reservation)  # see the module docstring
            url = order[0] if order else replicas[0]
            if sequence is not None:
                # A stream's replies are not matched to requests: the choice made here
                # is the sequence's holder.
                self.sequences.routed(model, sequence, url, now)
            return url
        except (DecodeError, GrpcError) as exc:
            message = exc.message if isinstance(exc, GrpcError) else f"malformed request: {exc}"
            await stream.send(stream_error(message))
            return None

    async def _pump(
        self,
        url: str,
        upstream: ClientStream,
        client: ServerStream,
        failures: list[GrpcError],
        nursery: trio.Nursery,
    ) -> None:
        """Pass one worker's replies back; its failure ends the whole stream."""
        try:
            async for reply in upstream:
                await client.send(reply)
        except RsgwError as exc:
            failures.append(self._failure(url, exc))
            nursery.cancel_scope.cancel()

    def _failure(self, url: str, error: RsgwError) -> GrpcError:
        """How a worker's failure reads to the client: named, never addressed."""
        name = self.pool.public_name(url)
        if isinstance(error, WorkerUnavailable):
            worker = self.pool.label(url)
            extra = {"worker": worker, "error": str(error)}
            log_limited(logger, logging.WARNING, "worker lost under a stream", extra, worker)
            return GrpcError(StatusCode.UNAVAILABLE, f"{name} is unavailable")
        return GrpcError(error.code, f"{name}: {error.message}", error.trailers)
