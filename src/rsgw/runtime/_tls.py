"""TLS for rsgw's gRPC listeners and channels: contexts, reloading, peer identities.

The standard library's `ssl` does the cryptography; trio's `SSLStream` wraps a
connection's stream in it, so the HTTP/2 layer above never knows. Every context
speaks TLS 1.2 or later and offers ALPN `h2` only (gRPC is HTTP/2).

A server's certificate can be replaced without a restart: `ServerTls` notes the
files' modification times, and `reload_if_changed()` (the server's sweep calls it
every second) or `reload()` (SIGHUP) builds a new context from them. Connections
already open keep the context they were made with, so none is dropped; a context
that fails to build (a key that does not match, a file caught half-written) is
logged and the old one stays in force.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass

import trio

logger = logging.getLogger(__name__)

ALPN = ["h2"]
#: The admin port (hypercorn) speaks HTTP/1.1 too: Prometheus and curl ask for it.
ADMIN_ALPN = ["h2", "http/1.1"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files: a certificate chain and its key; `client_ca_file` asks for mTLS."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""


def server_context(files: TlsFiles, alpn: list[str] = ALPN) -> ssl.SSLContext:
    """A server context for `files`; with a client CA, clients must present a certificate.

    Raises:
        OSError, ssl.SSLError: a file is missing or unreadable, or the key does not fit.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(alpn)
    context.load_cert_chain(files.cert_file, files.key_file)
    if files.client_ca_file:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(files.client_ca_file)
    return context


def client_context(
    ca_file: str = "", cert_file: str = "", key_file: str = "", alpn: list[str] = ALPN
) -> ssl.SSLContext:
    """A client context: trust `ca_file` (else the system's), present a certificate if given."""
    context = ssl.create_default_context(cafile=ca_file or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(alpn)
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context


def _stamp(files: TlsFiles) -> tuple[float, ...]:
    stamps = []
    for path in (files.cert_file, files.key_file, files.client_ca_file):
        try:
            stamps.append(os.stat(path).st_mtime if path else 0.0)
        except OSError:
            stamps.append(-1.0)
    return tuple(stamps)


class ServerTls:
    """A server's TLS: the context in force, rebuilt when its files change."""

    def __init__(self, files: TlsFiles, alpn: list[str] = ALPN) -> None:
        self.files = files
        self._alpn = alpn
        self.context = server_context(files, alpn)  # errors here stop the start-up
        self._stamp = _stamp(files)
        #: Contexts built so far (1 at start); for tests and the reload log line.
        self.generation = 1
        #: Reloads that failed and left the context in force as it was.
        self.reload_failures = 0

    def reload_if_changed(self) -> bool:
        """Rebuild the context if a file changed since the last build; True if it did."""
        stamp = _stamp(self.files)
        if stamp == self._stamp:
            return False
        return self.reload(stamp)

    def reload(self, stamp: tuple[float, ...] | None = None) -> bool:
        """Rebuild the context from the files now; keep the old one if that fails."""
        stamp = _stamp(self.files) if stamp is None else stamp
        try:
            context = server_context(self.files, self._alpn)
        except (OSError, ssl.SSLError) as exc:
            self.reload_failures += 1
            if stamp != self._stamp:  # say so once per change, not every second
                logger.warning(
                    "TLS certificate reload failed; keeping the certificate in force",
                    extra={"cert_file": self.files.cert_file, "error": str(exc)},
                )
            self._stamp = stamp
            return False
        self.context, self._stamp = context, stamp
        self.generation += 1
        logger.info(
            "TLS certificate reloaded",
            extra={"cert_file": self.files.cert_file, "generation": self.generation},
        )
        return True

    async def accept(self, stream: trio.abc.Stream) -> trio.SSLStream[trio.abc.Stream]:
        """The server side of a TLS handshake on `stream`, with the context in force.

        Raises:
            trio.BrokenResourceError: the handshake failed (a cleartext client, no or
                an untrusted client certificate, no common protocol version).
        """
        return await _handshake(trio.SSLStream(stream, self.context, server_side=True))


async def connect(
    stream: trio.abc.Stream, context: ssl.SSLContext, host: str
) -> trio.SSLStream[trio.abc.Stream]:
    """The client side of a TLS handshake on `stream`, checking `host`'s certificate."""
    return await _handshake(trio.SSLStream(stream, context, server_hostname=host))


async def _handshake(
    wrapped: trio.SSLStream[trio.abc.Stream],
) -> trio.SSLStream[trio.abc.Stream]:
    """Run the handshake; if it fails or is cancelled, close the socket under it."""
    try:
        await wrapped.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(wrapped.transport_stream)
        raise
    return wrapped


def peer_identity(stream: trio.abc.Stream) -> str:
    """The verified client certificate's identity: its first DNS SAN, else its CN; "" if none."""
    if not isinstance(stream, trio.SSLStream):
        return ""
    try:
        cert = stream.getpeercert()
    except (ValueError, trio.BrokenResourceError):
        return ""
    if not cert:
        return ""
    for kind, value in cert.get("subjectAltName", ()):
        if kind in ("DNS", "URI", "email"):
            return str(value)
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""
