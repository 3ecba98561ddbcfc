"""The gateway's doors: the admin HTTP server, the gRPC listener, the REST listener.

Each is built from the parts `rsgw.gateway._parts` built, and started with
`nursery.start`, so it reports its bound port only once it listens; a listener that
cannot bind says which setting chose its address (`naming`).
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rsgw.base._call import PassThrough, UnaryHandler
from rsgw.base._errors import ConfigError, ListenError
from rsgw.config._config import GatewayConfig, env_name
from rsgw.gateway._admin_routes import admin_app
from rsgw.gateway._control import GatewayControl
from rsgw.gateway._parts import Fleet
from rsgw.gateway.calls._guard import Guard
from rsgw.gateway.calls._service import GatewayService
from rsgw.gateway.fleet._prober import Prober
from rsgw.gateway.observe._log_settings import ServerSettings
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.grpc._intake import Intake
from rsgw.grpc._server import GrpcServer
from rsgw.grpc._standard import standard_services
from rsgw.grpc._streams import StreamHandler
from rsgw.http2._h2 import DEFAULT_WINDOW_BYTES
from rsgw.rest._door import RestDoor
from rsgw.rest._listener import RestListener
from rsgw.runtime._admin import serve_admin
from rsgw.runtime._net import Network, split_host_port
from rsgw.runtime._tls import ADMIN_ALPN, ALPN, ServerTls, TlsFiles

if TYPE_CHECKING:
    import httpx
    import trio


@dataclass(frozen=True, slots=True)
class Tls:
    """The listeners' TLS (None: cleartext), each loaded once and reloaded in place."""

    grpc: ServerTls | None
    #: The admin server's and the REST door's (HTTP/1.1).
    http: ServerTls | None

    @classmethod
    def load(cls, config: GatewayConfig) -> Tls:
        """Raises ConfigError: a certificate or key that does not load."""
        return cls(server_tls(config, ALPN), server_tls(config, ADMIN_ALPN))

    @property
    def reloadables(self) -> tuple[ServerTls, ...]:
        return tuple(tls for tls in (self.grpc, self.http) if tls is not None)


@dataclass(frozen=True, slots=True)
class Handlers:
    """What the gRPC and REST doors answer, each handler behind the guard."""

    unary: Mapping[str, UnaryHandler]
    pass_through: Mapping[str, PassThrough]
    streams: Mapping[str, StreamHandler]


def guarded_handlers(
    config: GatewayConfig,
    service: GatewayService,
    control: GatewayControl,
    guard: Guard,
    metrics: GatewayMetrics,
    prober: Prober,
) -> Handlers:
    """Every method the gateway answers (the call path's, the control service's, the
    log settings', health and reflection), authenticated and audited by `guard`."""
    settings = ServerSettings(
        metrics, config.logging.format, lambda model: model in prober.discovery.known
    )
    handlers = (
        service.handlers()
        | control.handlers()
        | {method.path: handler for method, handler in settings.handlers().items()}
    )
    pass_through = service.pass_through()
    standard, streams = standard_services([*handlers, *pass_through], lambda: prober.serving)
    return Handlers(
        guard.wrap(handlers | standard),
        guard.wrap(pass_through),
        guard.wrap_streams(service.stream_handlers() | streams),
    )


async def start_admin(
    nursery: trio.Nursery,
    config: GatewayConfig,
    fleet: Fleet,
    http: httpx.AsyncClient,
    tls: Tls,
) -> int:
    """`/metrics` (the whole node's), `/healthz`, `/readyz`; returns the bound port."""
    app = admin_app(config, fleet.pool, fleet.metrics, fleet.prober, http)
    host, port = split_host_port(config.listen.metrics)
    with naming("listen.metrics"):
        bound: int = await nursery.start(
            functools.partial(serve_admin, tls=tls.http), app, host, port
        )
    return bound


def build_grpc(
    config: GatewayConfig,
    handlers: Handlers,
    service: GatewayService,
    metrics: GatewayMetrics,
    intake: Intake,
    tls: Tls,
) -> GrpcServer:
    """The gRPC listener, its running-call cap the `intake` that follows the workers."""
    uploads = config.connections.upload_budget()
    metrics.watch_uploads(uploads)
    limits = config.grpc
    return GrpcServer(
        handlers.unary,
        pass_through=handlers.pass_through,
        stream_handlers=handlers.streams,
        on_refused=metrics.refused,
        time_limits=service.time_limits,
        max_receive_message_bytes=limits.max_recv_msg_bytes,
        max_send_message_bytes=limits.max_send_msg_bytes,
        limits=config.connections.limits(),
        max_concurrent_streams=config.connections.max_concurrent_streams,
        tls=tls.grpc,
        upload_budget=uploads,
        window_bytes=config.connections.stream_window_bytes,
        connection_window_bytes=DEFAULT_WINDOW_BYTES,
        intake=intake,
    )


async def start_grpc(
    nursery: trio.Nursery, config: GatewayConfig, server: GrpcServer, network: Network
) -> int:
    """Serve `server` on `listen.grpc`; returns the bound port."""
    host, port = split_host_port(config.listen.grpc)
    with naming("listen.grpc"):
        bound: int = await nursery.start(
            functools.partial(server.serve, network=network), host, port
        )
    return bound


async def start_rest(
    nursery: trio.Nursery,
    config: GatewayConfig,
    handlers: Handlers,
    service: GatewayService,
    server: GrpcServer,
    tls: Tls,
) -> tuple[RestListener | None, int | None]:
    """The REST door on `listen.http` (if set), sharing the gRPC door's handlers and
    upload budget; returns it and its bound port."""
    if not config.listen.http:
        return None, None
    limits = config.grpc
    door = RestDoor(
        handlers.unary,
        handlers.pass_through,
        time_limits=service.time_limits,
        max_body_bytes=limits.max_recv_msg_bytes,
        upload_budget=server.upload_budget,
    )
    rest = RestListener(
        door,
        limits=config.connections.limits(),
        tls=tls.http,
        max_concurrent_streams=config.connections.max_concurrent_streams,
        upload_budget=server.upload_budget,
    )
    host, port = split_host_port(config.listen.http)
    with naming("listen.http"):
        bound: int = await nursery.start(rest.serve, host, port)
    return rest, bound


def server_tls(config: GatewayConfig, alpn: list[str]) -> ServerTls | None:
    """A listener's TLS, or None (cleartext); files that do not load are a ConfigError."""
    if not config.tls.enabled:
        return None
    files = TlsFiles(config.tls.cert_file, config.tls.key_file, config.tls.client_ca_file)
    try:
        return ServerTls(files, alpn)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls: cannot load {config.tls.cert_file}: {exc}") from None


@contextlib.contextmanager
def naming(key: str) -> Iterator[None]:
    """A listener that cannot bind says which setting chose its address."""
    try:
        yield
    except ListenError as exc:
        raise ListenError(
            f"{exc} (set by {key}, {env_name(key)}; rsgw run --{key.replace('.', '-')})"
        ) from exc
