"""`GatewayConfig`: the validated, frozen configuration object the gateway reads.

Pure: no trio, no sockets, no logging, no clock, no files.

Every dataclass the configuration is made of validates and normalises its own fields in
`__post_init__`: the blocks (`rsgw.config._blocks`), `scheduling:` (the knob table of
`rsgw.scheduling.knobs._knobs`), and here the worker lists (checked entry by entry and
paired by position in `rsgw.config._endpoints`: `GatewayConfig.pairing()`), the process-level
values and the rules that span blocks. So a
config built by hand, by `dataclasses.replace` in the control plane, or by
`rsgw.config._config.parse_config` from gateway.yml and the environment is held to exactly the
same rules, and every `ConfigError` names the key path and the bad value. Where the
values come from (files, variables, precedence) is `rsgw.config._config`'s business;
docs/configuration.md documents every key and default.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rsgw.base._errors import ConfigError
from rsgw.base._values import Check, check_fields, check_int, ranged
from rsgw.config._blocks import (
    AuthConfig,
    ConnectionsConfig,
    GrpcLimits,
    ListenConfig,
    LoggingConfig,
    MetricsConfig,
    OutlierConfig,
    ServerMetadataConfig,
    ShmConfig,
    ShutdownConfig,
    TlsConfig,
    WorkerClientConfig,
    non_negative,
)
from rsgw.config._endpoints import Pairing, check_names, check_targets, pair_workers
from rsgw.config._fleet_blocks import CoordinationConfig, DiscoveryConfig, RepositoryConfig
from rsgw.config._tenancy import QUOTA_KEYS, TenancyConfig
from rsgw.config._tracing import TracingConfig
from rsgw.scheduling.knobs._knobs import check_positive
from rsgw.scheduling.knobs._settings import SchedulingConfig

# Defaults: docs/original.md §3.2 (the original's gateway.yml defaults), unless noted.
DEFAULT_STARTUP_WAIT_SECONDS = 0.0
DEFAULT_HEALTH_INTERVAL_SECONDS = 10.0
DEFAULT_WEDGE_EXIT_ROUNDS = 3
# The prober's per-call watchdog (docs/original.md §5.2 PROBE_TIMEOUT_SECONDS); a constant
# in the original, a field here so an embedding application or a test can shorten it.
DEFAULT_PROBE_TIMEOUT_SECONDS = 8.0


def _frozen_fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _check_startup_wait(value: object, key: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and value == math.inf:
        return math.inf
    seconds: float = non_negative(value, key)
    return seconds


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything the gateway reads at start-up, validated and immutable.

    Built by `load_config` / `parse_config`, or by hand (tests): the constructor checks
    every field with the same rules as gateway.yml. `env_overrides`, `notes` and `source`
    say where the values came from; they take no part in equality.
    """

    endpoints: tuple[str, ...]
    metrics_endpoints: tuple[str, ...] = ()
    worker_names: tuple[str, ...] = ()
    listen: ListenConfig = field(default_factory=ListenConfig)
    worker_client: WorkerClientConfig = field(default_factory=WorkerClientConfig)
    grpc: GrpcLimits = field(default_factory=GrpcLimits)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    shm: ShmConfig = field(default_factory=ShmConfig)
    server_metadata: ServerMetadataConfig = field(default_factory=ServerMetadataConfig)
    shutdown: ShutdownConfig = field(default_factory=ShutdownConfig)
    outlier_detection: OutlierConfig = field(default_factory=OutlierConfig)
    connections: ConnectionsConfig = field(default_factory=ConnectionsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    repository: RepositoryConfig = field(default_factory=RepositoryConfig)
    coordination: CoordinationConfig = field(default_factory=CoordinationConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    tenancy: TenancyConfig = field(default_factory=TenancyConfig)
    # The process-level variables (no YAML key; docs/original.md §3.2 "other env").
    # lpt_packing's wait for every worker before serving; math.inf = forever.
    startup_wait_seconds: float = DEFAULT_STARTUP_WAIT_SECONDS
    health_interval_seconds: float = DEFAULT_HEALTH_INTERVAL_SECONDS
    # All-probes-hung rounds before GatewayWedged; 0 disables.
    wedge_exit_rounds: int = DEFAULT_WEDGE_EXIT_ROUNDS
    # No YAML key and no variable: only code sets it (see DEFAULT_PROBE_TIMEOUT_SECONDS).
    probe_timeout_seconds: float = DEFAULT_PROBE_TIMEOUT_SECONDS
    # Provenance, for the caller to log.
    env_overrides: tuple[str, ...] = field(default=(), compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        checks: dict[str, Check] = {
            "endpoints": check_targets,
            "metrics_endpoints": check_targets,
            "worker_names": check_names,
            "startup_wait_seconds": _check_startup_wait,
            "health_interval_seconds": check_positive,
            "probe_timeout_seconds": check_positive,
            "wedge_exit_rounds": ranged(check_int, lambda n: n >= 0, "non-negative (0 disables)"),
        }
        check_fields(self, "", checks)
        if self.auth.identities and not self.tls.client_ca_file:
            raise ConfigError(
                "auth.identities needs tls.client_ca_file: without it no client "
                "certificate is asked for, so no identity can be proven"
            )
        if not self.endpoints:
            # A misspelt `endpoints:` is the likeliest cause: say so in the same line.
            typos = [note for note in self.notes if note.startswith("unknown gateway config")]
            raise ConfigError(
                "gateway has no endpoints; set 'endpoints:' in gateway.yml or "
                "REACTANT_GATEWAY_WORKERS" + "".join(f"; {typo}" for typo in typos)
            )
        self.pairing().check()

    def pairing(self) -> Pairing:
        """`endpoints`, `metrics_endpoints` and `worker_names`, paired by position: each
        worker with its metrics endpoint and name, and the metrics endpoints past the
        endpoints (`rsgw.config._endpoints.pair_workers`, the one place that rule is written)."""
        return pair_workers(self.endpoints, self.metrics_endpoints, self.worker_names)

    @property
    def max_concurrent_requests(self) -> int:
        """The inbound admission cap: per-worker cap x workers; 0 = uncapped.

        docs/original.md §3.4. At start-up, with a `dns:///` endpoint counted as one
        worker: the running gateway's cap follows its members (`Members.inbound_cap`).
        """
        return self.grpc.max_concurrent_requests_per_worker * len(self.endpoints)

    def worker_label(self, url: str) -> str:
        """The friendly name of a worker or worker-metrics URL, else the URL itself."""
        pairing = self.pairing()
        for worker in (*pairing.workers, *pairing.unpaired):
            if url in (worker.endpoint, worker.metrics) and worker.name:
                return worker.name
        return url

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the caller should log at warning level: parse notes, then risky values."""
        found = list(self.notes)
        cap = self.grpc.max_concurrent_requests_per_worker
        streams = self.worker_client.max_concurrent_streams
        if 0 < cap < streams:
            found.append(
                f"grpc.max_concurrent_requests_per_worker ({cap}) is below "
                f"worker_client.max_concurrent_streams ({streams}): the gateway sheds "
                "(RESOURCE_EXHAUSTED) before a worker's streams are used"
            )
        if self.auth.enabled and self.tenancy.header:
            found.append(
                f"tenancy.header ({self.tenancy.header}) is not read while authentication is "
                "on: a call's tenant is the identity it proved (its token's name or its "
                "certificate's identity)"
            )
        exposed = self._unauthenticated_listeners()
        if exposed:
            found.append(self._unauthenticated_warning(exposed))
        found.extend(self.pairing().warnings)
        return tuple(found)

    def _unauthenticated_listeners(self) -> list[str]:
        """The client listeners open beyond this host with no authentication, as
        `address (protocol)`: gRPC, and REST unless `listen.http` is ""."""
        if self.auth.enabled:
            return []
        listeners = [(self.listen.grpc, "gRPC"), (self.listen.http, "REST")]
        return [
            f"{address} ({protocol})"
            for address, protocol in listeners
            if address and not _loopback_host(address.rpartition(":")[0].strip("[]"))
        ]

    def _unauthenticated_warning(self, exposed: list[str]) -> str:
        """The one start-up line that says what an unauthenticated gateway exposes, to
        whom, and how to close it (docs/security.md, "Protected mode")."""
        changes = (
            "calls that change the node (placement, scheduling, workers, model load and "
            "unload, memory compaction, log and trace settings)"
        )
        if self.auth.trusted_network:
            who = f"{changes} are taken from anyone, because auth.trusted_network is true"
        else:
            who = f"{changes} are taken from this host only"
        return (
            f"no authentication: any client that can reach {' or '.join(exposed)} may run "
            f"inference; {who}. To require a token, set auth.tokens_file (docs/security.md); "
            "to serve this host only, listen on 127.0.0.1"
        )

    def to_mapping(self) -> dict[str, Any]:
        """gateway.yml for this config: plain dicts, lists and scalars (YAML-safe).

        `parse_config(cfg.to_mapping()) == cfg` for a config whose process-level values
        (startup wait, health interval, wedge rounds, probe timeout) are their defaults:
        those have no YAML key.
        """
        blocks = {
            name: {k: _plain(v) for k, v in _frozen_fields(getattr(self, name)).items()}
            for name in (
                "listen",
                "worker_client",
                "grpc",
                "logging",
                "tls",
                "auth",
                "shm",
                "server_metadata",
                "shutdown",
                "outlier_detection",
                "connections",
                "metrics",
                "discovery",
                "repository",
                "coordination",
                "scheduling",
                "tracing",
                "tenancy",
            )
        }
        default = self.tenancy.default
        blocks["tenancy"]["default"] = {k: getattr(default, k) for k in QUOTA_KEYS}
        blocks["scheduling"]["models"] = {
            name: {
                k: _plain(v)
                for k, v in _frozen_fields(o).items()
                if v is not None and not (k == "fill_factor" and v == 0.0)
            }
            for name, o in self.scheduling.models.items()
        }
        return {
            "endpoints": list(self.endpoints),
            "metrics_endpoints": list(self.metrics_endpoints),
            "worker_names": list(self.worker_names),
            **blocks,
        }


def _loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in _frozen_fields(value).items()}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, enum.Enum) else value
