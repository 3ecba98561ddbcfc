"""gateway.yml's blocks besides `scheduling:`: each a frozen dataclass that checks itself.

Pure: no trio, no sockets, no logging, no clock, no files.

`listen`, `worker_client`, `grpc`, `logging`, `tls`, `auth`, `shm`, `server_metadata`,
`shutdown`, `outlier_detection`, `connections` and `metrics` (here) and `discovery`,
`coordination` and `repository` (the fleet's, `rsgw.config._fleet_blocks`) are small,
independent sections: each dataclass here runs its fields through a table of per-key checks in
`__post_init__` (`rsgw.base._values.check_fields`, which adds the block's key prefix), so
a block built by hand, by `dataclasses.replace` or from gateway.yml is held to the same
rules and every `ConfigError` names the key path and the bad value. The defaults sit
at the top, each with its precedent. `rsgw.config._schema.GatewayConfig` holds one of each,
plus the worker lists (`rsgw.config._endpoints`) and `scheduling:`
(`rsgw.scheduling.knobs._settings`); docs/configuration.md documents every key.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from rsgw.base._auth import parse_identities
from rsgw.base._errors import ConfigError
from rsgw.base._limits import ConnectionLimits
from rsgw.base._uploads import UploadBudget
from rsgw.base._values import (
    Check,
    check_bool,
    check_fields,
    check_float,
    check_int,
    check_str,
    ranged,
    show,
    words,
)
from rsgw.scheduling.fleet._stalls import (
    DEFAULT_EJECTION_SECONDS,
    DEFAULT_PING_TIMEOUT_SECONDS,
    DEFAULT_STALL_SECONDS,
)
from rsgw.scheduling.knobs._knobs import check_positive

V = TypeVar("V")

# Defaults: docs/original.md §3.2 (the original's gateway.yml defaults), unless noted.
DEFAULT_LISTEN_GRPC = "0.0.0.0:8001"
DEFAULT_LISTEN_METRICS = "0.0.0.0:8002"
# Triton's REST port.
DEFAULT_LISTEN_HTTP = "0.0.0.0:8000"
DEFAULT_REQUEST_TIMEOUT_SECONDS = 60
# rsgw's own (the original: 32). A worker batches only what it holds, and with 32 calls a
# GPU hosting a model of max batch 32 beside others never runs full batches: measured on
# bench/fleet hot_replicas at 70% load, lpt_packing shed 13% and answered 64-69% within
# the SLO with 32, and 1.6% / 97% with 64, equal to the per-worker admission cap, so the
# calls a worker is allowed all reach its queue (docs/benchmarks.md "Admission").
DEFAULT_MAX_CONCURRENT_STREAMS = 64
DEFAULT_MAX_MSG_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_CONCURRENT_REQUESTS_PER_WORKER = 64
#: How long a call may be predicted to wait for its worker (issue 38).
DEFAULT_MAX_QUEUE_SECONDS = 1.0
DEFAULT_LOG_LEVEL = "info"
DEFAULT_LOG_FORMAT = "auto"
# rsgw's own (the original waited 5 s per worker): one worker's part of a merged /metrics.
# Well under Prometheus' default 10 s scrape timeout and a 2 s scrape interval.
DEFAULT_SCRAPE_TIMEOUT_SECONDS = 1.0
# rsgw's own: how long a stopping gateway lets calls in flight finish. Under the 30 s a
# Kubernetes pod gets between SIGTERM and SIGKILL by default, with room to spare.
DEFAULT_SHUTDOWN_GRACE_SECONDS = 20.0
# rsgw's own: the listener's per-connection limits, defaults from the gRPC layer.
_LIMITS = ConnectionLimits()
# nginx's http2_max_concurrent_streams is 128, Go's HTTP/2 server's 250.
DEFAULT_CLIENT_STREAMS = 256
#: The gateway's budget of unfinished request bytes, both ports together (issue 38:
#: ten clients of eight stalled 31 MiB calls held 372 MB without one).
DEFAULT_BUFFERED_BYTES_TOTAL = 256 * 1024 * 1024
#: A client call's HTTP/2 stream window: what it sends before its large message is
#: granted a share of the budget (a connection's window stays at 32 MiB).
DEFAULT_STREAM_WINDOW_BYTES = 1024 * 1024
# rsgw's own: shared memory regions one client may hold (each costs every worker a mapping).
DEFAULT_SHM_REGIONS_PER_CLIENT = 64
# The gRPC length prefix is four bytes: no message can be longer than this.
MAX_MESSAGE_BYTES = 2**32 - 1
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "text")


# ---------------------------------------------------------------------------
# Checks of the blocks' keys: `check(value, key) -> normalised value`.


def check_listen(value: object, key: str) -> str:
    """A listen address `host:port`; port 0 picks a free port (docs/product.md §2)."""
    text = check_str(value, key).strip()
    _, colon, port = text.rpartition(":")
    if not (colon and re.fullmatch(r"[0-9]{1,5}", port) and int(port) <= 65535):
        raise ConfigError(f"{key} must be host:port with a port in 0..65535, got {show(value)}")
    return text


positive_int = ranged(check_int, lambda n: n > 0, "positive")
non_negative = ranged(check_float, lambda x: x >= 0, "non-negative")
non_negative_int = ranged(check_int, lambda n: n >= 0, "non-negative (0: no cap)")


class FrozenTable(Mapping[str, V]):
    """A checked name -> value table (`auth.identities`, `repository.weight_bytes`):
    immutable and hashable, so the frozen blocks that hold one stay hashable."""

    def __init__(self, entries: Mapping[str, V] | None = None) -> None:
        self._entries = dict(entries or {})

    def __getitem__(self, key: str) -> V:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._entries.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return repr(self._entries)


def _check_identities(value: object, key: str) -> FrozenTable[tuple[str, ...]]:
    """`auth.identities`: certificate identity -> role names (checked, sorted)."""
    parsed = parse_identities(value, key)
    return FrozenTable(
        {name: tuple(sorted(r.value for r in roles)) for name, roles in parsed.items()}
    )


_message_bytes = ranged(check_int, lambda n: 0 < n <= MAX_MESSAGE_BYTES, "in 1..4294967295")


# The checks of the other blocks, by field (the dataclass adds the block's key prefix).
def _check_optional_listen(value: object, key: str) -> str:
    """A listen address, or "" for none."""
    return "" if value == "" else check_listen(value, key)


_LISTEN_CHECKS: Mapping[str, Check] = {
    "grpc": check_listen,
    "metrics": check_listen,
    "http": _check_optional_listen,
}
_WORKER_CLIENT_CHECKS: Mapping[str, Check] = {
    "request_timeout_seconds": positive_int,
    "max_concurrent_streams": positive_int,
    "tls_ca_file": check_str,
    "tls_cert_file": check_str,
    "tls_key_file": check_str,
}
_GRPC_CHECKS: Mapping[str, Check] = {
    "max_recv_msg_bytes": _message_bytes,
    "max_send_msg_bytes": _message_bytes,
    "max_concurrent_requests_per_worker": ranged(
        check_int, lambda n: n >= 0, "non-negative (0 = uncapped)"
    ),
    "max_queue_seconds": non_negative,
}
_LOGGING_CHECKS: Mapping[str, Check] = {
    "level": words(LOG_LEVELS),
    "format": words(LOG_FORMATS),
    "access_log_sample_rate": ranged(check_float, lambda x: 0 <= x <= 1, "between 0 and 1"),
    "access_log_max_per_second": positive_int,
}
_SERVER_METADATA_CHECKS: Mapping[str, Check] = dict.fromkeys(("name", "version"), check_str)
_SHUTDOWN_CHECKS: Mapping[str, Check] = {"grace_seconds": non_negative}
_CONNECTIONS_CHECKS: Mapping[str, Check] = {
    "max_connections": ranged(check_int, lambda n: n >= 0, "non-negative (0 = no cap)"),
    "idle_seconds": non_negative,
    "header_seconds": check_positive,
    "max_header_list_bytes": positive_int,
    "max_buffered_bytes": positive_int,
    "max_buffered_bytes_total": ranged(check_int, lambda n: n >= 0, "non-negative (0 = none)"),
    "stream_window_bytes": ranged(
        check_int, lambda n: 65_535 <= n < 2**31, "between 65535 and 2147483647 (HTTP/2's range)"
    ),
    "flood_budget": positive_int,
    "max_concurrent_streams": positive_int,
}
_METRICS_CHECKS: Mapping[str, Check] = {"scrape_timeout_seconds": check_positive}
_OUTLIER_CHECKS: Mapping[str, Check] = {
    "stall_seconds": non_negative,
    "ping_timeout_seconds": check_positive,
    "ejection_seconds": non_negative,
}
_TLS_CHECKS: Mapping[str, Check] = dict.fromkeys(
    ("cert_file", "key_file", "client_ca_file"), check_str
)
_AUTH_CHECKS: Mapping[str, Check] = {
    "tokens_file": check_str,
    "identities": _check_identities,
    "trusted_network": check_bool,
}


_SHM_CHECKS: Mapping[str, Check] = {
    "max_regions_per_client": non_negative_int,
    "max_bytes_per_client": non_negative_int,
    "allow_remote_clients": check_bool,
    "key_prefix": check_str,
}


# ---------------------------------------------------------------------------
# The blocks.


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """Where the gateway listens: gRPC (`listen.grpc`), Triton's REST API (`listen.http`;
    "" for no REST listener) and admin HTTP (`listen.metrics`)."""

    grpc: str = DEFAULT_LISTEN_GRPC
    metrics: str = DEFAULT_LISTEN_METRICS
    http: str = DEFAULT_LISTEN_HTTP

    def __post_init__(self) -> None:
        check_fields(self, "listen.", _LISTEN_CHECKS)


@dataclass(frozen=True, slots=True)
class WorkerClientConfig:
    """The gateway's client side: per-call timeout, streams per worker connection, TLS.

    With `tls_ca_file`, the gateway speaks TLS to every worker and checks each
    worker's certificate against that CA and the endpoint's host name; with
    `tls_cert_file` / `tls_key_file` too, it presents its own certificate (mTLS).
    """

    request_timeout_seconds: int = DEFAULT_REQUEST_TIMEOUT_SECONDS
    max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "worker_client.", _WORKER_CLIENT_CHECKS)


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """Message size limits, the inbound admission cap per worker (0 = uncapped), and
    how long a call may be predicted to wait for its worker before it is refused at
    arrival (`rsgw.scheduling.calls._forecast`; 0 = only its deadline decides)."""

    max_recv_msg_bytes: int = DEFAULT_MAX_MSG_BYTES
    max_send_msg_bytes: int = DEFAULT_MAX_MSG_BYTES
    max_concurrent_requests_per_worker: int = DEFAULT_MAX_CONCURRENT_REQUESTS_PER_WORKER
    max_queue_seconds: float = DEFAULT_MAX_QUEUE_SECONDS

    def __post_init__(self) -> None:
        check_fields(self, "grpc.", _GRPC_CHECKS)


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """Log level (debug|info|warning|error) and format (auto|json|text: auto is text
    when stderr is a terminal, json otherwise), and the access log.

    `access_log_sample_rate`: the share of inference calls that get an `access` line
    (0 = none, 1 = every call), at most `access_log_max_per_second` lines a second.
    """

    level: str = DEFAULT_LOG_LEVEL
    format: str = DEFAULT_LOG_FORMAT
    access_log_sample_rate: float = 0.0
    access_log_max_per_second: int = 100

    def __post_init__(self) -> None:
        check_fields(self, "logging.", _LOGGING_CHECKS)


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS on the gateway's listeners (gRPC and admin): PEM certificate chain and key.

    With both set the gateway serves TLS only (TLS 1.2+, ALPN h2; the certificate is
    reloaded when the files change or on SIGHUP); `client_ca_file` also asks every
    client for a certificate signed by that CA (mTLS), whose name is its identity.
    """

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "tls.", _TLS_CHECKS)
        if bool(self.cert_file) != bool(self.key_file):
            missing = "tls.key_file" if self.cert_file else "tls.cert_file"
            raise ConfigError(f"{missing} is required when the other of the pair is set")
        if self.client_ca_file and not self.cert_file:
            raise ConfigError("tls.client_ca_file needs tls.cert_file and tls.key_file")

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Who may call what (docs/security.md): bearer tokens and mTLS identities, by role.

    Authentication is on when either is set: `tokens_file` (YAML, re-read when it
    changes or on SIGHUP; `rsgw.base._auth.parse_tokens`) or `identities` (a client
    certificate's identity -> roles; needs `tls.client_ca_file`). Off, every client
    may call everything but the operator calls, which only clients on loopback may
    make (protected mode, docs/security.md) unless `trusted_network` says every
    client that can reach the gateway is trusted.
    """

    tokens_file: str = ""
    identities: Mapping[str, tuple[str, ...]] = field(default_factory=FrozenTable)
    trusted_network: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "auth.", _AUTH_CHECKS)

    @property
    def enabled(self) -> bool:
        return bool(self.tokens_file or self.identities)


@dataclass(frozen=True, slots=True)
class ShmConfig:
    """Shared memory registered through the gateway (docs/security.md).

    Per client (its token, certificate identity, or local user): at most
    `max_regions_per_client` regions and `max_bytes_per_client` bytes (0: no cap).
    `allow_remote_clients` lets clients that are not on loopback register (pods
    sharing the node's /dev/shm); a registered key must start with `key_prefix`.
    """

    max_regions_per_client: int = DEFAULT_SHM_REGIONS_PER_CLIENT
    max_bytes_per_client: int = 0
    allow_remote_clients: bool = False
    key_prefix: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "shm.", _SHM_CHECKS)


@dataclass(frozen=True, slots=True)
class ServerMetadataConfig:
    """What ServerMetadata answers: empty fields say what the ready workers report."""

    name: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "server_metadata.", _SERVER_METADATA_CHECKS)


@dataclass(frozen=True, slots=True)
class ShutdownConfig:
    """How a stopping gateway drains: the seconds calls in flight get to finish."""

    grace_seconds: float = DEFAULT_SHUTDOWN_GRACE_SECONDS

    def __post_init__(self) -> None:
        check_fields(self, "shutdown.", _SHUTDOWN_CHECKS)


@dataclass(frozen=True, slots=True)
class ConnectionsConfig:
    """What one client connection may cost (`rsgw.base._limits.ConnectionLimits`)."""

    max_connections: int = _LIMITS.max_connections
    idle_seconds: float = _LIMITS.idle_seconds
    header_seconds: float = _LIMITS.header_seconds
    max_header_list_bytes: int = _LIMITS.max_header_list_bytes
    max_buffered_bytes: int = _LIMITS.max_buffered_bytes
    #: Bytes of unfinished request messages the whole gateway holds (`rsgw.base._uploads`).
    max_buffered_bytes_total: int = DEFAULT_BUFFERED_BYTES_TOTAL
    #: What one call may send before its large message is granted part of the above.
    stream_window_bytes: int = DEFAULT_STREAM_WINDOW_BYTES
    flood_budget: int = _LIMITS.flood_budget
    #: Calls one client connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS):
    #: a client with more waits for a stream on its side, where its deadline costs us nothing.
    max_concurrent_streams: int = DEFAULT_CLIENT_STREAMS

    def __post_init__(self) -> None:
        check_fields(self, "connections.", _CONNECTIONS_CHECKS)

    def upload_budget(self) -> UploadBudget | None:
        """The budget both ports share (None: 0, each connection bounded alone)."""
        if not self.max_buffered_bytes_total:
            return None
        return UploadBudget(self.max_buffered_bytes_total, self.stream_window_bytes)

    def limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            max_header_list_bytes=self.max_header_list_bytes,
            max_buffered_bytes=self.max_buffered_bytes,
            flood_budget=self.flood_budget,
            idle_seconds=self.idle_seconds,
            header_seconds=self.header_seconds,
            max_connections=self.max_connections,
        )


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """The merged `/metrics`: how long one worker's scrape may take.

    A worker slower than `scrape_timeout_seconds` (hung, overloaded) is left out of
    that scrape, with `gateway_worker_metrics_up 0`, so the gateway's own series
    still reach Prometheus well within its scrape timeout.
    """

    scrape_timeout_seconds: float = DEFAULT_SCRAPE_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        check_fields(self, "metrics.", _METRICS_CHECKS)


@dataclass(frozen=True, slots=True)
class OutlierConfig:
    """Ejection of workers that stop answering (see `rsgw.scheduling.fleet._stalls`).

    `stall_seconds`: calls waiting with no byte from the worker for this long get it
    pinged (0 disables ejection); `ping_timeout_seconds`: an unanswered PING ejects
    it; `ejection_seconds`: it stays out at least this long.
    """

    stall_seconds: float = DEFAULT_STALL_SECONDS
    ping_timeout_seconds: float = DEFAULT_PING_TIMEOUT_SECONDS
    ejection_seconds: float = DEFAULT_EJECTION_SECONDS

    def __post_init__(self) -> None:
        check_fields(self, "outlier_detection.", _OUTLIER_CHECKS)
