"""gateway.yml's `tracing:` block, and OpenTelemetry's own variables that set it.

Pure: no trio, no sockets, no logging, no clock, no files.

An SRE team configures tracing the same way for every service it runs: with
OpenTelemetry's environment variables (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`, ...). So those are the
variables of this block's keys (not `REACTANT_GATEWAY_TRACING_*`), read with the
specification's meaning and, as every variable here, beating gateway.yml. Where rsgw
departs from the SDK's defaults, it is to cost nothing unless asked:

- tracing is **off unless an exporter endpoint is configured** (`endpoint` or one of
  the two `OTEL_EXPORTER_OTLP_*ENDPOINT` variables): the SDK's default collector on
  localhost is not assumed, so a gateway with no collector spends nothing on spans;
  `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true` turn it off again;
- the exporter is OTLP over HTTP (`http/protobuf`, the specification's default
  protocol and Triton's); `grpc` and `http/json` are refused by name rather than
  quietly exporting nowhere.

`OTEL_EXPORTER_OTLP_ENDPOINT` is a base URL, to which the specification appends
`v1/traces`; `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` and `tracing.endpoint` are the
traces URL itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from rsgw.base._errors import ConfigError
from rsgw.base._values import Check, check_fields, check_float, check_int, check_str, ranged, words

PROTOCOL = "http/protobuf"
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
# The specification's defaults (OpenTelemetry SDK environment variables).
DEFAULT_SERVICE_NAME = "rsgw"
DEFAULT_SAMPLER = "parentbased_always_on"
DEFAULT_MAX_QUEUE_SIZE = 2048
DEFAULT_MAX_EXPORT_BATCH_SIZE = 512
DEFAULT_SCHEDULE_DELAY_MILLIS = 5000
DEFAULT_EXPORT_TIMEOUT_MILLIS = 30000

#: OpenTelemetry's variable -> the `tracing.` key it sets, and how its text is read.
OTEL_VARIABLES: Mapping[str, tuple[str, str]] = {
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ("endpoint", "str"),
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": ("protocol", "str"),
    "OTEL_SERVICE_NAME": ("service_name", "str"),
    "OTEL_TRACES_SAMPLER": ("sampler", "str"),
    "OTEL_TRACES_SAMPLER_ARG": ("sampler_arg", "float"),
    "OTEL_BSP_MAX_QUEUE_SIZE": ("max_queue_size", "int"),
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": ("max_export_batch_size", "int"),
    "OTEL_BSP_SCHEDULE_DELAY": ("schedule_delay_millis", "int"),
    "OTEL_BSP_EXPORT_TIMEOUT": ("export_timeout_millis", "int"),
}
#: The variables that stand in for a traces variable when it is not set.
OTEL_GENERAL = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
}
#: The variables that can only turn tracing off.
OTEL_SWITCHES = ("OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED")


def _check_endpoint(value: object, key: str) -> str:
    url = check_str(value, key).strip()
    if not url:
        return ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{key} must be an http:// or https:// URL of an OTLP/HTTP traces "
            f"receiver (e.g. http://collector:4318/v1/traces), got {url!r}"
        )
    return url


def _check_protocol(value: object, key: str) -> str:
    protocol = check_str(value, key).strip().lower()
    if protocol != PROTOCOL:
        raise ConfigError(
            f"{key} must be {PROTOCOL} (rsgw exports OTLP over HTTP only), got {value!r}"
        )
    return protocol


_positive = ranged(check_int, lambda n: n > 0, "positive")
_CHECKS: Mapping[str, Check] = {
    "endpoint": _check_endpoint,
    "protocol": _check_protocol,
    "service_name": ranged(check_str, lambda s: bool(s.strip()), "a non-empty name"),
    "sampler": words(SAMPLERS),
    "sampler_arg": ranged(check_float, lambda x: 0 <= x <= 1, "between 0 and 1"),
    "max_queue_size": _positive,
    "max_export_batch_size": _positive,
    "schedule_delay_millis": _positive,
    "export_timeout_millis": _positive,
}


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """Where the gateway's spans go and how many it keeps (the module docstring).

    `endpoint`: the OTLP/HTTP traces URL; "" (the default) is tracing off.
    `sampler` / `sampler_arg`: which calls the gateway starts a trace for, as
    `OTEL_TRACES_SAMPLER` names them (`parentbased_*` follow the caller's choice).
    The batch: spans wait in a queue of at most `max_queue_size` (a full queue drops
    and counts them, never waits), and leave `max_export_batch_size` at a time, every
    `schedule_delay_millis`, each export given `export_timeout_millis`.
    """

    endpoint: str = ""
    protocol: str = PROTOCOL
    service_name: str = DEFAULT_SERVICE_NAME
    sampler: str = DEFAULT_SAMPLER
    sampler_arg: float = 1.0
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    max_export_batch_size: int = DEFAULT_MAX_EXPORT_BATCH_SIZE
    schedule_delay_millis: int = DEFAULT_SCHEDULE_DELAY_MILLIS
    export_timeout_millis: int = DEFAULT_EXPORT_TIMEOUT_MILLIS

    def __post_init__(self) -> None:
        check_fields(self, "tracing.", _CHECKS)
        if self.max_export_batch_size > self.max_queue_size:
            raise ConfigError(
                f"tracing.max_export_batch_size ({self.max_export_batch_size}) must not "
                f"be more than tracing.max_queue_size ({self.max_queue_size})"
            )

    @property
    def enabled(self) -> bool:
        """Whether the gateway makes spans at all: only with somewhere to send them."""
        return bool(self.endpoint)


def _traces_url(base: str) -> str:
    """`OTEL_EXPORTER_OTLP_ENDPOINT`'s traces URL: the base with `v1/traces` appended."""
    return base if not base else base.rstrip("/") + "/v1/traces"


def otel_overrides(env: Mapping[str, str]) -> tuple[dict[str, object], list[str]]:
    """The `tracing.` keys OpenTelemetry's variables in `env` set, and those variables.

    A set, non-blank variable wins over gateway.yml; a traces variable wins over its
    general one. A number that does not parse is an error naming the variable.
    """
    keys: dict[str, object] = {}
    used: list[str] = []
    for general, traces in OTEL_GENERAL.items():
        text = _set(env, general)
        if text is not None and _set(env, traces) is None:
            key = OTEL_VARIABLES[traces][0]
            keys[key] = _traces_url(text.strip()) if key == "endpoint" else text.strip()
            used.append(general)
    for var, (key, kind) in OTEL_VARIABLES.items():
        text = _set(env, var)
        if text is not None:
            keys[key] = _read(var, kind, text.strip())
            used.append(var)
    exporter = (_set(env, "OTEL_TRACES_EXPORTER") or "otlp").strip().lower()
    if exporter not in ("otlp", "none"):
        raise ConfigError(f"OTEL_TRACES_EXPORTER must be otlp or none, got {exporter!r}")
    disabled = (_set(env, "OTEL_SDK_DISABLED") or "").strip().lower() == "true"
    for var, off in zip(OTEL_SWITCHES, (exporter == "none", disabled), strict=True):
        if off:
            keys["endpoint"] = ""
            used.append(var)
    return keys, used


def tracing_from_env(env: Mapping[str, str], service_name: str) -> TracingConfig:
    """The tracing of a process without a gateway.yml (`rsgw worker`): OpenTelemetry's
    variables alone, its spans named `service_name` unless `OTEL_SERVICE_NAME` names
    them otherwise.

    Raises:
        ConfigError: a variable's value is refused; the message names the variable.
    """
    keys, used = otel_overrides(env)
    try:
        return TracingConfig(**{"service_name": service_name, **keys})  # type: ignore[arg-type]
    except ConfigError as exc:
        message = str(exc)
        for var in used:
            setting = OTEL_VARIABLES.get(OTEL_GENERAL.get(var, var))
            if setting is not None:
                message = message.replace(f"tracing.{setting[0]}", var)
        raise ConfigError(message) from None


def _set(env: Mapping[str, str], var: str) -> str | None:
    value = env.get(var)
    return value if value is not None and value.strip() else None


def _read(var: str, kind: str, text: str) -> object:
    if kind == "str":
        return text
    try:
        number = int(text) if kind == "int" else float(text)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):  # as the gateway's own variables: nan and inf are not numbers
        what = "integer" if kind == "int" else "number"
        raise ConfigError(f'{var} has invalid {what} value "{text}"')
    return number
