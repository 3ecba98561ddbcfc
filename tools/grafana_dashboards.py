#!/usr/bin/env python3
"""Write rsgw's Grafana dashboards (`grafana/dashboards/*.json`) from the definitions here.

The JSON is committed, so Grafana provisioning and a reader of the repository need no
Python; this file is the shorter, reviewable source of it. `--check` fails (exit 1) when
the committed JSON differs from what this file makes, as `tools/regen_protos.py --check`
does for the protos; CI runs it. Every query selects `job` and `instance` through
template variables, and every panel reads the Prometheus datasource chosen in the
`datasource` variable. docs/operations.md says which panel answers which question.

    python tools/grafana_dashboards.py           # rewrite grafana/dashboards/
    python tools/grafana_dashboards.py --check   # are they current?
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "grafana" / "dashboards"
#: Grafana 10.x/11.x dashboard schema.
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: The selector every query starts from.
S = 'job=~"$job",instance=~"$instance"'
RATE = "[$__rate_interval]"
INFER = f'{S},rpc="ModelInfer"'


@dataclass
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass
class Panel:
    title: str
    description: str
    queries: list[Query]
    kind: str = "timeseries"
    unit: str = "short"
    width: int = 12
    height: int = 8
    overrides: dict[str, Any] = field(default_factory=dict)


def q(expr: str, legend: str = "", *, instant: bool = False) -> Query:
    return Query(expr, legend, instant)


def stat(title: str, description: str, expr: str, unit: str = "short") -> Panel:
    return Panel(title, description, [q(expr)], "stat", unit, width=6, height=4)


def table(title: str, description: str, expr: str) -> Panel:
    return Panel(title, description, [q(expr, instant=True)], "table", width=24, height=9)


def variable(name: str, label: str, query: str, *, include_all: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "includeAll": include_all,
        "multi": include_all,
        "allValue": ".*",
        "current": {},
        "sort": 1,
        "hide": 0,
    }


TEMPLATING = [
    {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
    },
    variable("job", "Job", "label_values(gateway_build_info, job)"),
    variable("instance", "Gateway", 'label_values(gateway_build_info{job=~"$job"}, instance)'),
    variable("model", "Model", f"label_values(gateway_model_ready_replicas{{{S}}}, model)"),
    variable("worker", "Worker", f"label_values(gateway_worker_ready{{{S}}}, worker)"),
]


def render(uid: str, title: str, description: str, panels: list[Panel]) -> dict[str, Any]:
    """A dashboard's JSON model: panels laid out left to right, top to bottom."""
    out: list[dict[str, Any]] = []
    x = y = row_height = 0
    for number, panel in enumerate(panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        targets = []
        for ref, query in zip("ABCDEFGH", panel.queries, strict=False):
            target: dict[str, Any] = {
                "refId": ref,
                "datasource": DATASOURCE,
                "expr": query.expr,
                "legendFormat": query.legend or "__auto",
                "range": not query.instant,
                "instant": query.instant,
            }
            if panel.kind == "table":
                target["format"] = "table"
            targets.append(target)
        item: dict[str, Any] = {
            "id": number,
            "type": panel.kind,
            "title": panel.title,
            "description": panel.description,
            "datasource": DATASOURCE,
            "gridPos": {"x": x, "y": y, "w": panel.width, "h": panel.height},
            "targets": targets,
            "fieldConfig": {"defaults": {"unit": panel.unit, **panel.overrides}, "overrides": []},
            "options": {},
        }
        if panel.kind == "table":
            item["transformations"] = [
                {"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True}}}
            ]
        out.append(item)
        x += panel.width
        row_height = max(row_height, panel.height)
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["rsgw"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "utc",
        "templating": {"list": TEMPLATING},
        "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": ["rsgw"], "title": "rsgw", "asDropdown": True}],
        "panels": out,
    }


def per_worker_compute() -> str:
    return f"sum by (worker) (rate(worker_compute_seconds_total{{{S}}}{RATE}))"


PLACEMENT = table(
    "Placement: weight of each model on each worker",
    "lpt_packing's placement in force (1/k for a model on k workers), one row per replica.",
    f'gateway_placement_weight{{{S},model=~"$model"}} > 0',
)


