"""lpt_packing's log lines: its settings at start, and what each repack did.

Split from the packing shell (`rsgw.gateway.placement._packing`) so the shell reads as
what it does; the words are the operator's interface (docs/troubleshooting.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rsgw.base._values import human_bytes
from rsgw.scheduling.knobs._knobs import FillMode
from rsgw.scheduling.knobs._policy import PARKING_WARNING
from rsgw.scheduling.knobs._settings import SchedulingConfig
from rsgw.scheduling.placement._reports import (
    DRIFT_WARNING,
    OVERSUBSCRIPTION_WARNING,
    RepackReport,
)

logger = logging.getLogger("rsgw.gateway.placement._packing")


def log_settings(knobs: SchedulingConfig, workers: int) -> None:
    """The `lpt_packing: scheduling` line at start, and the parking warnings."""
    logger.info(
        "lpt_packing: scheduling",
        extra={
            "workers": workers,
            "rebalance_compute_seconds": knobs.rebalance_compute_seconds,
            "first_rebalance_compute_seconds": knobs.first_rebalance_compute_seconds,
            "hysteresis": knobs.hysteresis,
            "ema_halflife_compute_seconds": knobs.resolved_ema_halflife,
            "default_replicas": str(knobs.default_replicas),
            "routing_policy": str(knobs.routing_policy),
            "routing_fill_mode": str(knobs.routing_fill_mode),
            "routing_fill_factor": knobs.routing_fill_factor,
            "work_basis": str(knobs.work_basis),
            "compaction_mode": str(knobs.compaction_mode),
            "compaction_interval": knobs.compaction_interval,
            "forbid_memory_oversubscription": knobs.forbid_memory_oversubscription,
            "max_worker_share": knobs.max_worker_share,
        },
    )
    if knobs.routing_fill_mode is FillMode.INFLIGHT:
        logger.warning(PARKING_WARNING, extra={"scope": "fleet default"})
    parked = sorted(m for m, o in knobs.models.items() if o.fill_mode is FillMode.INFLIGHT)
    if parked:
        logger.warning(PARKING_WARNING, extra={"scope": "per-model override", "models": parked})


def log_repack(report: RepackReport, label: Callable[[str], str]) -> None:
    """The `lpt_packing: repack` line and its warnings."""
    log = report.log
    logger.info(
        "lpt_packing: repack",
        extra={
            "trigger": report.trigger,
            "models": log.models,
            "moved": log.moved,
            "held_by_hysteresis": log.held_by_hysteresis,
            "max_improvement": log.max_improvement,
            "hysteresis": log.hysteresis,
            "compute_seconds": log.compute_seconds,
            "wall_seconds": log.wall_seconds,
        },
    )
    for drift in report.drift_warnings:
        logger.warning(
            DRIFT_WARNING,
            extra={
                "model": drift.model,
                "replicas": [label(u) for u in drift.replicas],
                "ready": drift.ready,
            },
        )
    for over in report.oversubscribed:
        logger.warning(
            OVERSUBSCRIPTION_WARNING,
            extra={
                "worker": label(over.worker),
                "assigned": over.assigned,
                "budget": over.budget,
                "assigned_human": human_bytes(over.assigned),
                "budget_human": human_bytes(over.budget),
            },
        )
    if report.over_budget_models:
        logger.warning(
            "lpt_packing: no worker has room for these models' weights; placed them "
            "anyway (forbid_memory_oversubscription could not be honoured)",
            extra={"models": list(report.over_budget_models)},
        )
    if report.cold:
        logger.info(
            "lpt_packing: models left cold (the budgets hold the others); each is loaded "
            "when a call asks for it",
            extra={"models": list(report.cold)},
        )
