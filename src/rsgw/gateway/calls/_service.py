"""The gateway's data-plane service: one handler table over the gateway's parts.

`GatewayService` builds the parts every call shares (the scheduler's admission
ledger, the replica resolution, the sequence table) and the handlers that use
them, and hands out one table of them by method path, for whichever door serves
it. Where each method is answered:
- ModelInfer, the hot path: `rsgw.gateway.calls._infer`;
- ModelStreamInfer, per message: `rsgw.gateway.calls._streaming`;
- the server and model RPCs (health, metadata, config, statistics, the repository
  index): `rsgw.gateway.calls._models`;
- the fan-outs to every worker (shared memory, model control, IPC namespace,
  compaction): `rsgw.gateway.calls._broadcast`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rsgw.base._methods import Method
from rsgw.config._blocks import ShmConfig
from rsgw.gateway.calls._admission import Admission
from rsgw.gateway.calls._broadcast import FanOut, Targets
from rsgw.gateway.calls._fleet_calls import FleetCalls
from rsgw.gateway.calls._infer import InferProxy
from rsgw.gateway.calls._models import ModelCalls
from rsgw.gateway.calls._resolve import ColdPath, Resolver
from rsgw.gateway.calls._shm_calls import ShmCalls
from rsgw.gateway.calls._streaming import StreamProxy
from rsgw.gateway.observe._access import AccessLog
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.grpc.protocol._framing import DEFAULT_MAX_MESSAGE_BYTES
from rsgw.scheduling.calls._forecast import Forecast
from rsgw.scheduling.calls._ledger import Ledger
from rsgw.scheduling.calls._reported import MeasuredCounters
from rsgw.scheduling.calls._schedulers import RoundRobinScheduler, Scheduler
from rsgw.scheduling.calls._sequences import SequenceTable

if TYPE_CHECKING:
    from collections.abc import Callable

    from rsgw.base._call import PassThrough, TimeLimits, UnaryHandler
    from rsgw.config._config import ServerMetadataConfig
    from rsgw.gateway.calls._tenancy import Tenancy
    from rsgw.gateway.fleet._pool import WorkerPool
    from rsgw.gateway.fleet._prober import Prober
    from rsgw.gateway.observe._tracing import Tracer
    from rsgw.grpc._streams import StreamHandler

logger = logging.getLogger(__name__)


class GatewayService:
    """The handlers of one gateway, bound to its pool, prober, scheduler and metrics."""

    def __init__(
        self,
        pool: WorkerPool,
        prober: Prober,
        metrics: GatewayMetrics,
        *,
        request_timeout: float = 60.0,
        max_concurrent_requests: int = 0,
        max_requests_per_worker: int = 0,
        max_queue_seconds: float = 0.0,
        scheduler: Scheduler | None = None,
        holders: Callable[[str], tuple[str, ...]] | None = None,
        identity: ServerMetadataConfig | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        access: AccessLog | None = None,
        shm: ShmConfig | None = None,
        measured: MeasuredCounters | None = None,
        cold: ColdPath | None = None,
        forecast: Forecast | None = None,
        tracer: Tracer | None = None,
        tenancy: Tenancy | None = None,
    ) -> None:
        self.pool = pool
        #: Priorities, fair shares and quotas per tenant (issue 52), when gateway.yml's
        #: `tenancy:` block asks for them; None otherwise, so a call tests one attribute.
        self.tenancy = tenancy
        self.prober = prober
        self.metrics = metrics
        #: The server cuts ModelInfer short at `request_timeout` from its start, when
        #: the client set no sooner deadline: every door applies it when the handler
        #: starts (`CallContext.begin`), so it is on the call's scope from the start.
        self.time_limits: TimeLimits = {Method.MODEL_INFER.path: request_timeout}
        self.scheduler: Scheduler = scheduler or RoundRobinScheduler()
        self.admission = Admission(
            Ledger(max_concurrent_requests, max_requests_per_worker, self.scheduler.release),
            metrics,
            max_queue_seconds,
            forecast,
        )
        #: Admitted calls, and the calls each worker holds.
        self.ledger = self.admission.ledger
        self.queue = self.admission.queue
        self.resolver = Resolver(prober.discovery, prober.capabilities, cold)
        #: Which worker holds each live sequence of a stateful model.
        self.sequences = SequenceTable()
        self.infer = InferProxy(
            pool,
            prober,
            metrics,
            self.resolver,
            self.scheduler,
            self.admission,
            self.sequences,
            request_timeout=request_timeout,
            max_message_bytes=max_message_bytes,
            access=access,
            measured=measured,
            tracer=tracer,
            tenancy=tenancy,
        )
        #: Which workers each fan-out asks, and the rules that merge their answers.
        self.targets = Targets(pool, prober, holders or (lambda model: pool.urls))
        fan = FanOut(pool, metrics, self.targets, request_timeout=request_timeout, tracer=tracer)
        shm = shm or ShmConfig()
        self.shm = ShmCalls(pool, metrics, fan, self.admission.admitted, shm)
        self.fleet = FleetCalls(pool, prober, metrics, fan, shm)
        self.models = ModelCalls(
            pool,
            prober,
            metrics,
            self.resolver,
            self.targets,
            request_timeout=request_timeout,
            identity=identity,
        )
        self.streams = StreamProxy(
            pool, self.resolver, self.scheduler, metrics, self.sequences, tracer=tracer
        )
        self.tracer = tracer

    def resize(self, max_concurrent_requests: int) -> None:
        """A new inbound cap (the workers changed): see `Admission.resize`."""
        self.admission.resize(max_concurrent_requests)

    def handlers(self) -> dict[str, UnaryHandler]:
        """The handler table: one row per method the gateway answers."""
        table: dict[Method, UnaryHandler] = {
            **self.shm.handlers(),
            **self.fleet.handlers(),
            **self.models.handlers(),
        }
        tracer = self.tracer
        if tracer is not None:  # each a span of its own, its calls to workers under it
            table = {method: tracer.handled(method.rpc, h) for method, h in table.items()}
        return {method.path: handler for method, handler in table.items()}

    def pass_through(self) -> dict[str, PassThrough]:
        """The methods passed through as they came: ModelInfer (the hot path), whose
        requests reach it still compressed, or in pieces if large."""
        return {Method.MODEL_INFER.path: self.infer.model_infer}

    def stream_handlers(self) -> dict[str, StreamHandler]:
        """The streaming methods: ModelStreamInfer, passed through per message."""
        handler: StreamHandler = self.streams.model_stream_infer
        if self.tracer is not None:
            handler = self.tracer.streamed(Method.MODEL_STREAM_INFER.rpc, handler)
        return {Method.MODEL_STREAM_INFER.path: handler}

    @property
    def inflight(self) -> int:
        return self.ledger.inflight