def fleet_overview() -> dict[str, Any]:
    return render(
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
            Panel(
                "Worker readiness",
                "1 while the worker is ready and routable; 0 when a probe failed or it was "
                "ejected for not answering.",
                [q(f'gateway_worker_ready{{{S},worker=~"$worker"}}', "{{worker}}")],
                overrides={"min": 0, "max": 1},
            ),
            Panel(
                "Per-worker load (what the router compares)",
                "In-flight work per worker in the unit of the basis label (least_outstanding "
                "and lpt_packing only).",
                [
                    q(
                        f'gateway_worker_inflight_work{{{S},worker=~"$worker"}}',
                        "{{worker}} ({{basis}})",
                    )
                ],
            ),
            Panel(
                "Calls in flight and the admission cap",
                "Calls the gateway holds against its cap; at the cap, calls queue or are shed.",
                [
                    q(f"sum(gateway_inflight_requests{{{S}}})", "in flight"),
                    q(f"max(gateway_max_concurrent_requests{{{S}}})", "cap"),
                ],
            ),
            Panel(
                "Device memory: weights on each GPU",
                "Weight bytes on the device, and the on-demand budget where a worker has one.",
                [
                    q(f'worker_resident_weight_bytes{{{S},worker=~"$worker"}}', "{{worker}}"),
                    q(
                        f'worker_weight_cache_max_bytes{{{S},worker=~"$worker"}}',
                        "{{worker}} budget",
                    ),
                ],
                unit="bytes",
            ),
            Panel(
                "Worker metrics reachable",
                "1 when the gateway's last scrape of the worker's /metrics answered in time.",
                [q(f'gateway_worker_metrics_up{{{S},worker=~"$worker"}}', "{{worker}}")],
            ),
            Panel(
                "Ejections",
                "Workers taken out of routing for not answering (calls stalled and a PING "
                "unanswered).",
                [
                    q(
                        f"sum by (worker) (increase(gateway_worker_ejections_total{{{S},"
                        f'worker=~"$worker"}}{RATE}))',
                        "{{worker}}",
                    )
                ],
            ),
        ],
    )


