"""gateway.yml's worker lists: the checks of each entry.

Pure: no trio, no sockets, no logging, no clock, no files.

`endpoints`, `metrics_endpoints` and `worker_names` are three parallel lists:
`endpoints[i]` is a worker, `metrics_endpoints[i]` its Prometheus endpoint and
`worker_names[i]` its name, by position; metrics endpoints listed beyond the endpoints
pair with no worker (scraped under their own name), and a `dns:///NAME:PORT` endpoint
is every worker NAME resolves to, so it takes no name and pairs only with
`dns:///NAME:METRICS_PORT`.
"""

from __future__ import annotations

import re

from rsgw._errors import ConfigError
from rsgw._values import check_str, must_be
from rsgw.scheduling._membership import DNS_SCHEME, DnsTarget, MembershipError

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
