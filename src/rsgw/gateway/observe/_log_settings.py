"""Triton's LogSettings and TraceSetting, answered by the gateway for itself.

LogSettings reads and sets the gateway's own log level at runtime, in Triton's
terms: `log_verbose_level` above 0 is debug, else the lowest of `log_info`,
`log_warning`, `log_error` switched on is the level (levels nest in Python's
logging: info on means warnings and errors too; all off silences rsgw). The
level is the `rsgw` logger's, so an application that embeds the gateway keeps
its own. `log_file` (rsgw logs to stderr) and `log_format` (json or text, chosen at
start; `auto` is reported as the one it chose) are reported and cannot be changed.
It is the gateway's process only: workers are processes of their own.

TraceSetting reports that rsgw does not trace requests (`trace_level` OFF, with
Triton's defaults for the rest); asking to switch tracing on fails with
FAILED_PRECONDITION rather than pretending to.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import GrpcError, InvalidRequest
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.grpc._metering import metered
from rsgw.grpc._typed import typed_unary
from rsgw.runtime._logging import resolve_format
from rsgw.scheduling.calls._plan import unknown_model

if TYPE_CHECKING:
    from collections.abc import Callable

    from rsgw.base._call import CallContext, UnaryHandler
    from rsgw.gateway.observe._metrics import GatewayMetrics

logger = logging.getLogger(__name__)

#: The logger whose level LogSettings sets: every rsgw module logs under it.
RSGW_LOGGER = "rsgw"
#: What `log_verbose_level` > 0 and each `log_*` switch mean as a Python level.
_SWITCHES = (
    ("log_info", logging.INFO),
    ("log_warning", logging.WARNING),
    ("log_error", logging.ERROR),
)
#: Above every level: all switches off.
_SILENT = logging.CRITICAL + 1
#: Triton's trace settings with tracing off.
_TRACE_OFF = {
    "trace_level": ["OFF"],
    "trace_rate": ["1000"],
    "trace_count": ["-1"],
    "log_frequency": ["0"],
}


class ServerSettings:
    """The handlers of LogSettings and TraceSetting; see the module docstring.

    Args:
        log_format: the format the gateway logs in (reported as `log_format`; `auto`
            as json or text, what it resolves to on stderr, as `configure_logging` does).
        known: whether a model name is one the fleet serves or served.
    """

    def __init__(
        self, metrics: GatewayMetrics, log_format: str, known: Callable[[str], bool]
    ) -> None:
        self.metrics = metrics
        self.log_format = resolve_format(log_format)
        self._known = known

    def handlers(self) -> dict[Method, UnaryHandler]:
        return {
            Method.LOG_SETTINGS: typed_unary(pb.LogSettingsRequest, self.log_settings),
            Method.TRACE_SETTING: typed_unary(pb.TraceSettingRequest, self.trace_setting),
        }

    async def log_settings(
        self, request: pb.LogSettingsRequest, call: CallContext
    ) -> pb.LogSettingsResponse:
        with metered(call, self.metrics.observer(Method.LOG_SETTINGS.rpc)):
            target = logging.getLogger(RSGW_LOGGER)
            if request.settings:
                level = _requested_level(request, target.getEffectiveLevel(), self.log_format)
                if level != target.getEffectiveLevel():
                    target.setLevel(level)
                    logger.warning(
                        "log level changed by LogSettings",
                        extra={"level": logging.getLevelName(level).lower(), "peer": call.peer},
                    )
            return self._current(target.getEffectiveLevel())

    def _current(self, level: int) -> pb.LogSettingsResponse:
        response = pb.LogSettingsResponse()
        settings = response.settings
        settings["log_file"].string_param = ""
        for name, switch_level in _SWITCHES:
            settings[name].bool_param = level <= switch_level
        settings["log_verbose_level"].uint32_param = 1 if level <= logging.DEBUG else 0
        settings["log_format"].string_param = self.log_format
        return response

    async def trace_setting(
        self, request: pb.TraceSettingRequest, call: CallContext
    ) -> pb.TraceSettingResponse:
        with metered(call, self.metrics.observer(Method.TRACE_SETTING.rpc)):
            if request.model_name and not self._known(request.model_name):
                raise unknown_model(request.model_name)
            for name, value in request.settings.items():
                wanted = list(value.value)
                if name == "trace_level" and wanted and wanted != ["OFF"]:
                    raise GrpcError(
                        StatusCode.FAILED_PRECONDITION,
                        f"rsgw does not trace requests; trace_level stays OFF (asked {wanted})",
                    )
                if name not in _TRACE_OFF:
                    raise InvalidRequest(f"unknown trace setting '{name}'")
            response = pb.TraceSettingResponse()
            for name, values in _TRACE_OFF.items():
                response.settings[name].value.extend(values)
            return response


def _requested_level(request: pb.LogSettingsRequest, current: int, log_format: str) -> int:
    """The level a LogSettings update asks for, starting from `current`."""
    switches = {name: current <= level for name, level in _SWITCHES}
    verbose = current <= logging.DEBUG
    for name, value in request.settings.items():
        kind = value.WhichOneof("parameter_choice")
        if name in switches:
            switches[name] = _typed(name, value, kind, "bool_param")  # type: ignore[assignment]
        elif name == "log_verbose_level":
            verbose = bool(_typed(name, value, kind, "uint32_param"))
        elif name in ("log_file", "log_format"):
            fixed = "" if name == "log_file" else log_format
            if _typed(name, value, kind, "string_param") != fixed:
                raise InvalidRequest(
                    f"{name} cannot be changed at runtime (it is {fixed!r}"
                    + (": rsgw logs to stderr)" if name == "log_file" else ")")
                )
        else:
            raise InvalidRequest(f"unknown log setting '{name}'")
    if verbose:
        return logging.DEBUG
    return next((level for name, level in _SWITCHES if switches[name]), _SILENT)


def _typed(
    name: str, value: pb.LogSettingsRequest.SettingValue, kind: str | None, expected: str
) -> bool | int | str:
    if kind != expected:
        raise InvalidRequest(f"log setting '{name}' takes a {expected}, got {kind or 'nothing'}")
    found: bool | int | str = getattr(value, expected)
    return found