def scheduling_placement() -> dict[str, Any]:
    load = f'gateway_worker_inflight_work{{{S},worker=~"$worker"}}'
    return render(
        "rsgw-scheduling",
        "rsgw / Scheduling & Placement",
        "What the scheduler intends: per-worker load, its spread, the placement and repacks.",
        [
            stat(
                "Work basis in force",
                "The unit of per-worker load the router compares (lpt_packing can change it "
                "at runtime).",
                f"count by (basis) (gateway_worker_inflight_work{{{S}}})",
            ),
            stat(
                "Load spread (max - min)",
                "Difference between the most and least loaded worker: what fill_least shrinks.",
                f"max(gateway_worker_inflight_work{{{S}}}) - "
                f"min(gateway_worker_inflight_work{{{S}}})",
            ),
            stat(
                "Repacks in the last hour",
                "lpt_packing repacks, any trigger.",
                f"sum(increase(gateway_repacks_total{{{S}}}[1h]))",
            ),
            stat(
                "Repack failures in the last hour",
                "Ticks that raised (placement kept) and CompactMemory calls that failed.",
                f"sum(increase(gateway_repack_failures_total{{{S}}}[1h]))",
            ),
            Panel("Per-worker load", "In-flight work per worker.", [q(load, "{{worker}}")]),
            Panel(
                "Load spread over time",
                "max - min of per-worker load.",
                [
                    q(
                        f"max(gateway_worker_inflight_work{{{S}}}) - "
                        f"min(gateway_worker_inflight_work{{{S}}})",
                        "spread",
                    )
                ],
            ),
            PLACEMENT,
            Panel(
                "Replicas per model",
                "Workers in each model's placement (lpt_packing).",
                [q(f'gateway_model_replicas{{{S},model=~"$model"}}', "{{model}}")],
            ),
            Panel(
                "Ready replicas per model",
                "Ready, routable workers serving each model; 0 means its calls fail.",
                [q(f'gateway_model_ready_replicas{{{S},model=~"$model"}}', "{{model}}")],
            ),
            Panel(
                "Model demand (GPU-seconds per second)",
                "Each model's estimated demand at the last repack.",
                [q(f'gateway_model_utilization{{{S},model=~"$model"}}', "{{model}}")],
            ),
            Panel(
                "Calls routed per replica",
                "Whether every replica of a model is actually used.",
                [
                    q(
                        f"sum by (model, worker) (rate(gateway_replica_routed_total"
                        f'{{{S},model=~"$model"}}{RATE}))',
                        "{{model}} on {{worker}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Outstanding items per replica",
                "In-flight items (summed batch rows) per replica.",
                [
                    q(
                        f'gateway_replica_outstanding{{{S},model=~"$model"}}',
                        "{{model}} on {{worker}}",
                    )
                ],
            ),
            Panel(
                "Fill quantum per model",
                "Items a run spends on one replica before the next opens.",
                [q(f'gateway_model_fill_quantum{{{S},model=~"$model"}}', "{{model}}")],
            ),
            Panel(
                "Repacks by trigger",
                "startup, compute (traffic-driven) and operator repacks.",
                [
                    q(
                        f"sum by (trigger) (increase(gateway_repacks_total{{{S}}}{RATE}))",
                        "{{trigger}}",
                    )
                ],
            ),
        ],
    )


def gpu_work_balance() -> dict[str, Any]:
    compute = per_worker_compute()
    planned = (
        f"sum by (worker) (gateway_placement_weight{{{S}}} * on (job, instance, model) "
        f"group_left gateway_model_utilization{{{S}}})"
    )
    return render(
        "rsgw-balance",
        "rsgw / GPU Work Balance",
        "Did routing produce even work? Device-seconds each GPU really spent, against the plan.",
        [
            stat(
                "Work spread across GPUs",
                "(max - min) / mean of the device-seconds per second each GPU spent; 0% is even.",
                f"(max({compute}) - min({compute})) / clamp_min(avg({compute}), 1e-9)",
                "percentunit",
            ),
            stat(
                "Fleet device utilisation",
                "Device-seconds per second summed over GPUs, over the GPUs.",
                f"sum({compute}) / clamp_min(count({compute}), 1)",
                "percentunit",
            ),
            stat(
                "Rows per dispatch (fleet)",
                "Batch depth: rows served per dispatch, whole fleet.",
                f"sum(rate(worker_rows_served_total{{{S}}}{RATE})) / "
                f"clamp_min(sum(rate(worker_dispatch_total{{{S}}}{RATE})), 1e-9)",
            ),
            stat(
                "Weight loads per minute",
                "Weights loaded onto devices (thrashing when high).",
                f"sum(rate(worker_weight_loads_total{{{S}}}[5m])) * 60 or vector(0)",
            ),
            Panel(
                "Device-seconds per second, per GPU",
                "rate(worker_compute_seconds_total): the work each GPU really did.",
                [q(compute, "{{worker}}")],
                unit="percentunit",
            ),
            Panel(
                "Planned vs actual work, per GPU",
                "Planned: placement weight x model demand summed per worker (lpt_packing). "
                "Actual: device-seconds per second. A skewed plan needs a repack or more "
                "replicas; an even plan with uneven actual work is routing not following it.",
                [q(planned, "{{worker}} planned"), q(compute, "{{worker}} actual")],
                unit="percentunit",
            ),
            Panel(
                "Work per model on each GPU",
                "Device-seconds per second by model and worker.",
                [
                    q(
                        f"sum by (worker, model) (rate(worker_compute_seconds_total"
                        f'{{{S},model=~"$model"}}{RATE}))',
                        "{{model}} on {{worker}}",
                    )
                ],
                unit="percentunit",
            ),
            Panel(
                "Rows per dispatch, per GPU",
                "Batch depth on each GPU.",
                [
                    q(
                        f"sum by (worker) (rate(worker_rows_served_total{{{S}}}{RATE})) / "
                        f"sum by (worker) (rate(worker_dispatch_total{{{S}}}{RATE}))",
                        "{{worker}}",
                    )
                ],
            ),
            PLACEMENT,
        ],
    )


def latency_errors() -> dict[str, Any]:
    def quantile(level: str, metric: str, by: str, selector: str) -> str:
        return (
            f"histogram_quantile({level}, sum by (le, {by}) "
            f"(rate({metric}_bucket{{{selector}}}{RATE})))"
        )

    model_sel = f'{INFER},model=~"$model"'
    return render(
        "rsgw-latency",
        "rsgw / Latency & Errors",
        "How fast and how well are calls answered, per model and status?",
        [
            Panel(
                "Latency p50 and p99 by model (gateway)",
                "From gateway_request_latency_seconds: what a client sees, less the network.",
                [
                    q(
                        quantile("0.99", "gateway_request_latency_seconds", "model", model_sel),
                        "p99 {{model}}",
                    ),
                    q(
                        quantile("0.5", "gateway_request_latency_seconds", "model", model_sel),
                        "p50 {{model}}",
                    ),
                ],
                unit="s",
            ),
            Panel(
                "Calls by model and status",
                "ModelInfer calls per second by model and gRPC status.",
                [
                    q(
                        f"sum by (model, status) "
                        f"(rate(gateway_requests_total{{{model_sel}}}{RATE}))",
                        "{{model}} {{status}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Errors by status",
                "Calls of any method that did not end OK.",
                [
                    q(
                        f'sum by (status) (rate(gateway_requests_total{{{S},status!="OK"}}{RATE}))'
                        " or vector(0)",
                        "{{status}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Shed and failed over",
                "Calls shed at the admission cap; calls sent on to another replica, and "
                "failovers refused because the retry budget was spent.",
                [
                    q(f"sum(rate(gateway_requests_shed_total{{{S}}}{RATE}))", "shed"),
                    q(f"sum(rate(gateway_failovers_total{{{S}}}{RATE}))", "failed over"),
                    q(f"sum(rate(gateway_failovers_refused_total{{{S}}}{RATE}))", "refused"),
                ],
                unit="reqps",
            ),
            Panel(
                "Worker call latency p99, per worker",
                "The gateway's calls to each worker: a slow GPU stands out here.",
                [
                    q(
                        quantile(
                            "0.99",
                            "gateway_worker_latency_seconds",
                            "worker",
                            f'{INFER},worker=~"$worker"',
                        ),
                        "{{worker}}",
                    )
                ],
                unit="s",
            ),
            Panel(
                "Worker-side latency p99, per model",
                "Inside the workers (queue and execution): the rest of the gateway's figure "
                "is routing and transport.",
                [
                    q(
                        quantile(
                            "0.99",
                            "worker_request_latency_seconds",
                            "model",
                            f'{S},model=~"$model"',
                        ),
                        "{{model}}",
                    )
                ],
                unit="s",
            ),
        ],
    )


def worker_drilldown() -> dict[str, Any]:
    w = f'{S},worker=~"$worker"'
    return render(
        "rsgw-worker",
        "rsgw / Worker",
        "One worker (GPU) in detail: queues, batches, weights and memory, admission, process.",
        [
            Panel(
                "Queue depth by model",
                "Requests waiting for the device.",
                [q(f"worker_queue_depth{{{w}}}", "{{worker}} {{model}}")],
            ),
            Panel(
                "Queue wait p99 by model",
                "Recent queue wait before dispatch (the worker's own window).",
                [q(f'worker_queue_wait_seconds{{{w},quantile="0.99"}}', "{{worker}} {{model}}")],
                unit="s",
            ),
            Panel(
                "Batch size distribution",
                "Dispatches per second by batch size (upper bound of each bucket).",
                [
                    q(
                        f"sum by (le) (rate(worker_batch_size_bucket{{{w}}}{RATE}))",
                        "<= {{le}}",
                    )
                ],
                kind="bargauge",
            ),
            Panel(
                "Rows per dispatch by model",
                "Batch depth per model.",
                [
                    q(
                        f"sum by (worker, model) (rate(worker_rows_served_total{{{w}}}{RATE})) / "
                        f"sum by (worker, model) (rate(worker_dispatch_total{{{w}}}{RATE}))",
                        "{{worker}} {{model}}",
                    )
                ],
            ),
            Panel(
                "Weight loads and evictions",
                "Loads onto and evictions from the device per second (on-demand weights).",
                [
                    q(f"rate(worker_weight_loads_total{{{w}}}{RATE})", "{{worker}} loads"),
                    q(f"rate(worker_weight_evicts_total{{{w}}}{RATE})", "{{worker}} evictions"),
                ],
            ),
            Panel(
                "Device memory",
                "Weights on the device, the on-demand budget and what of it is used.",
                [
                    q(f"worker_resident_weight_bytes{{{w}}}", "{{worker}} resident"),
                    q(f"worker_weight_cache_resident_bytes{{{w}}}", "{{worker}} on demand"),
                    q(f"worker_weight_cache_max_bytes{{{w}}}", "{{worker}} budget"),
                ],
                unit="bytes",
            ),
            Panel(
                "Admission",
                "Calls the worker holds against its own cap, and calls it shed.",
                [
                    q(f"worker_inflight_requests{{{w}}}", "{{worker}} in flight"),
                    q(f"worker_max_concurrent_requests{{{w}}}", "{{worker}} cap"),
                    q(f"rate(worker_requests_shed_total{{{w}}}{RATE})", "{{worker}} shed/s"),
                ],
            ),
            Panel(
                "Worker process",
                "CPU seconds per second and resident memory of the worker process.",
                [
                    q(f"rate(process_cpu_seconds_total{{{w}}}{RATE})", "{{worker}} CPU"),
                    q(f"process_resident_memory_bytes{{{w}}} / 2^30", "{{worker}} RSS GiB"),
                ],
            ),
        ],
    )


DASHBOARDS = {
    "fleet_overview.json": fleet_overview,
    "scheduling_placement.json": scheduling_placement,
    "gpu_work_balance.json": gpu_work_balance,
    "latency_errors.json": latency_errors,
    "worker.json": worker_drilldown,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON is stale")
    args = parser.parse_args()
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        text = json.dumps(build(), indent=2, sort_keys=True) + "\n"
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(
            f"stale dashboards: {', '.join(stale)}; run python tools/grafana_dashboards.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
