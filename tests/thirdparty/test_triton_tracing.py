"""One trace from the client to Triton through `rsgw run` (issue 51, acceptance 1).

A real Triton 2.51 (nvidia-pytriton's `tritonserver`, CPU) exporting its spans over
OTLP/HTTP (`--trace-config mode=opentelemetry`), `rsgw run` in front of it configured
by OpenTelemetry's own variables, and `tests.otlp`'s receiver taking both exports.
A gRPC ModelInfer and a REST infer carrying a `traceparent`: rsgw's span is a child
of the caller's, and Triton's spans are in the same trace, under one of rsgw's. A
call without one starts a trace at the gateway (always-on sampler) that Triton joins.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.helpers import WorkerProcess, client_inputs, start_rsgw_process
from tests.otlp import ReceivedSpan, Receiver, otlp_receiver
from tests.thirdparty import triton
from tests.thirdparty.servers import free_ports

pytestmark = pytest.mark.slow

SERVER = 2  # OTLP's SpanKind.SERVER


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def tritond(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Any]:
    if not triton.available():
        pytest.skip(triton.MISSING)
    workdir = tmp_path_factory.mktemp("triton")
    repository = triton.write_repository(workdir / "models", [triton.TritonModel("simple")])
    trace_flags = [
        "mode=opentelemetry",
        "rate=1",
        "level=TIMESTAMPS",
        f"opentelemetry,url=127.0.0.1:{receiver.port}/v1/traces",
        "opentelemetry,resource=service.name=triton",
    ]
    extra = [arg for flag in trace_flags for arg in ("--trace-config", flag)]
    server = triton.start_triton(repository, workdir, extra=extra)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(tritond: Any, receiver: Receiver) -> Iterator[tuple[WorkerProcess, int]]:
    (http_port,) = free_ports(1)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("REACTANT_", "OTEL_"))},
        "REACTANT_GATEWAY_WORKERS": tritond.target,
        "REACTANT_GATEWAY_WORKER_METRICS": f"127.0.0.1:{tritond.metrics_port}",
        "REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_METRICS": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_HTTP": f"127.0.0.1:{http_port}",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTEL_SERVICE_NAME": "rsgw",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    process = start_rsgw_process("run", "--log-format", "json", event="gateway serving", env=env)
    try:
        yield process, http_port
    finally:
        process.stop()


def _joined(receiver: Receiver, trace_id: int) -> tuple[ReceivedSpan, list[ReceivedSpan]]:
    """rsgw's server span of the trace, once a Triton span nested under rsgw is in."""

    def complete(spans: list[ReceivedSpan]) -> bool:
        ours = {s.span_id for s in spans if s.trace_id == trace_id and s.service == "rsgw"}
        return any(s.service == "triton" and s.parent_id in ours for s in spans)

    spans = [s for s in receiver.wait_for(complete, timeout=60) if s.trace_id == trace_id]
    (server,) = [s for s in spans if s.service == "rsgw" and s.kind == SERVER]
    return server, [s for s in spans if s.service == "triton"]


@pytest.mark.parametrize("door", ["grpc", "rest"])
def test_a_callers_trace_goes_through_rsgw_into_triton(
    gateway: tuple[WorkerProcess, int], receiver: Receiver, door: str
) -> None:
    process, http_port = gateway
    trace_id = int.from_bytes(os.urandom(16), "big") | 1
    span_id = int.from_bytes(os.urandom(8), "big") | 1
    headers = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}
    if door == "grpc":
        client: Any = grpcclient.InferenceServerClient(process.target)
        client.infer("simple", client_inputs(grpcclient.InferInput), headers=headers)
    else:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        client.infer("simple", client_inputs(httpclient.InferInput), headers=dict(headers))
    client.close()
    server, tritons = _joined(receiver, trace_id)
    assert server.parent_id == span_id  # rsgw's span is the caller's child
    assert server.attributes["rsgw.protocol"] == door
    assert any(s.name == "InferRequest" for s in tritons), [s.name for s in tritons]


def test_a_call_without_a_context_starts_a_trace_triton_joins(
    gateway: tuple[WorkerProcess, int], receiver: Receiver
) -> None:
    process, _ = gateway
    before = {s.trace_id for s in receiver.spans}
    client = grpcclient.InferenceServerClient(process.target)
    client.infer("simple", client_inputs(grpcclient.InferInput))
    client.close()

    def started(spans: list[ReceivedSpan]) -> bool:
        return any(
            s.service == "rsgw" and s.kind == SERVER and s.trace_id not in before for s in spans
        )

    spans = receiver.wait_for(started, timeout=60)
    (new,) = {
        s.trace_id
        for s in spans
        if s.service == "rsgw" and s.kind == SERVER and s.trace_id not in before
    }
    server, tritons = _joined(receiver, new)
    assert server.parent_id == 0  # a root: the gateway started the trace
    assert tritons


def test_prometheus_reads_tritons_series_through_the_gateway_as_openmetrics(
    gateway: tuple[WorkerProcess, int],
) -> None:
    """With tracing on, Prometheus (which asks for OpenMetrics) gets Triton's own
    exposition converted: valid OpenMetrics, Triton's series under their own names."""
    process, _ = gateway
    client = grpcclient.InferenceServerClient(process.target)
    client.infer("simple", client_inputs(grpcclient.InferInput))
    client.close()
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    answer = httpx.get(
        f"http://127.0.0.1:{process.metrics_port}/metrics", headers={"accept": accept}
    )
    assert answer.headers["content-type"].startswith("application/openmetrics-text")
    families = list(text_string_to_metric_families(answer.text))  # type: ignore[no-untyped-call]
    samples = {sample.name for family in families for sample in family.samples}
    assert "nv_inference_request_success" in samples  # not renamed `_total`
    assert "nv_inference_request_duration_us" in samples
    assert "gateway_request_latency_seconds_bucket" in samples
