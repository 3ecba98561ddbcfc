"""Issue 51, acceptance 3: a real Prometheus with exemplar storage on, scraping a real
`rsgw node` whose gateway traces (to `tests.otlp`'s receiver), returns the trace id of
a call made through the gateway as an exemplar of the request-latency histogram
(`/api/v1/query_exemplars`).

Prometheus asks every target for OpenMetrics first, so this is also the OpenMetrics
answer, the workers' series converted into it, read by Prometheus's own parser.
Skipped without a `prometheus` binary, as `test_prometheus` is.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from tests.gateway.test_tracing import CALLER_TRACE, SERVER, TRACEPARENT
from tests.helpers import infer_request, simple_inputs
from tests.observability.test_prometheus import MODEL_INFER, Prometheus, pytestmark, start_node
from tests.otlp import ReceivedSpan, otlp_receiver

__all__ = ["pytestmark"]  # the same skip as test_prometheus

HISTOGRAM = 'gateway_request_latency_seconds_bucket{model="m1",rpc="ModelInfer"}'


def test_prometheus_returns_the_trace_of_a_call_as_an_exemplar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        prometheus = Prometheus(tmp_path, features=("exemplar-storage",))
        node = start_node(tmp_path, "round_robin")
        try:
            prometheus.scrape(node)
            prometheus.wait_for(
                "a scrape of the gateway",
                lambda: prometheus.api("query", query="gateway_build_info")["result"],
            )
            started = time.time()
            with grpc.insecure_channel(f"127.0.0.1:{node.grpc_port}") as channel:
                body = infer_request("m1", simple_inputs(1)).SerializeToString()
                channel.unary_unary(MODEL_INFER)(
                    body, timeout=10, metadata=[("traceparent", TRACEPARENT)]
                )

            def gateways(got: list[ReceivedSpan]) -> list[ReceivedSpan]:
                """The gateway's own span of the call (its workers export theirs too)."""
                return [
                    s
                    for s in got
                    if s.trace_id == CALLER_TRACE and s.kind == SERVER and s.service == "rsgw"
                ]

            (server,) = gateways(receiver.wait_for(lambda got: bool(gateways(got))))

            def exemplars() -> list[dict[str, str]]:
                found = prometheus.api(
                    "query_exemplars", query=HISTOGRAM, start=started - 60, end=time.time() + 60
                )
                return [e["labels"] for series in found for e in series["exemplars"]]

            prometheus.wait_for("the call's exemplar", exemplars)
            assert exemplars() == [
                {"trace_id": f"{CALLER_TRACE:032x}", "span_id": f"{server.span_id:016x}"}
            ]
            # OpenMetrics scrapes throughout: the target stayed up.
            up = prometheus.api("query", query='up{job="rsgw"}')["result"]
            assert up and all(r["value"][1] == "1" for r in up), up
        finally:
            node.stop(timeout=30)
            prometheus.close()
