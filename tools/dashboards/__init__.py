"""rsgw's Grafana dashboards, written with Grafana's own typed builders (grafana-foundation-sdk).

One module a dashboard, each a function that returns the dashboard's model; `_frame`
holds what they share. `tools/grafana_dashboards.py` turns them into the committed JSON
under `grafana/dashboards/`, and docs/operations.md says which panel answers which question.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ._balance import gpu_work_balance
from ._fleet import fleet_overview
from ._latency import latency_errors
from ._scheduling import scheduling_placement
from ._worker import worker_drilldown

if TYPE_CHECKING:
    from grafana_foundation_sdk.models.dashboard import Dashboard

#: Each JSON file under grafana/dashboards/ and the function that makes its dashboard.
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "fleet_overview.json": fleet_overview,
    "scheduling_placement.json": scheduling_placement,
    "gpu_work_balance.json": gpu_work_balance,
    "latency_errors.json": latency_errors,
    "worker.json": worker_drilldown,
}
