"""`serve_worker`: one simulated GPU worker, its gRPC port and its admin port.

The nursery tree: the device's dispatch loop, the gRPC listener (KServe V2 data
plane plus ControlService), and the admin HTTP server. Each child reports ready
before the next starts, so `RunningWorker` is handed out only once both ports
listen.
"""

from __future__ import annotations

import enum
import functools
import logging
import ssl
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from rsgw.base._errors import ConfigError
from rsgw.base._limits import ConnectionLimits
from rsgw.base._methods import METHODS_BY_PATH, Method
from rsgw.base._uploads import UploadBudget
from rsgw.grpc._server import GrpcServer
from rsgw.grpc._standard import standard_services
from rsgw.grpc.protocol._compression import codec
from rsgw.runtime._admin import AdminApp, Headers, Reply, serve_admin
from rsgw.runtime._exposition import CONTENT_TYPE
from rsgw.runtime._net import TCP, Network
from rsgw.runtime._tls import ADMIN_ALPN, ALPN, ServerTls, TlsFiles
from rsgw.scheduling.fleet._capabilities import NEEDS, Capability
from rsgw.worker._metrics import WorkerMetrics
from rsgw.worker._service import WorkerIdentity, WorkerService
from rsgw.worker._shm import ShmRegistry
from rsgw.worker.device._batching import Discipline
from rsgw.worker.device._device import Device
from rsgw.worker.device._memory import DEFAULT_LOAD_BANDWIDTH
from rsgw.worker.device._weights import ResidencyMode
from rsgw.worker.models._catalogue import builtin_catalogue
from rsgw.worker.models._specs import Catalogue

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rsgw.runtime._spans import TracingConfig
    from rsgw.worker._tracing import WorkerTracer

logger = logging.getLogger(__name__)

#: A worker accepts the largest messages the gateway forwards (its 512 MiB default).
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024
#: A call's HTTP/2 window (the gRPC server's default): what a large message waiting
#: for room in the upload budget may already have sent.
WORKER_WINDOW_BYTES = 32 * 1024 * 1024


class WorkerApi(enum.Enum):
    """Which server the worker answers as."""

    #: Triton's API, IsSameIPCNamespace and ReactantServer's ControlService: what
    #: ReactantServer.jl's workers serve (the default).
    REACTANT = "reactant"
    #: Exactly what stock Triton answers: its API, without ReactantServer's
    #: ControlService and IsSameIPCNamespace (UNIMPLEMENTED), so the gateway meets
    #: a worker it can place only through the repository extension (docs/workers.md).
    TRITON = "triton"
    #: What KServe's ModelServer answers: the KServe V2 core and model load/unload,
    #: no RepositoryIndex, streaming, shared memory, configuration or statistics.
    KSERVE = "kserve"


