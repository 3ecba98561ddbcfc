"""rsgw / Scheduling & Placement: what the scheduler intends.

Per-worker load and its spread (what the router compares and fill_least shrinks), the
placement lpt_packing keeps in force, each model's replicas and demand, how calls spread
over the replicas, and the repacks with their triggers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._frame import RATE, S, board, graph, q, stat, table

if TYPE_CHECKING:
    from grafana_foundation_sdk.builders.table import Panel
    from grafana_foundation_sdk.models.dashboard import Dashboard

#: max - min of the per-worker load.
SPREAD = f"max(gateway_worker_inflight_work{{{S}}}) - min(gateway_worker_inflight_work{{{S}}})"


def placement() -> Panel:
    """The placement table, which the GPU Work Balance dashboard shows as well."""
    return table(
        "Placement: weight of each model on each worker",
        "lpt_packing's placement in force (1/k for a model on k workers), one row per replica.",
        f'gateway_placement_weight{{{S},model=~"$model"}} > 0',
    )


def scheduling_placement() -> Dashboard:
    load = f'gateway_worker_inflight_work{{{S},worker=~"$worker"}}'
    return board(
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
                SPREAD,
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
            graph("Per-worker load", "In-flight work per worker.", q(load, "{{worker}}")),
            graph("Load spread over time", "max - min of per-worker load.", q(SPREAD, "spread")),
            placement(),
            graph(
                "Replicas per model",
                "Workers in each model's placement (lpt_packing).",
                q(f'gateway_model_replicas{{{S},model=~"$model"}}', "{{model}}"),
            ),
            graph(
                "Ready replicas per model",
                "Ready, routable workers serving each model; 0 means its calls fail.",
                q(f'gateway_model_ready_replicas{{{S},model=~"$model"}}', "{{model}}"),
            ),
            graph(
                "Model demand (GPU-seconds per second)",
                "Each model's estimated demand at the last repack.",
                q(f'gateway_model_utilization{{{S},model=~"$model"}}', "{{model}}"),
            ),
            graph(
                "Calls routed per replica",
                "Whether every replica of a model is actually used.",
                q(
                    f"sum by (model, worker) (rate(gateway_replica_routed_total"
                    f'{{{S},model=~"$model"}}{RATE}))',
                    "{{model}} on {{worker}}",
                ),
                unit="reqps",
            ),
            graph(
                "Outstanding items per replica",
                "In-flight items (summed batch rows) per replica.",
                q(f'gateway_replica_outstanding{{{S},model=~"$model"}}', "{{model}} on {{worker}}"),
            ),
            graph(
                "Fill quantum per model",
                "Items a run spends on one replica before the next opens.",
                q(f'gateway_model_fill_quantum{{{S},model=~"$model"}}', "{{model}}"),
            ),
            graph(
                "GPU memory: resident bytes vs budget",
                "Bytes of handed models each worker holds (loading and unloading included), "
                "against its budget (repository.worker_budget_bytes): resident never above "
                "budget (issue 49).",
                q(f'gateway_worker_resident_bytes{{{S},worker=~"$worker"}}', "{{worker}} resident"),
                q(f'gateway_worker_budget_bytes{{{S},worker=~"$worker"}}', "{{worker}} budget"),
                unit="bytes",
            ),
            graph(
                "Cold starts and their wait",
                "Calls that found their model loaded nowhere, by outcome, and the p99 of "
                "their wait for its load.",
                q(
                    f"sum by (outcome) (rate(gateway_cold_starts_total{{{S}}}{RATE}))",
                    "{{outcome}}",
                ),
                q(
                    f"histogram_quantile(0.99, sum by (le) "
                    f"(rate(gateway_cold_start_wait_seconds_bucket{{{S}}}{RATE})))",
                    "p99 wait (s)",
                ),
            ),
            graph(
                "Loads and unloads by reason",
                "Models loaded and unloaded by the gateway: demand (a cold call), eviction "
                "(room made for one), repack, operator, startup. Evictions every minute for "
                "long are thrash (alert RsgwResidencyThrash).",
                q(
                    f"sum by (action, reason) "
                    f"(increase(gateway_residency_changes_total{{{S}}}{RATE}))",
                    "{{action}} ({{reason}})",
                ),
            ),
            graph(
                "Repacks by trigger",
                "startup, compute (traffic-driven) and operator repacks.",
                q(
                    f"sum by (trigger) (increase(gateway_repacks_total{{{S}}}{RATE}))",
                    "{{trigger}}",
                ),
            ),
        ],
    )
