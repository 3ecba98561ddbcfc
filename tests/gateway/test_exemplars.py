"""From metrics to traces: a traced call's trace in its latency bucket and access line.

A real fleet with the gateway's tracing on (spans to `tests.otlp`'s receiver), real
clients: `/metrics` asked for OpenMetrics (as Prometheus asks) carries an exemplar on
the request-latency bucket of each door (gRPC, REST) whose trace and span ids are the
gateway's server span's as the receiver got it; asked for the text format it carries
none; the access line of a sampled call names the same ids, that of an unsampled one
does not.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families as text_families

from rsgw.config._config import LoggingConfig
from tests.gateway.fleet import Fleet, open_fleet
from tests.gateway.test_tracing import CALLER_SPAN, CALLER_TRACE, SERVER, TRACEPARENT, tracing
from tests.helpers import in_thread, simple_inputs
from tests.otlp import ReceivedSpan, Receiver, otlp_receiver
from tests.test_openmetrics import oracle

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
UNSAMPLED = f"00-{CALLER_TRACE + 1:032x}-{CALLER_SPAN:016x}-00"
REST_TRACE = CALLER_TRACE + 2


async def _scrape(fleet: Fleet, accept: str | None) -> httpx.Response:
    headers = {} if accept is None else {"accept": accept}
    async with httpx.AsyncClient() as client:
        url = f"http://127.0.0.1:{fleet.gateway.admin_port}/metrics"
        response = await client.get(url, headers=headers)
    assert response.status_code == 200
    return response


async def _call(fleet: Fleet, traceparent: str, rest: bool = False) -> None:
    """A ModelInfer through the gateway's gRPC door (tritonclient), or its REST door."""
    kind: Any = httpclient if rest else grpcclient
    target = f"127.0.0.1:{fleet.gateway.http_port}" if rest else fleet.target
    client = kind.InferenceServerClient(target)
    inputs = []
    for name, array in simple_inputs(3).items():
        tensor = kind.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    headers = {"traceparent": traceparent}
    try:
        await in_thread(lambda: client.infer("simple", inputs, headers=headers))
    finally:
        client.close()


async def _server_span(receiver: Receiver, trace_id: int = CALLER_TRACE) -> ReceivedSpan:
    spans = await in_thread(
        lambda: receiver.wait_for(
            lambda got: any(s.trace_id == trace_id and s.kind == SERVER for s in got)
        )
    )
    (server,) = [s for s in spans if s.trace_id == trace_id and s.kind == SERVER]
    return server


def _ids(span: ReceivedSpan) -> dict[str, str]:
    return {"trace_id": f"{span.trace_id:032x}", "span_id": f"{span.span_id:016x}"}


async def test_the_latency_bucket_of_a_traced_call_names_its_trace() -> None:
    with otlp_receiver() as receiver:
        async with open_fleet(1, tracing=tracing(receiver.url)) as fleet:
            await _call(fleet, TRACEPARENT)
            await _call(fleet, UNSAMPLED)
            await _call(fleet, f"00-{REST_TRACE:032x}-{CALLER_SPAN:016x}-01", rest=True)
            server = await _server_span(receiver)
            rest_server = await _server_span(receiver, REST_TRACE)
            openmetrics = await _scrape(fleet, PROMETHEUS_ACCEPT)
            text = await _scrape(fleet, None)
    assert openmetrics.headers["content-type"] == (
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    )
    (latency,) = [
        f
        for f in oracle(openmetrics.text)  # it must parse
        if f.name == "gateway_request_latency_seconds"
    ]
    exemplars = {
        s.labels["protocol"]: s.exemplar
        for s in latency.samples
        if s.exemplar is not None and s.labels["model"] == "simple"
    }
    # The unsampled call's trace was not exported: no exemplar leads to it.
    assert {door: e.labels for door, e in exemplars.items()} == {
        "grpc": _ids(server),
        "rest": _ids(rest_server),
    }
    assert all(e.value > 0 and e.timestamp is not None for e in exemplars.values())
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert " # {" not in text.text and "# EOF" not in text.text
    assert any(f.name == "gateway_request_latency_seconds" for f in text_families(text.text))


async def test_the_access_line_of_a_sampled_call_names_its_trace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logging_config = dataclasses.replace(LoggingConfig(), access_log_sample_rate=1.0)
    caplog.set_level(logging.INFO, logger="rsgw.access")
    with otlp_receiver() as receiver:
        async with open_fleet(1, tracing=tracing(receiver.url), logging=logging_config) as fleet:
            await _call(fleet, TRACEPARENT)
            await _call(fleet, UNSAMPLED)
            server = await _server_span(receiver)
    sampled, unsampled = [r.__dict__ for r in caplog.records if r.getMessage() == "access"]
    assert sampled["trace_id"] == f"{server.trace_id:032x}" == f"{CALLER_TRACE:032x}"
    assert sampled["span_id"] == f"{server.span_id:016x}"
    assert "trace_id" not in unsampled and "span_id" not in unsampled
    assert unsampled["model"] == "simple" and unsampled["status"] == "OK"