#: The optional parts of the API each kind of worker lacks (`rsgw.scheduling.fleet._capabilities`).
LACKING: dict[WorkerApi, frozenset[Capability]] = {
    WorkerApi.REACTANT: frozenset(),
    WorkerApi.TRITON: frozenset({Capability.CONTROL_PLANE, Capability.IPC_NAMESPACE}),
    WorkerApi.KSERVE: frozenset(Capability) - {Capability.MODEL_CONTROL},
}
#: The methods each kind of worker does not serve.
LACKS: dict[WorkerApi, frozenset[Method]] = {
    api: frozenset(m for m, needs in NEEDS.items() if needs in lacking)
    for api, lacking in LACKING.items()
}


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything `rsgw worker` takes on its command line.

    Raises:
        ConfigError: a number out of range, or `pinned` names a model the
            catalogue does not serve (checked when the worker starts).
    """

    name: str = "worker0"
    gpu: str = "0"
    host: str = "127.0.0.1"
    port: int = 8080
    #: Admin HTTP port; 0 picks a free one, a negative value disables it.
    metrics_port: int = 9100
    catalogue: Catalogue = field(default_factory=builtin_catalogue)
    discipline: Discipline = Discipline.FIFO
    #: ModelInfer calls in flight before RESOURCE_EXHAUSTED; 0 = uncapped.
    max_concurrent_requests: int = 64
    time_scale: float = 1.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: On-demand weight budget in bytes; 0 disables the cache (everything stays
    #: on the device, as a worker without a cache behaves).
    weight_cache_bytes: int = 0
    residency_mode: ResidencyMode = ResidencyMode.SELF_MANAGED
    api: WorkerApi = WorkerApi.REACTANT
    #: Bytes/s a weight load moves, for models without their own `load_ms`.
    load_bandwidth: float = DEFAULT_LOAD_BANDWIDTH
    #: Models pinned on the device from the start (a node file's `models:` map).
    pinned: frozenset[str] = frozenset()
    #: Explicit model control (tritonserver's `--model-control-mode explicit`): only
    #: these are loaded at start; None: every catalogue model is.
    loaded_at_start: frozenset[str] | None = None
    #: The GPU's memory for loaded models' weights: a RepositoryModelLoad past it fails
    #: as Triton's does when CUDA runs out of memory; 0: no limit.
    gpu_memory_bytes: int = 0
    #: Compress ModelInfer and other unary replies in this encoding (gzip, deflate)
    #: where the client accepts it; "none", as Triton's default, never does.
    response_compression: str = "none"
    #: Seconds a stopping worker lets calls in flight (and queued) finish.
    shutdown_grace: float = 20.0
    #: TLS on the worker's listeners (gRPC and admin): PEM certificate and key, and
    #: a client CA to require client certificates (the gateway's, for mTLS).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    #: Where the worker's spans go (`rsgw.config._tracing`, read by `rsgw worker` from
    #: OpenTelemetry's variables); None or no endpoint: the worker traces nothing.
    tracing: TracingConfig | None = None

    def __post_init__(self) -> None:
        if self.weight_cache_bytes < 0:
            raise ConfigError(f"weight_cache_bytes must be >= 0, got {self.weight_cache_bytes}")
        if not self.load_bandwidth > 0:
            raise ConfigError(f"load_bandwidth must be > 0, got {self.load_bandwidth}")
        try:
            codec(self.response_compression)
        except ValueError as exc:
            raise ConfigError(f"response_compression: {exc}") from None
        if not self.shutdown_grace >= 0:
            raise ConfigError(f"shutdown_grace must be >= 0, got {self.shutdown_grace}")
        if not self.time_scale > 0:
            raise ConfigError(f"time_scale must be > 0, got {self.time_scale}")
        if self.max_concurrent_requests < 0:
            raise ConfigError(
                f"max_concurrent_requests must be >= 0, got {self.max_concurrent_requests}"
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("--tls-cert and --tls-key go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")

    def server_tls(self, alpn: list[str] = ALPN) -> ServerTls | None:
        """A listener's TLS, or None; files that do not load are a ConfigError."""
        if not self.tls_cert_file:
            return None
        files = TlsFiles(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)
        try:
            return ServerTls(files, alpn)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls-cert: cannot load {self.tls_cert_file}: {exc}") from None


@dataclass(frozen=True, slots=True)
class RunningWorker:
    """A live worker: its bound ports, its parts (for tests and metrics), and a stop."""

    config: WorkerConfig
    grpc_port: int
    metrics_port: int | None
    service: WorkerService
    cancel_scope: trio.CancelScope
    server: GrpcServer
    admin_tls: ServerTls | None = None

    def reload(self) -> None:
        """Read the certificate files again now (SIGHUP); what fails to load is not used."""
        for tls in (self.server.tls, self.admin_tls):
            if tls is not None:
                tls.reload()

    def kill(self) -> None:
        """Stop now, as SIGKILL would: connections drop, nothing drains."""
        self.cancel_scope.cancel()

    async def aclose(self, grace: float | None = None) -> None:
        """Drain, then stop, as the gateway does (`RunningGateway.aclose`).

        Not ready from now on, the listener closed, GOAWAY to clients; calls in
        flight and queued on the device get `grace` seconds (`shutdown_grace`
        unless given) to finish.
        """
        grace = self.config.shutdown_grace if grace is None else grace
        if not self.server.closing:
            self.service.draining = True
            logger.info(
                "worker stopping",
                extra={"grace_seconds": grace, "inflight": self.service.inflight},
            )
            cut = await self.server.aclose(grace)
            logger.info("worker stopped", extra={"calls_cut_short": cut})
        else:
            await self.server.aclose(grace)
        self.cancel_scope.cancel()


def _upload_limits(config: WorkerConfig) -> dict[str, Any]:
    """A gateway sends every client's calls over one connection: large messages there
    wait in flow control for room (as a GPU server's memory would hold them), never
    fail a small call that arrives beside them."""
    room = 2 * config.max_message_bytes
    return {
        "limits": ConnectionLimits(max_buffered_bytes=room),
        "upload_budget": UploadBudget(room, WORKER_WINDOW_BYTES),
    }


