"""ControlService and repository calls for the worker tests, through grpcio.

Blocking, like the rest of tests/helpers.py: call them directly from sync tests
and through `in_thread` from trio tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import grpc
import httpx
from prometheus_client.parser import text_string_to_metric_families

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb

if TYPE_CHECKING:
    from collections.abc import Callable

    from google.protobuf.message import Message

R = TypeVar("R")

CONTROL = "/reactant_control.ControlService/"
INFERENCE = "/inference.GRPCInferenceService/"


def call(target: str, path: str, request: Message, response_type: type[R]) -> R:
    """One unary call with protobuf messages; raises `grpc.RpcError` on a non-OK status."""
    with grpc.insecure_channel(target) as channel:
        method = channel.unary_unary(
            path,
            request_serializer=request.SerializeToString,
            response_deserializer=response_type.FromString,  # type: ignore[attr-defined]
        )
        response = method(request, timeout=10.0)
    assert isinstance(response, response_type)
    return response


def set_residency(target: str, model: str, residency: int) -> int:
    """SetModelResidency; returns the residency the worker reports afterwards."""
    request = cpb.SetModelResidencyRequest(name=model, target=residency)  # type: ignore[arg-type]
    response = call(target, CONTROL + "SetModelResidency", request, cpb.SetModelResidencyResponse)
    return int(response.residency)


def set_weight(target: str, model: str, weight: float, *, has_weight: bool = True) -> None:
    request = cpb.SetModelPolicyRequest(name=model, has_weight=has_weight, weight=weight)
    call(target, CONTROL + "SetModelPolicy", request, cpb.SetModelPolicyResponse)


def compact(target: str, *reload: str) -> tuple[int, int]:
    """CompactMemory; returns (reloaded_models, resident_bytes_after)."""
    request = cpb.CompactMemoryRequest(reload_models=list(reload))
    response = call(target, CONTROL + "CompactMemory", request, cpb.CompactMemoryResponse)
    return response.reloaded_models, response.resident_bytes_after


def repository_index(target: str, *, ready: bool) -> list[tuple[str, str]]:
    """RepositoryIndex as (name, state) pairs."""
    request = pb.RepositoryIndexRequest(ready=ready)
    response = call(target, INFERENCE + "RepositoryIndex", request, pb.RepositoryIndexResponse)
    return [(m.name, m.state) for m in response.models]


def model_ready(target: str, model: str) -> bool:
    request = pb.ModelReadyRequest(name=model)
    return call(target, INFERENCE + "ModelReady", request, pb.ModelReadyResponse).ready


def rpc_error(fn: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """Run `fn`, which must fail with a gRPC status; its code and details."""
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    raise AssertionError("the call succeeded; expected a gRPC error")


def scrape(metrics_port: int) -> dict[str, float]:
    """A worker's /metrics as {sample name: value}, for the series without a model label."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10.0).text
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "model" not in sample.labels:
                samples[sample.name] = sample.value
    return samples


def scrape_models(metrics_port: int, name: str) -> dict[str, float]:
    """One per-model series of a worker's /metrics as {model: value}."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10.0).text
    return {
        sample.labels["model"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }
