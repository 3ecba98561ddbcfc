"""What the simulated device counts per model: the figures every report is made from.

Pure. ModelControlStatus, /metrics and Triton's ModelStatistics all read these
counters; the device adds to them as batches run and the service as requests end.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: Queue-wait samples kept per model for the p50/p99 gauges.
WAIT_SAMPLES = 1024


@dataclass(slots=True)
class ModelCounters:
    """Cumulative per-model figures, as ModelControlStatus reports them."""

    dispatch_count: int = 0
    requests_served: int = 0
    rows_served: int = 0
    total_compute_seconds: float = 0.0
    queue_waits: deque[float] = field(default_factory=lambda: deque(maxlen=WAIT_SAMPLES))
    #: Requests dispatched so far (the count of `queue_seconds`' waits).
    queue_wait_count: int = 0
    #: For Triton's ModelStatistics: every request's queue wait and its batch's
    #: execution (both in scaled device seconds), and executions per batch size.
    queue_seconds: float = 0.0
    compute_request_seconds: float = 0.0
    batches: dict[int, tuple[int, float]] = field(default_factory=dict)
    #: Requests answered and failed (with their latency, wall seconds), and the
    #: Unix time in ms of the last one, as the service counts them.
    success: tuple[int, float] = (0, 0.0)
    fail: tuple[int, float] = (0, 0.0)
    last_inference_ms: int = 0
