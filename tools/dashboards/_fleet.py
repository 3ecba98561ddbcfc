"""rsgw / Fleet Overview: is the fleet up and serving?

The first dashboard an operator opens: readiness and routable models, traffic and the
share that failed, then per worker the load the router compares, the admission cap,
device memory, whether the gateway can read the worker's metrics, and ejections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._frame import INFER, RATE, S, board, graph, q, stat

if TYPE_CHECKING:
    from grafana_foundation_sdk.models.dashboard import Dashboard


def fleet_overview() -> Dashboard:
    return board(
        "rsgw-fleet",
        "rsgw / Fleet Overview",
        "Is the fleet up and serving? Readiness, traffic, errors, load and memory per worker.",
        [
            stat(
                "Workers ready",
                "Workers whose last ServerReady probe said ready (ejected ones count 0).",
                f"sum(gateway_worker_ready{{{S}}})",
            ),
            stat(
                "Models routable",
                "Models in the routing table.",
                f"max(gateway_routing_table_size{{{S}}})",
            ),
            stat(
                "Inference calls per second",
                "ModelInfer calls answered by the gateway, any status.",
                f"sum(rate(gateway_requests_total{{{INFER}}}{RATE}))",
                "reqps",
            ),
            stat(
                "Failed calls",
                "Share of ModelInfer calls that did not end OK.",
                f'(sum(rate(gateway_requests_total{{{INFER},status!="OK"}}{RATE})) or vector(0))'
                f" / clamp_min(sum(rate(gateway_requests_total{{{INFER}}}{RATE})), 1e-9)",
                "percentunit",
            ),
            graph(
                "Worker readiness",
                "1 while the worker is ready and routable; 0 when a probe failed or it was "
                "ejected for not answering.",
                q(f'gateway_worker_ready{{{S},worker=~"$worker"}}', "{{worker}}"),
            )
            .min(0)
            .max(1),
            graph(
                "Per-worker load (what the router compares)",
                "In-flight work per worker in the unit of the basis label (least_outstanding "
                "and lpt_packing only).",
                q(
                    f'gateway_worker_inflight_work{{{S},worker=~"$worker"}}',
                    "{{worker}} ({{basis}})",
                ),
            ),
            graph(
                "Calls in flight and the admission cap",
                "Calls the gateway holds against its cap; at the cap, calls queue or are shed.",
                q(f"sum(gateway_inflight_requests{{{S}}})", "in flight"),
                q(f"max(gateway_max_concurrent_requests{{{S}}})", "cap"),
            ),
            graph(
                "Coordinated gateways: placers and epoch",
                "With coordination.etcd_endpoints: gateways placing (should be exactly 1), "
                "gateways that cannot reach etcd, and the placement's epoch (the same on "
                "every gateway once it has followed the last publication). 0 without "
                "coordination.",
                q(f'sum(gateway_coordination_state{{{S},state="placer"}}) or vector(0)', "placers"),
                q(
                    f'sum(gateway_coordination_state{{{S},state="disconnected"}}) or vector(0)',
                    "disconnected",
                ),
                q(f"max(gateway_coordination_epoch{{{S}}}) or vector(0)", "epoch"),
            ),
            graph(
                "Unfinished request bytes and the upload budget",
                "Bytes of request messages still arriving: granted (their declared sizes) and "
                "waiting for a grant (held back by flow control), against "
                "connections.max_buffered_bytes_total. Waiting that stays up means large "
                "uploads are being slowed; refusals are in Latency & Errors' statuses.",
                q(f"sum by (state) (gateway_unfinished_request_bytes{{{S}}})", "{{state}}"),
                q(f"max(gateway_unfinished_request_bytes_limit{{{S}}})", "budget"),
                unit="bytes",
            ),
            graph(
                "Device memory: weights on each GPU",
                "Weight bytes on the device, and the on-demand budget where a worker has one.",
                q(f'worker_resident_weight_bytes{{{S},worker=~"$worker"}}', "{{worker}}"),
                q(f'worker_weight_cache_max_bytes{{{S},worker=~"$worker"}}', "{{worker}} budget"),
                unit="bytes",
            ),
            graph(
                "Worker metrics reachable",
                "1 when the gateway's last scrape of the worker's /metrics answered in time.",
                q(f'gateway_worker_metrics_up{{{S},worker=~"$worker"}}', "{{worker}}"),
            ),
            graph(
                "Ejections",
                "Workers taken out of routing for not answering (calls stalled and a PING "
                "unanswered).",
                q(
                    f"sum by (worker) (increase(gateway_worker_ejections_total{{{S},"
                    f'worker=~"$worker"}}{RATE}))',
                    "{{worker}}",
                ),
            ),
        ],
    )
