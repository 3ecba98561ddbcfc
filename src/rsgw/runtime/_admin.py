"""The admin HTTP server: `/metrics`, `/healthz`, `/readyz` on hypercorn.

A tiny ASGI app (lifespan included, so hypercorn's startup handshake completes)
that maps exact paths to async endpoint functions. The socket is bound by
`rsgw.runtime._net` like every rsgw listener, so a busy port is one clear line and port 0
reports the port it got. Hypercorn's own logs go to rsgw's logger.
"""

from __future__ import annotations

import logging
import math
import ssl
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from rsgw.base._limits import ConnectionLimits
from rsgw.runtime._net import bind_tcp, bound_port
from rsgw.runtime._tls import ServerTls

logger = logging.getLogger(__name__)

#: Seconds a REST keep-alive connection may sit idle (hypercorn's default; Triton's
#: REST server keeps one open for as long as the client likes, which a listener
#: facing many clients cannot afford).
REST_KEEP_ALIVE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


#: A request's headers, as ASGI gives them (names lower-case).
Headers = list[tuple[bytes, bytes]]
Endpoint = Callable[[Headers], Awaitable[Reply]]


def header(headers: Headers, name: bytes) -> bytes | None:
    """The value of header `name` (lower-case, as are `headers`' names), or None."""
    for key, value in headers:
        if key == name:
            return value
    return None


_NOT_FOUND = Reply(404, b"not found")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class AdminApp:
    """ASGI app over exact GET paths (a `?query` is ignored)."""

    def __init__(self, routes: Mapping[str, Endpoint]) -> None:
        self._routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        endpoint = self._routes.get(scope["path"]) if scope["method"] in ("GET", "HEAD") else None
        reply = _NOT_FOUND if endpoint is None else await endpoint(scope["headers"])
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": [
                    (b"content-type", reply.content_type.encode()),
                    (b"content-length", str(len(reply.body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": reply.body})


async def lifespan(receive: Receive, send: Send) -> None:
    """ASGI's lifespan handshake, acknowledged (hypercorn waits for it to serve)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class _CurrentContext:
    """What hypercorn's TLS listener wraps streams with: the `ServerTls` context in force.

    trio's `SSLListener` only calls `wrap_bio` on its context, once per connection,
    so handing it this instead lets a reloaded certificate reach the admin port too.
    """

    def __init__(self, tls: ServerTls) -> None:
        self._tls = tls

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        self._tls.reload_if_changed()  # a stat or three per admin connection: scrapes are rare
        return self._tls.context.wrap_bio(*args, **kwargs)


class _Config(Config):
    tls: ServerTls | None = None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return None if self.tls is None else _CurrentContext(self.tls)  # type: ignore[return-value]  # duck-typed: wrap_bio only


#: Any ASGI application hypercorn can serve (the admin app, the REST door).
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def hypercorn_config(
    tls: ServerTls | None = None,
    limits: ConnectionLimits | None = None,
    max_concurrent_streams: int | None = None,
) -> Config:
    """hypercorn's configuration for an rsgw listener: the admin port (`serve_admin`),
    or, with `limits` (the gRPC port's `connections:` block), the REST port's HTTP/2
    connections (`rsgw.rest._listener`): a connection silent for `header_seconds` is
    closed, an idle one after `REST_KEEP_ALIVE_SECONDS`, a request head is held to
    `max_header_list_bytes`."""
    config = _Config()
    if limits is not None:
        config.keep_alive_timeout = REST_KEEP_ALIVE_SECONDS
        config.read_timeout = math.ceil(limits.header_seconds)  # hypercorn takes whole seconds
        config.h11_max_incomplete_size = limits.max_header_list_bytes
        config.h2_max_header_list_size = limits.max_header_list_bytes
        # hypercorn ends a connection after 1,000 requests by default; a client's
        # long-lived HTTP/2 connection to the REST port is kept, as on the gRPC port.
        config.keep_alive_max_requests = sys.maxsize
    if max_concurrent_streams is not None:
        config.h2_max_concurrent_streams = max_concurrent_streams
    config.tls = tls
    config.accesslog = None
    config.errorlog = logger
    config.graceful_timeout = 1.0
    return config


def wrap_asgi(app: AsgiApp, config: Config) -> Any:
    """`app` as hypercorn's servers take it."""
    return wrap_app(app, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]  # an ASGI callable


async def serve_admin(
    app: AsgiApp,
    host: str,
    port: int,
    *,
    tls: ServerTls | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `host:port` with hypercorn until cancelled; reports the bound port.

    With `tls`, HTTPS only (build it with `rsgw.runtime._tls.ADMIN_ALPN`); a changed
    certificate is picked up at the next connection.

    Raises:
        ListenError: the address is busy or cannot be bound.
    """
    sock = bind_tcp(host, port)
    config = hypercorn_config(tls)
    secure, insecure = ([sock], []) if tls is not None else ([], [sock])
    sockets = Sockets(secure_sockets=secure, insecure_sockets=insecure, quic_sockets=[])
    wrapped = wrap_asgi(app, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(worker_serve, wrapped, config, sockets=sockets))
        task_status.started(bound_port(sock))