async def serve_worker(
    config: WorkerConfig,
    *,
    network: Network = TCP,
    task_status: trio.TaskStatus[RunningWorker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one simulated worker until cancelled.

    `network` carries the gRPC listener (TCP unless a test runs it on memory
    streams); the admin HTTP server always listens on TCP.

    Raises:
        ListenError: a port is busy or cannot be bound.
        ConfigError: `config.pinned` names a model the catalogue does not serve.
    """
    device = Device(
        config.catalogue,
        time_scale=config.time_scale,
        discipline=config.discipline,
        weight_cache_bytes=config.weight_cache_bytes,
        residency_mode=config.residency_mode,
        load_bandwidth=config.load_bandwidth,
        pinned=config.pinned,
        loaded_at_start=config.loaded_at_start,
        gpu_memory_bytes=config.gpu_memory_bytes,
    )
    metrics = WorkerMetrics(config.name, config.gpu, device)
    shm = ShmRegistry()
    tracer = _tracer(config, metrics)
    service = WorkerService(
        WorkerIdentity(config.name, config.gpu),
        device,
        shm,
        metrics,
        max_concurrent_requests=config.max_concurrent_requests,
        tracer=tracer,
    )
    metrics.admission = service
    handlers = service.handlers()
    for method in LACKS[config.api]:  # what the server it answers as does not serve
        handlers.pop(method.path, None)
    standard, streams = standard_services(handlers, lambda: service.ready)
    tls, admin_tls = config.server_tls(), config.server_tls(ADMIN_ALPN)
    server = GrpcServer(
        handlers | standard,
        stream_handlers={
            path: handler
            for path, handler in (service.stream_handlers() | streams).items()
            if METHODS_BY_PATH.get(path.encode()) not in LACKS[config.api]
        },
        max_receive_message_bytes=config.max_message_bytes,
        max_send_message_bytes=config.max_message_bytes,
        response_encoding=codec(config.response_compression),
        tls=tls,
        **_upload_limits(config),
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(device.serve)
            grpc_port = await nursery.start(
                functools.partial(server.serve, network=network), config.host, config.port
            )
            metrics_port: int | None = None
            if config.metrics_port >= 0:
                app = _admin_app(service, metrics)
                metrics_port = await nursery.start(
                    functools.partial(serve_admin, tls=admin_tls),
                    app,
                    config.host,
                    config.metrics_port,
                )
            _log_serving(config, grpc_port, metrics_port)
            task_status.started(
                RunningWorker(
                    config,
                    grpc_port,
                    metrics_port,
                    service,
                    nursery.cancel_scope,
                    server,
                    admin_tls,
                )
            )
    finally:
        shm.close()
        if tracer is not None:  # the spans still queued go from the export thread
            tracer.close()


def _log_serving(config: WorkerConfig, grpc_port: int, metrics_port: int | None) -> None:
    """The "worker serving" line: its ports (a node reads them from it) and how it runs."""
    logger.info(
        "worker serving",
        extra={
            "worker": config.name,
            "gpu": config.gpu,
            "grpc_port": grpc_port,
            "metrics_port": metrics_port,
            "models": len(config.catalogue.routable),
            "discipline": config.discipline.value,
            "time_scale": config.time_scale,
            "weight_cache_bytes": config.weight_cache_bytes,
            "residency_mode": config.residency_mode.value,
            "api": config.api.value,
            "tracing": config.tracing is not None and bool(config.tracing.endpoint),
        },
    )


def _tracer(config: WorkerConfig, metrics: WorkerMetrics) -> WorkerTracer | None:
    """The worker's tracer when it has a collector, else None (the default:
    OpenTelemetry is not even imported, `rsgw.worker._tracing`)."""
    tracing = config.tracing
    if tracing is None or not tracing.endpoint:
        return None
    try:
        from rsgw.worker._tracing import WorkerTracer
    except ImportError as exc:
        raise ConfigError(
            f"an OTLP endpoint is set ({tracing.endpoint}) but OpenTelemetry is not "
            f"installed ({exc.name}): install rsgw[tracing]"
        ) from None
    return WorkerTracer(tracing, config.name, config.gpu, metrics.count_spans_dropped)


@asynccontextmanager
async def open_worker(
    config: WorkerConfig, *, network: Network = TCP
) -> AsyncIterator[RunningWorker]:
    """A worker for the duration of the block (tests and embedding)."""
    async with trio.open_nursery() as nursery:
        worker: RunningWorker = await nursery.start(
            functools.partial(serve_worker, network=network), config
        )
        try:
            yield worker
        finally:
            nursery.cancel_scope.cancel()


def _admin_app(service: WorkerService, metrics: WorkerMetrics) -> AdminApp:
    async def metrics_endpoint(_: Headers) -> Reply:
        return Reply(200, metrics.render(), CONTENT_TYPE)

    async def healthz(_: Headers) -> Reply:
        return Reply(200, b"ok")

    async def readyz(_: Headers) -> Reply:
        return Reply(200, b"ok") if service.ready else Reply(503, b"not ready")

    return AdminApp({"/metrics": metrics_endpoint, "/healthz": healthz, "/readyz": readyz})
