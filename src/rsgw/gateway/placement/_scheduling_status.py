"""What GatewayControlService answers, built from lpt_packing's published snapshots.

The status and the wire forms of the knobs (docs/original.md §2.8): everything here reads
immutable snapshots (knobs, assignment, reports, plans) and the live counters once, and
builds protobuf messages; nothing awaits, so a status is one consistent picture.
"""

from __future__ import annotations

import time

import trio

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.gateway.placement._memory_ledger import MemoryLedger
from rsgw.gateway.placement._packing import Packing
from rsgw.scheduling.knobs._knobs import ALL, FillMode, SchedulingMode
from rsgw.scheduling.knobs._policy import PARKING_WARNING, memory_projection, replicas_to_wire
from rsgw.scheduling.knobs._settings import SchedulingConfig

NO_REPACK_YET = "no repack has run yet; per-model demand figures are unset"


def policy_values(policy: cpb.SchedulingPolicy) -> dict[str, object]:
    """SchedulingPolicy's fields in config form (default_replicas -1 is 'all')."""
    values: dict[str, object] = {
        field.name: getattr(policy, field.name) for field in policy.DESCRIPTOR.fields
    }
    if values["default_replicas"] == -1:
        values["default_replicas"] = ALL
    return values


def policy_message(knobs: SchedulingConfig, generation: int) -> cpb.SchedulingPolicy:
    return cpb.SchedulingPolicy(
        rebalance_compute_seconds=knobs.rebalance_compute_seconds,
        first_rebalance_compute_seconds=knobs.first_rebalance_compute_seconds,
        hysteresis=knobs.hysteresis,
        ema_halflife_compute_seconds=knobs.resolved_ema_halflife,
        default_replicas=replicas_to_wire(knobs.default_replicas),
        routing_policy=str(knobs.routing_policy),
        routing_fill_factor=knobs.routing_fill_factor,
        routing_fill_mode=str(knobs.routing_fill_mode),
        compaction_mode=str(knobs.compaction_mode),
        compaction_interval=knobs.compaction_interval,
        forbid_memory_oversubscription=knobs.forbid_memory_oversubscription,
        generation=generation,
        work_basis=str(knobs.work_basis),
    )


def ready_set(packing: Packing) -> frozenset[str]:
    """The last tick's ready workers; before any tick, those the last repack polled."""
    tick = packing.packer.last_tick
    if tick is not None:
        return frozenset(tick.ready)
    report = packing.packer.last_report
    return frozenset(report.polled) if report is not None else frozenset()


def ready_count(packing: Packing) -> int:
    return len(ready_set(packing))


def projection(packing: Packing, model: str, effective: int) -> list[str]:
    """Memory warnings for placing `model` on `effective` workers (an estimate)."""
    report = packing.packer.last_report
    if report is None:
        return []
    placed: dict[str, int] = {}
    for other, placement in packing.packer.assignment.items():
        if other != model:
            for url in placement.urls:
                placed[url] = placed.get(url, 0) + report.mem.get(other, 0)
    return memory_projection(model, effective, report.mem.get(model, 0), placed, report.mem_cap)


def repack_status(packing: Packing) -> cpb.RepackStatus:
    packer = packing.packer
    status = cpb.RepackStatus(
        last_trigger="none",
        repacks_since_compaction=packer.repacks_since_compaction,
        operator_repacks_requested=packer.repack_requested,
        operator_repacks_completed=packer.repack_completed,
        first_tick_repack_done=packer.did_first_tick_repack,
    )
    report = packer.last_report
    if report is not None:
        status.last_repack_unix_seconds = unix_seconds(report.now)
        status.last_repack_wall_elapsed_seconds = report.wall_seconds
        status.last_repack_compute_seconds = report.compute_seconds
        status.last_trigger = report.trigger
        status.last_models_placed = report.models
        status.last_models_moved = report.moved
        status.repack_count = report.count
    tick = packer.last_tick
    if tick is not None:
        status.compute_accumulated_seconds = tick.compute_accum
        status.active_threshold_seconds = tick.threshold
        status.last_tick_unix_seconds = unix_seconds(tick.now)
    else:
        knobs = packing.knobs
        first = knobs.first_rebalance_compute_seconds
        status.active_threshold_seconds = first if first > 0 else knobs.rebalance_compute_seconds
    return status


