"""rsgw / Worker: one worker (GPU) in detail.

Read from the workers' own series (through the gateway's merged /metrics): queues and
queue wait, batch sizes and rows per dispatch, weight loads, evictions and device memory,
the worker's own admission cap, and the worker process's CPU and memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._frame import RATE, S, bars, board, graph, q

if TYPE_CHECKING:
    from grafana_foundation_sdk.models.dashboard import Dashboard

W = f'{S},worker=~"$worker"'


def worker_drilldown() -> Dashboard:
    return board(
        "rsgw-worker",
        "rsgw / Worker",
        "One worker (GPU) in detail: queues, batches, weights and memory, admission, process.",
        [
            graph(
                "Queue depth by model",
                "Requests waiting for the device.",
                q(f"worker_queue_depth{{{W}}}", "{{worker}} {{model}}"),
            ),
            graph(
                "Queue wait p99 by model",
                "Recent queue wait before dispatch (the worker's own window).",
                q(f'worker_queue_wait_seconds{{{W},quantile="0.99"}}', "{{worker}} {{model}}"),
                unit="s",
            ),
            bars(
                "Batch size distribution",
                "Dispatches per second by batch size (upper bound of each bucket).",
                q(f"sum by (le) (rate(worker_batch_size_bucket{{{W}}}{RATE}))", "<= {{le}}"),
            ),
            graph(
                "Rows per dispatch by model",
                "Batch depth per model.",
                q(
                    f"sum by (worker, model) (rate(worker_rows_served_total{{{W}}}{RATE})) / "
                    f"sum by (worker, model) (rate(worker_dispatch_total{{{W}}}{RATE}))",
                    "{{worker}} {{model}}",
                ),
            ),
            graph(
                "Weight loads and evictions",
                "Loads onto and evictions from the device per second (on-demand weights).",
                q(f"rate(worker_weight_loads_total{{{W}}}{RATE})", "{{worker}} loads"),
                q(f"rate(worker_weight_evicts_total{{{W}}}{RATE})", "{{worker}} evictions"),
            ),
            graph(
                "Device memory",
                "Weights on the device, the on-demand budget and what of it is used.",
                q(f"worker_resident_weight_bytes{{{W}}}", "{{worker}} resident"),
                q(f"worker_weight_cache_resident_bytes{{{W}}}", "{{worker}} on demand"),
                q(f"worker_weight_cache_max_bytes{{{W}}}", "{{worker}} budget"),
                unit="bytes",
            ),
            graph(
                "Admission",
                "Calls the worker holds against its own cap, and calls it shed.",
                q(f"worker_inflight_requests{{{W}}}", "{{worker}} in flight"),
                q(f"worker_max_concurrent_requests{{{W}}}", "{{worker}} cap"),
                q(f"rate(worker_requests_shed_total{{{W}}}{RATE})", "{{worker}} shed/s"),
            ),
            graph(
                "Worker process",
                "CPU seconds per second and resident memory of the worker process.",
                q(f"rate(process_cpu_seconds_total{{{W}}}{RATE})", "{{worker}} CPU"),
                q(f"process_resident_memory_bytes{{{W}}} / 2^30", "{{worker}} RSS GiB"),
            ),
        ],
    )
