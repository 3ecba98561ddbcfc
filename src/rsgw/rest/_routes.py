"""Triton's KServe V2 REST API, endpoint by endpoint, as the gRPC calls the gateway answers.

Pure. Each REST endpoint is one gRPC method of the gateway (`rsgw.base._methods`): `match`
finds it from the HTTP method and path, and the route says how to build that
method's request from the URL and the JSON body and how to write its reply the way
Triton's REST server writes it. The door (`rsgw.rest._door`) runs the gateway's own
handler in between, so a REST call is routed, fanned out, guarded and counted as the
same gRPC call is. Inference is not here: its body is tensors, not a message
(`rsgw.rest._codec`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._methods import Method
from rsgw.rest._json import dumps, loads_object, message_json, parse_into
from rsgw.rest._rest_errors import RestError

if TYPE_CHECKING:
    from google.protobuf.message import Message


@dataclass(frozen=True, slots=True)
class Target:
    """What a path names: a model (and version), a shared memory region, or nothing."""

    model: str = ""
    version: str = ""
    region: str = ""


#: A route's request builder: the URL's target and the body -> the gRPC request bytes.
Build = Callable[[Target, bytes], bytes]
#: A route's reply writer: the gRPC reply bytes -> (HTTP status, JSON body or b"").
Render = Callable[[bytes], tuple[int, bytes]]


@dataclass(frozen=True, slots=True)
class Route:
    """One REST endpoint: the gRPC method it is, how to ask it and how to answer."""

    method: Method
    build: Build
    render: Render


def _empty(_: Target, __: bytes) -> bytes:
    return b""


def _json_of(cls: type[Message], *, defaults: bool = False) -> Render:
    def render(reply: bytes) -> tuple[int, bytes]:
        return 200, dumps(message_json(cls.FromString(reply), defaults=defaults))

    return render


def _ok(_: bytes) -> tuple[int, bytes]:
    return 200, b""


def _flag(
    cls: type[pb.ServerLiveResponse | pb.ServerReadyResponse | pb.ModelReadyResponse],
) -> Render:
    """Health and readiness: 200 when true, 400 when not, as Triton answers them, with
    `{"live": ...}` or `{"ready": ...}` as the body where Triton sends none: Triton's
    clients read the status alone, and KServe's REST client reads the body."""
    field = "live" if cls is pb.ServerLiveResponse else "ready"

    def render(reply: bytes) -> tuple[int, bytes]:
        value = bool(getattr(cls.FromString(reply), field))
        return (200 if value else 400), dumps({field: value})

    return render


def _model_request(cls: type[Message]) -> Build:
    def build(target: Target, _: bytes) -> bytes:
        return cls(name=target.model, version=target.version).SerializeToString()

    return build


def _config(reply: bytes) -> tuple[int, bytes]:
    """ModelConfig: Triton's REST answer is the configuration itself, not wrapped."""
    config = pb.ModelConfigResponse.FromString(reply).config
    return 200, dumps(message_json(config, defaults=True))


def _index_request(_: Target, body: bytes) -> bytes:
    document = loads_object(body, "the repository index request")
    return parse_into(
        document, pb.RepositoryIndexRequest(), "repository index request"
    ).SerializeToString()


def _index(reply: bytes) -> tuple[int, bytes]:
    """RepositoryIndex: a JSON list of the models, as Triton answers it."""
    models = pb.RepositoryIndexResponse.FromString(reply).models
    return 200, dumps([message_json(m) for m in models])


def _repository_parameters(body: bytes, what: str) -> dict[str, pb.ModelRepositoryParameter]:
    """`{"parameters": {...}}`: `file:` entries are base64 model files, the rest by JSON type."""
    document = loads_object(body, what)
    raw = document.get("parameters", {})
    if not isinstance(raw, dict):
        raise RestError(400, f"{what}: 'parameters' must be a JSON object")
    parameters: dict[str, pb.ModelRepositoryParameter] = {}
    for key, value in raw.items():
        parameter = pb.ModelRepositoryParameter()
        if key.startswith("file:"):
            try:
                parameter.bytes_param = base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError):
                raise RestError(400, f"{what}: parameter '{key}' must be base64") from None
        elif isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            parameter.int64_param = value
        elif isinstance(value, str):
            parameter.string_param = value
        else:
            raise RestError(400, f"{what}: parameter '{key}' must be a string, integer or bool")
        parameters[key] = parameter
    return parameters


def _load(target: Target, body: bytes) -> bytes:
    parameters = _repository_parameters(body, "the load request")
    request = pb.RepositoryModelLoadRequest(model_name=target.model, parameters=parameters)
    return request.SerializeToString()


