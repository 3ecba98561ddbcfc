"""rsgw / Latency & Errors: how fast and how well are calls answered?

Latency quantiles as a client sees them (the gateway's histogram), on the gateway's calls
to each worker, and inside the workers; calls by model and status and by protocol (gRPC
and REST), errors, calls shed at the admission cap and failovers, and each tenant's
calls by outcome (issue 52).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._frame import INFER, RATE, S, board, graph, q

if TYPE_CHECKING:
    from grafana_foundation_sdk.models.dashboard import Dashboard

MODEL = f'{INFER},model=~"$model"'


def quantile(level: str, metric: str, by: str, selector: str) -> str:
    """The `level` quantile of histogram `metric` per `by` label, over the rate window."""
    return (
        f"histogram_quantile({level}, sum by (le, {by}) "
        f"(rate({metric}_bucket{{{selector}}}{RATE})))"
    )


def latency_errors() -> Dashboard:
    return board(
        "rsgw-latency",
        "rsgw / Latency & Errors",
        "How fast and how well are calls answered, per model and status?",
        [
            graph(
                "Latency p50 and p99 by model (gateway)",
                "From gateway_request_latency_seconds: what a client sees, less the network.",
                q(
                    quantile("0.99", "gateway_request_latency_seconds", "model", MODEL),
                    "p99 {{model}}",
                ),
                q(
                    quantile("0.5", "gateway_request_latency_seconds", "model", MODEL),
                    "p50 {{model}}",
                ),
                unit="s",
            ),
            graph(
                "Calls by model and status",
                "ModelInfer calls per second by model and gRPC status.",
                q(
                    f"sum by (model, status) (rate(gateway_requests_total{{{MODEL}}}{RATE}))",
                    "{{model}} {{status}}",
                ),
                unit="reqps",
            ),
            graph(
                "Calls and latency p99 by protocol",
                "ModelInfer through each door: gRPC (8001) and Triton's REST API (8000).",
                q(
                    f"sum by (protocol) (rate(gateway_requests_total{{{MODEL}}}{RATE}))",
                    "{{protocol}} calls/s",
                ),
                q(
                    quantile("0.99", "gateway_request_latency_seconds", "protocol", MODEL),
                    "{{protocol}} p99 (s)",
                ),
            ),
            graph(
                "Errors by status",
                "Calls of any method that did not end OK.",
                q(
                    f'sum by (status) (rate(gateway_requests_total{{{S},status!="OK"}}{RATE}))'
                    " or vector(0)",
                    "{{status}}",
                ),
                unit="reqps",
            ),
            graph(
                "Shed and failed over",
                "Calls shed at the admission cap; calls sent on to another replica, and "
                "failovers refused because the retry budget was spent.",
                q(f"sum(rate(gateway_requests_shed_total{{{S}}}{RATE}))", "shed"),
                q(f"sum(rate(gateway_failovers_total{{{S}}}{RATE}))", "failed over"),
                q(f"sum(rate(gateway_failovers_refused_total{{{S}}}{RATE}))", "refused"),
                unit="reqps",
            ),
            graph(
                "Admission: refused at arrival, and the forecast wait per worker",
                "Calls refused because they would wait over grpc.max_queue_seconds (queue) or "
                "finish after their deadline (deadline); and what a call sent to each worker "
                "now is predicted to wait (calls held x its seconds per call).",
                q(
                    f"sum by (reason) (rate(gateway_admission_refusals_total{{{S}}}{RATE}))",
                    "refused: {{reason}}",
                ),
                q(
                    f'gateway_worker_forecast_wait_seconds{{{S},worker=~"$worker"}}',
                    "{{worker}} wait (s)",
                ),
            ),
            graph(
                "Tenants: calls by outcome, and calls held",
                "Per tenant (tenancy:, issue 52): calls admitted, refused at a full worker "
                "(refused_share: its share was taken; refused_band: higher priorities' "
                "places; refused_deadline) or over its quota (over_rate, over_concurrency); "
                "and the calls each tenant holds now. Tenants past "
                "tenancy.max_tenant_series are _other_.",
                q(
                    f"sum by (tenant, outcome) (rate(gateway_tenant_calls_total{{{S}}}{RATE}))",
                    "{{tenant}} {{outcome}}",
                ),
                q(f"sum by (tenant) (gateway_tenant_inflight_calls{{{S}}})", "{{tenant}} held"),
            ),
            graph(
                "Worker call latency p99, per worker",
                "The gateway's calls to each worker: a slow GPU stands out here.",
                q(
                    quantile(
                        "0.99",
                        "gateway_worker_latency_seconds",
                        "worker",
                        f'{INFER},worker=~"$worker"',
                    ),
                    "{{worker}}",
                ),
                unit="s",
            ),
            graph(
                "Worker-side latency p99, per model",
                "Inside the workers (queue and execution): the rest of the gateway's figure "
                "is routing and transport.",
                q(
                    quantile(
                        "0.99", "worker_request_latency_seconds", "model", f'{S},model=~"$model"'
                    ),
                    "{{model}}",
                ),
                unit="s",
            ),
        ],
    )
