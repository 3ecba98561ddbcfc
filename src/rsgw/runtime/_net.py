"""Binding listening sockets with one readable error, and the network seam.

Every listener in rsgw (gRPC, admin HTTP) binds through here, on exactly the
configured host, with SO_REUSEADDR (so a restart is not blocked by TIME_WAIT) and
never SO_REUSEPORT (so a second process cannot silently share a busy port).
"""

from __future__ import annotations

import errno
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from rsgw.base._errors import ListenError

# Pure, so it lives with the other value parsers; re-exported for the listeners.
from rsgw.base._values import split_host_port as split_host_port

logger = logging.getLogger(__name__)

DEFAULT_BACKLOG = 1024
#: accept() failures that mean "out of a resource for now", not "the listener is
#: broken": the same ones trio's `serve_listeners` sleeps on and retries.
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY_SECONDS = 0.1


def bind_tcp(host: str, port: int, *, backlog: int = DEFAULT_BACKLOG) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0 picks a free port).

    Raises:
        ListenError: the address cannot be resolved or bound; the message is one
            line naming the address and the reason ("address already in use").
    """
    where = f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise ListenError(f"cannot listen on {where}: {exc.strerror or exc}") from exc
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ListenError(
            f"cannot listen on {where}: {(exc.strerror or str(exc)).lower()}"
        ) from exc
    return sock


def bound_port(sock: socket.socket) -> int:
    """The port a bound socket actually got (the answer to port 0)."""
    return int(sock.getsockname()[1])


class Network(Protocol):
    """How rsgw reaches peers and listens: TCP in production, memory streams in tests.

    The gRPC server and client channels take one, so the shells can run over
    `trio.testing` memory streams with the autojump clock, and an embedding
    application could put them on another transport.
    """

    async def connect(self, target: str) -> trio.abc.Stream:
        """A stream to `host:port`; OSError when it cannot be reached."""
        ...

    def listen(self, host: str, port: int) -> tuple[trio.abc.Listener[trio.abc.Stream], int]:
        """A listener on `host:port` and the port it got (port 0 picks one).

        Raises:
            ListenError: the address cannot be bound.
        """
        ...


class TcpNetwork:
    """Plain TCP: `trio.open_tcp_stream` out, `bind_tcp` in (no SO_REUSEPORT)."""

    async def connect(self, target: str) -> trio.abc.Stream:
        host, _, port = target.rpartition(":")
        return await trio.open_tcp_stream(host.strip("[]"), int(port))

    def listen(self, host: str, port: int) -> tuple[trio.abc.Listener[trio.abc.Stream], int]:
        sock = bind_tcp(host, port)
        return trio.SocketListener(trio.socket.from_stdlib_socket(sock)), bound_port(sock)


#: The network every server and channel uses unless told otherwise.
TCP = TcpNetwork()


class Acceptor:
    """A listener's accept loop, with at most `max_connections` served at once.

    At the cap, new clients wait in the listen backlog (the kernel holds them; nothing
    is read from them) until a connection ends. Running out of file descriptors or
    memory is waited out and retried, and said at most every 10 s. Every listener
    that serves clients (gRPC, REST) accepts through one.

    Args:
        max_connections: connections served at once; 0: no cap.
        served: how many are served now, for the warning.
        make_room: called when the cap is reached and a new client is waiting: a
            listener whose connections can sit idle closes one to make room for it
            (the REST listener), so idle clients cannot hold the port.
    """

    def __init__(
        self,
        max_connections: int,
        served: Callable[[], int] = lambda: 0,
        make_room: Callable[[], None] | None = None,
    ) -> None:
        self._slots = trio.Semaphore(max_connections) if max_connections > 0 else None
        self._served = served
        self._make_room = make_room
        self._warned_at = -math.inf

    async def run(
        self,
        listener: trio.abc.Listener[trio.abc.Stream],
        serve: Callable[[trio.abc.Stream], Awaitable[None]],
        nursery: trio.Nursery,
    ) -> None:
        """Accept until cancelled, starting `serve(stream)` in `nursery` for each; every
        `serve` must call `release()` once its connection no longer counts."""
        slots = self._slots
        while True:
            if slots is not None:
                if slots.value == 0 and self._make_room is not None:
                    await self._room_when_asked(listener, slots)
                await slots.acquire()  # at the cap: new clients wait in the backlog
            try:
                stream = await listener.accept()
            except BaseException as exc:
                if slots is not None:
                    slots.release()
                if not isinstance(exc, OSError) or exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                self._failed(exc)
                await trio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            nursery.start_soon(serve, stream)

    async def _room_when_asked(
        self, listener: trio.abc.Listener[trio.abc.Stream], slots: trio.Semaphore
    ) -> None:
        """At the cap: wait until a slot frees, or a new client is waiting in the backlog
        (the listening socket turns readable), and then ask `make_room` once."""
        sock = getattr(listener, "socket", None)
        if sock is None or self._make_room is None:
            return
        make_room = self._make_room
        async with trio.open_nursery() as nursery:

            async def client_waiting() -> None:
                await trio.lowlevel.wait_readable(sock)
                make_room()
                nursery.cancel_scope.cancel()

            async def slot_free() -> None:
                async with slots:  # one frees: nothing to make room for
                    nursery.cancel_scope.cancel()

            nursery.start_soon(client_waiting)
            nursery.start_soon(slot_free)

    def release(self) -> None:
        """A connection `run` started has ended (or no longer counts against the cap)."""
        if self._slots is not None:
            self._slots.release()

    def _failed(self, exc: OSError) -> None:
        """Out of file descriptors or memory: say so (at most every 10 s), keep serving."""
        now = trio.current_time()
        if now - self._warned_at >= 10.0:
            self._warned_at = now
            logger.warning(
                "cannot accept a connection now; retrying",
                extra={"error": exc.strerror or str(exc), "connections": self._served()},
            )