def _unload(target: Target, body: bytes) -> bytes:
    parameters = _repository_parameters(body, "the unload request")
    request = pb.RepositoryModelUnloadRequest(model_name=target.model, parameters=parameters)
    return request.SerializeToString()


def _region_status(cls: type[Message]) -> Build:
    def build(target: Target, _: bytes) -> bytes:
        return cls(name=target.region).SerializeToString()

    return build


def _regions(
    cls: type[pb.SystemSharedMemoryStatusResponse | pb.CudaSharedMemoryStatusResponse],
) -> Render:
    """Shared memory status: a JSON list of the regions, as Triton answers it."""

    def render(reply: bytes) -> tuple[int, bytes]:
        regions = cls.FromString(reply).regions
        return 200, dumps([message_json(regions[name]) for name in sorted(regions)])

    return render


def _register(cls: type[Message]) -> Build:
    def build(target: Target, body: bytes) -> bytes:
        document: dict[str, Any] = dict(loads_object(body, "the register request"))
        handle = document.get("raw_handle")
        if isinstance(handle, dict) and "b64" in handle:  # CUDA: {"raw_handle": {"b64": ...}}
            document["raw_handle"] = handle["b64"]
        document["name"] = target.region
        return parse_into(document, cls(), "register request").SerializeToString()

    return build


def _log_request(_: Target, body: bytes) -> bytes:
    """LogSettings: Triton's REST body is a flat object; each value by its JSON type."""
    request = pb.LogSettingsRequest()
    for key, value in loads_object(body, "the log settings").items():
        setting = request.settings[key]
        if isinstance(value, bool):
            setting.bool_param = value
        elif isinstance(value, int) and value >= 0:
            setting.uint32_param = value
        elif isinstance(value, str):
            setting.string_param = value
        else:
            raise RestError(400, f"log setting '{key}' must be a bool, integer >= 0 or string")
    return request.SerializeToString()


def _log(reply: bytes) -> tuple[int, bytes]:
    settings = pb.LogSettingsResponse.FromString(reply).settings
    flat: dict[str, Any] = {}
    for key in sorted(settings):
        value = settings[key]
        choice = value.WhichOneof("parameter_choice")
        flat[key] = getattr(value, choice) if choice else None
    return 200, dumps(flat)


def _trace_request(target: Target, body: bytes) -> bytes:
    """TraceSetting: Triton's REST values are strings or lists of strings (null clears)."""
    request = pb.TraceSettingRequest(model_name=target.model)
    for key, value in loads_object(body, "the trace settings").items():
        setting = request.settings[key]
        if value is None:
            continue  # an empty value list: back to the default
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in values):
            raise RestError(400, f"trace setting '{key}' must be a string or a list of strings")
        setting.value.extend(str(v) for v in values)
    return request.SerializeToString()


def _trace(reply: bytes) -> tuple[int, bytes]:
    settings = pb.TraceSettingResponse.FromString(reply).settings
    flat: dict[str, Any] = {}
    for key in sorted(settings):
        values = list(settings[key].value)
        flat[key] = values[0] if len(values) == 1 else values
    return 200, dumps(flat)


SERVER_METADATA = Route(Method.SERVER_METADATA, _empty, _json_of(pb.ServerMetadataResponse))
LIVE = Route(Method.SERVER_LIVE, _empty, _flag(pb.ServerLiveResponse))
READY = Route(Method.SERVER_READY, _empty, _flag(pb.ServerReadyResponse))
MODEL_METADATA = Route(
    Method.MODEL_METADATA,
    _model_request(pb.ModelMetadataRequest),
    _json_of(pb.ModelMetadataResponse),
)
MODEL_READY = Route(
    Method.MODEL_READY, _model_request(pb.ModelReadyRequest), _flag(pb.ModelReadyResponse)
)
MODEL_CONFIG = Route(Method.MODEL_CONFIG, _model_request(pb.ModelConfigRequest), _config)
MODEL_STATISTICS = Route(
    Method.MODEL_STATISTICS,
    _model_request(pb.ModelStatisticsRequest),
    _json_of(pb.ModelStatisticsResponse, defaults=True),
)
INDEX = Route(Method.REPOSITORY_INDEX, _index_request, _index)
LOAD = Route(Method.REPOSITORY_MODEL_LOAD, _load, _ok)
UNLOAD = Route(Method.REPOSITORY_MODEL_UNLOAD, _unload, _ok)
LOGGING_GET = Route(Method.LOG_SETTINGS, _empty, _log)
LOGGING_SET = Route(Method.LOG_SETTINGS, _log_request, _log)
TRACE = Route(Method.TRACE_SETTING, _trace_request, _trace)
#: Inference: built and written by the tensor codec, not by a route's functions.
INFER = Route(Method.MODEL_INFER, _empty, _ok)