def status_of(packing: Packing) -> cpb.GetSchedulingStatusResponse:
    """The full lpt_packing status (docs/original.md §2.8 GetSchedulingStatus)."""
    knobs = packing.knobs
    packer = packing.packer
    scheduler = packing.scheduler
    assignment = packer.assignment
    report = packer.last_report
    outstanding = scheduler.router.outstanding()
    routed = scheduler.router.routed()
    mem = report.mem if report is not None else {}
    models = []
    ledger = packing.placer.synced()
    for name in sorted({*assignment, *knobs.models, *scheduler.max_batch, *ledger.handed}):
        placement = assignment.get(name)
        override = knobs.models.get(name)
        plan = scheduler.plans.get(name)
        models.append(
            cpb.ModelSchedulingStatus(
                name=name,
                configured_replicas=replicas_to_wire(
                    override.replicas if override is not None else None
                ),
                effective_replicas=len(placement) if placement is not None else 0,
                replicas=[
                    cpb.ReplicaPlacement(
                        worker=url,
                        weight=weight,
                        outstanding=outstanding.get((name, url), 0),
                        routed_total=routed.get((name, url), 0),
                    )
                    for url, weight in (placement or ())
                ],
                utilization=report.utilization.get(name, 0.0) if report is not None else 0.0,
                arrival_rate=report.rate.get(name, 0.0) if report is not None else 0.0,
                cost_seconds=report.cost.get(name, 0.0) if report is not None else 0.0,
                max_batch=scheduler.max_batch.get(name, 0),
                fill_mode=str(plan.mode) if plan is not None else "unknown",
                fill_quantum=plan.quantum if plan is not None else 0,
                weight_nbytes=round(mem.get(name, 0)),
                placed=placement is not None,
                drifted=report is not None and name in report.drifted,
                residency=_residency(ledger, name),
            )
        )
    ready = ready_set(packing)
    budgets = report.mem_cap if report is not None else {}
    hosted: dict[str, list[str]] = {}
    for name, placement in assignment.items():
        for url in placement.urls:
            hosted.setdefault(url, []).append(name)
    loads = scheduler.loads()
    workers = []
    for url in sorted({*budgets, *hosted, *ready, *ledger.workers()}):
        assigned = sum(mem.get(m, 0) for m in hosted.get(url, ()))
        budget = budgets.get(url, 0)
        workers.append(
            cpb.WorkerSchedulingStatus(
                worker=url,
                ready=url in ready,
                models_placed=len(hosted.get(url, ())),
                inflight_compute=loads.get(url, 0.0),
                assigned_weight_bytes=assigned,
                weight_budget_bytes=budget,
                oversubscribed=budget > 0 and assigned > budget,
                resident_weight_bytes=ledger.used(url),
            )
        )
    warnings = []
    if knobs.routing_fill_mode is FillMode.INFLIGHT:
        warnings.append(PARKING_WARNING)
    for name, override in knobs.models.items():
        if override.fill_mode is FillMode.INFLIGHT:
            warnings.append(f"model '{name}': {PARKING_WARNING}")
    if report is None:
        warnings.append(NO_REPACK_YET)
    return cpb.GetSchedulingStatusResponse(
        mode=str(SchedulingMode.LPT_PACKING),
        policy=policy_message(knobs, packing.generation),
        repack=repack_status(packing),
        models=models,
        workers=workers,
        warnings=sorted(warnings),
    )


def _residency(ledger: MemoryLedger, model: str) -> str:
    """ "resident", "loading" or "cold" for a handed model; "" for the others."""
    if model not in ledger.handed:
        return ""
    if ledger.resident(model):
        return "resident"
    return "loading" if ledger.load_under_way(model) is not None else "cold"


def unix_seconds(trio_time: float) -> float:
    """A Trio-clock time as Unix time, for the status fields that report one.

    The packer runs on the Trio clock (monotonic, and the one tests can drive);
    operators read wall-clock timestamps.
    """
    return time.time() - (trio.current_time() - trio_time)
