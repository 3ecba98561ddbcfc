"""rsgw / GPU Work Balance: did routing produce even work?

It leads with the spread of the device-seconds each GPU really spent, then sets the work
each GPU did against the work the placement planned for it, per model and per dispatch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._frame import RATE, S, board, graph, q, stat
from ._scheduling import placement

if TYPE_CHECKING:
    from grafana_foundation_sdk.models.dashboard import Dashboard

#: Device-seconds per second each GPU spent: the work it really did.
COMPUTE = f"sum by (worker) (rate(worker_compute_seconds_total{{{S}}}{RATE}))"
#: Placement weight x model demand, summed per worker: the work lpt_packing planned.
PLANNED = (
    f"sum by (worker) (gateway_placement_weight{{{S}}} * on (job, instance, model) "
    f"group_left gateway_model_utilization{{{S}}})"
)


def gpu_work_balance() -> Dashboard:
    return board(
        "rsgw-balance",
        "rsgw / GPU Work Balance",
        "Did routing produce even work? Device-seconds each GPU really spent, against the plan.",
        [
            stat(
                "Work spread across GPUs",
                "(max - min) / mean of the device-seconds per second each GPU spent; 0% is even.",
                f"(max({COMPUTE}) - min({COMPUTE})) / clamp_min(avg({COMPUTE}), 1e-9)",
                "percentunit",
            ),
            stat(
                "Fleet device utilisation",
                "Device-seconds per second summed over GPUs, over the GPUs.",
                f"sum({COMPUTE}) / clamp_min(count({COMPUTE}), 1)",
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
            graph(
                "Device-seconds per second, per GPU",
                "rate(worker_compute_seconds_total): the work each GPU really did.",
                q(COMPUTE, "{{worker}}"),
                unit="percentunit",
            ),
            graph(
                "Planned vs actual work, per GPU",
                "Planned: placement weight x model demand summed per worker (lpt_packing). "
                "Actual: device-seconds per second. A skewed plan needs a repack or more "
                "replicas; an even plan with uneven actual work is routing not following it.",
                q(PLANNED, "{{worker}} planned"),
                q(COMPUTE, "{{worker}} actual"),
                unit="percentunit",
            ),
            graph(
                "Work per model on each GPU",
                "Device-seconds per second by model and worker.",
                q(
                    f"sum by (worker, model) (rate(worker_compute_seconds_total"
                    f'{{{S},model=~"$model"}}{RATE}))',
                    "{{model}} on {{worker}}",
                ),
                unit="percentunit",
            ),
            graph(
                "Rows per dispatch, per GPU",
                "Batch depth on each GPU.",
                q(
                    f"sum by (worker) (rate(worker_rows_served_total{{{S}}}{RATE})) / "
                    f"sum by (worker) (rate(worker_dispatch_total{{{S}}}{RATE}))",
                    "{{worker}}",
                ),
            ),
            placement(),
        ],
    )