_SHARED_MEMORY = {
    "systemsharedmemory": (
        Route(
            Method.SHM_STATUS,
            _region_status(pb.SystemSharedMemoryStatusRequest),
            _regions(pb.SystemSharedMemoryStatusResponse),
        ),
        Route(Method.SHM_REGISTER, _register(pb.SystemSharedMemoryRegisterRequest), _ok),
        Route(Method.SHM_UNREGISTER, _region_status(pb.SystemSharedMemoryUnregisterRequest), _ok),
    ),
    "cudasharedmemory": (
        Route(
            Method.CUDA_SHM_STATUS,
            _region_status(pb.CudaSharedMemoryStatusRequest),
            _regions(pb.CudaSharedMemoryStatusResponse),
        ),
        Route(Method.CUDA_SHM_REGISTER, _register(pb.CudaSharedMemoryRegisterRequest), _ok),
        Route(
            Method.CUDA_SHM_UNREGISTER, _region_status(pb.CudaSharedMemoryUnregisterRequest), _ok
        ),
    ),
}
_MODEL_ACTIONS = {
    ("GET", "ready"): MODEL_READY,
    ("GET", "config"): MODEL_CONFIG,
    ("GET", "stats"): MODEL_STATISTICS,
    ("POST", "infer"): INFER,
}


def match(verb: str, path: str) -> tuple[Route, Target]:
    """The endpoint `verb path` names, and what its path names.

    Raises:
        RestError: 404 for a path that is not an endpoint, 405 for a verb it does not take.
    """
    parts = path.strip("/").split("/")
    if not parts or parts[0] != "v2":
        raise RestError(404, f"no such endpoint: {path[:200]}")
    rest = parts[1:]
    found = _match(rest)
    if found is None:
        raise RestError(404, f"no such endpoint: {path[:200]}")
    verbs, target = found
    route = verbs.get(verb) or (verbs.get("GET") if verb == "HEAD" else None)
    if route is None:
        raise RestError(
            405, f"{verb} is not allowed on {path[:200]} (use {', '.join(sorted(verbs))})"
        )
    return route, target


def _match(rest: list[str]) -> tuple[dict[str, Route], Target] | None:
    if not rest:
        return {"GET": SERVER_METADATA}, Target()
    head, *tail = rest
    if head == "health" and tail in (["live"], ["ready"]):
        return {"GET": LIVE if tail == ["live"] else READY}, Target()
    if head == "logging" and not tail:
        return {"GET": LOGGING_GET, "POST": LOGGING_SET}, Target()
    if head == "trace" and tail == ["setting"]:
        return {"GET": TRACE, "POST": TRACE}, Target()
    if head == "repository":
        if tail == ["index"]:
            return {"POST": INDEX}, Target()
        if len(tail) == 3 and tail[0] == "models" and tail[2] in ("load", "unload"):
            return {"POST": LOAD if tail[2] == "load" else UNLOAD}, Target(model=tail[1])
        return None
    if head in _SHARED_MEMORY:
        status, register, unregister = _SHARED_MEMORY[head]
        region = ""
        if len(tail) >= 2 and tail[0] == "region":
            region, tail = tail[1], tail[2:]
        if tail == ["status"]:
            return {"GET": status}, Target(region=region)
        if tail == ["register"] and region:
            return {"POST": register}, Target(region=region)
        if tail == ["unregister"]:
            return {"POST": unregister}, Target(region=region)
        return None
    if head == "models":
        return _match_model(tail)
    return None


def _match_model(tail: list[str]) -> tuple[dict[str, Route], Target] | None:
    if tail == ["stats"]:
        return {"GET": MODEL_STATISTICS}, Target()
    if not tail or not tail[0]:
        return None
    model, *tail = tail
    version = ""
    if len(tail) >= 2 and tail[0] == "versions":
        version, tail = tail[1], tail[2:]
    target = Target(model=model, version=version)
    if not tail:
        return {"GET": MODEL_METADATA}, target
    if tail == ["trace", "setting"] and not version:
        return {"GET": TRACE, "POST": TRACE}, target
    if len(tail) == 1:
        verbs = {verb: r for (verb, action), r in _MODEL_ACTIONS.items() if action == tail[0]}
        return (verbs, target) if verbs else None
    return None
