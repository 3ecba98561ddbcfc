"""gateway.yml's worker lists: each entry checked, and the one walk that pairs them.

Pure: no trio, no sockets, no logging, no clock, no files.

`endpoints`, `metrics_endpoints` and `worker_names` are three parallel lists:
`endpoints[i]` is a worker, `metrics_endpoints[i]` its Prometheus endpoint and
`worker_names[i]` its name, by position; metrics endpoints listed beyond the endpoints
pair with no worker (scraped under their own name), and a `dns:///NAME:PORT` endpoint
is every worker NAME resolves to, so it takes no name and pairs only with
`dns:///NAME:METRICS_PORT`. That rule is written once, in `pair_workers`: the config's
own checks and labels, the gateway's fixed members, its DNS discovery and its merged
`/metrics` all read the `Pairing` it returns (`GatewayConfig.pairing()`), so none of
them walks the lists by index itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rsgw.base._errors import ConfigError
from rsgw.base._values import check_str, must_be
from rsgw.scheduling.fleet._membership import DNS_SCHEME, DnsTarget, MembershipError

# ---------------------------------------------------------------------------
# Checks of one entry: `check(value, key) -> normalised value`.


def check_target(value: object, key: str) -> str:
    """A worker's `host:port` (split at the LAST colon, as docs/original.md §3.2)."""
    text = check_str(value, key).strip()
    if "://" in text:
        raise ConfigError(
            f"{key}: worker target '{text}' is a URL; give host:port "
            "(or, in gateway.yml's endpoints, dns:///NAME:PORT)"
        )
    host, colon, port = text.rpartition(":")
    if not colon:
        raise ConfigError(f"{key}: worker target '{text}' is not host:port")
    if not re.fullmatch(r"[0-9]+", port):
        raise ConfigError(f"{key}: worker target '{text}' has a non-integer port")
    if not host:
        raise ConfigError(f"{key}: worker target '{text}' has an empty host")
    if len(port) > 5 or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{key}: worker target '{text}' has a port out of range 1..65535")
    return text


def check_endpoint(value: object, key: str) -> str:
    """`host:port`, or `dns:///NAME:PORT`: every address NAME resolves to (issue 24)."""
    text = check_str(value, key).strip()
    if not text.startswith(DNS_SCHEME):
        return check_target(text, key)
    try:
        DnsTarget.parse(text)
    except MembershipError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return text


def check_names(value: object, key: str) -> tuple[str, ...]:
    if not isinstance(value, tuple | list):
        raise must_be(key, "a list of strings", value)
    return tuple(check_str(name, f"{key}[{i}]") for i, name in enumerate(value))


def check_targets(value: object, key: str) -> tuple[str, ...]:
    if not isinstance(value, tuple | list):
        raise must_be(key, "a list of host:port strings", value)
    return tuple(check_endpoint(t, f"{key}[{i}]") for i, t in enumerate(value))


# ---------------------------------------------------------------------------
# The pairing.


@dataclass(frozen=True, slots=True)
class ConfiguredWorker:
    """One position of the worker lists: what `endpoints[i]`, `metrics_endpoints[i]` and
    `worker_names[i]` say together, "" where a list is too short (or a name is empty)."""

    #: `host:port` or `dns:///NAME:PORT`; "" for a metrics endpoint beyond the endpoints.
    endpoint: str
    metrics: str = ""
    name: str = ""

    @property
    def dns(self) -> bool:
        """Whether the endpoint is a `dns:///` target (many workers, no name of its own)."""
        return self.endpoint.startswith(DNS_SCHEME)

    @property
    def label(self) -> str:
        """How logs and metrics name it: its name, else its endpoint (or metrics URL)."""
        return self.name or self.endpoint or self.metrics


@dataclass(frozen=True, slots=True)
class Pairing:
    """gateway.yml's worker lists, paired by position (see `pair_workers`)."""

    #: One per endpoint, in order: `workers[i].endpoint == endpoints[i]`.
    workers: tuple[ConfiguredWorker, ...]
    #: The metrics endpoints listed beyond the endpoints (`endpoint` is ""), in order.
    unpaired: tuple[ConfiguredWorker, ...]
    #: How many worker names were given (they may be more or fewer than the endpoints).
    names: int

    def check(self) -> None:
        """A `dns:///` endpoint is many workers: it takes no name, and its metrics
        endpoint (if any) is `dns:///` with the same name (each worker's own address,
        on the metrics port).

        Raises:
            ConfigError: naming the first position that breaks the rule.
        """
        for index, worker in enumerate(self.workers):
            endpoint = worker.endpoint
            if worker.dns and worker.name:
                raise ConfigError(
                    f"worker_names[{index}]: endpoints[{index}] is {endpoint}, which names "
                    'every worker the name resolves to; leave its name empty ("")'
                )
            if not worker.metrics:
                continue
            metrics = worker.metrics
            paired = DnsTarget.parse(metrics)
            target = DnsTarget.parse(endpoint)
            if (target is None) != (paired is None) or (
                target is not None and paired is not None and target.name != paired.name
            ):
                raise ConfigError(
                    f"metrics_endpoints[{index}]: '{metrics}' does not pair with "
                    f"endpoints[{index}] '{endpoint}'; a dns:///NAME:PORT endpoint pairs with "
                    "dns:///NAME:METRICS_PORT (the same name), host:port with host:port"
                )

    @property
    def warnings(self) -> tuple[str, ...]:
        """A name count that does not match the endpoints: positions then pair oddly."""
        if self.names and self.names != len(self.workers):
            return (
                f"worker_names has {self.names} names for {len(self.workers)} "
                "endpoints; names pair with endpoints by position, unnamed workers show their URL",
            )
        return ()


def pair_workers(
    endpoints: tuple[str, ...], metrics_endpoints: tuple[str, ...], worker_names: tuple[str, ...]
) -> Pairing:
    """Pair the three checked lists by position: the one place that rule is written.

    Position i past the end of a list has "" there; positions past the endpoints are
    metrics endpoints with no worker (a name at that position still names them).
    """
    positions = max(len(endpoints), len(metrics_endpoints))
    entries = [
        ConfiguredWorker(
            endpoints[i] if i < len(endpoints) else "",
            metrics_endpoints[i] if i < len(metrics_endpoints) else "",
            worker_names[i] if i < len(worker_names) else "",
        )
        for i in range(positions)
    ]
    return Pairing(
        tuple(entries[: len(endpoints)]), tuple(entries[len(endpoints) :]), len(worker_names)
    )
