"""`reactant_control.GatewayControlService`: retune a live fleet without a restart.

Served on the inference port next to the data plane (REFERENCE.md §2.8). Status works
in every mode; the three mutators need lpt_packing and answer FAILED_PRECONDITION
otherwise. Every change is validated with the gateway.yml validators
(`rsgw.scheduling._policy`), all-or-nothing, swapped in by reference, bumps the
generation, and lives in memory only: every mutator's answer says `persisted=false`,
and a restart reverts to gateway.yml.

Errors: a bad value is INVALID_ARGUMENT with the validator's message (the one
gateway.yml would print); a deliberate gRPC error passes through; anything else is
INTERNAL `gateway control call failed: ...`, logged with its traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from google.protobuf.message import Message

from rsgw._errors import RsgwError
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw._schema import SchedulingConfig
from rsgw.gateway._metrics import GatewayMetrics
from rsgw.gateway._packing import Packing
from rsgw.gateway._prober import Prober
from rsgw.grpc._server import ServerCall, UnaryHandler
from rsgw.grpc._status import GrpcError, StatusCode
from rsgw.grpc._typed import typed_unary
from rsgw.scheduling._knobs import ALL, FillMode, SchedulingMode
from rsgw.scheduling._policy import (
    NEXT_REPACK,
    PARKING_WARNING,
    effective_replicas,
    memory_projection,
    replicas_from_wire,
    replicas_to_wire,
    update_override,
    update_policy,
)

logger = logging.getLogger(__name__)

SERVICE = "/reactant_control.GatewayControlService/"
#: The longest a Repack call may wait for its repack.
MAX_REPACK_WAIT = 120.0
NO_REPACK_YET = "no repack has run yet; per-model demand figures are unset"

Req = TypeVar("Req", bound=Message)


class GatewayControl:
    """The GatewayControlService handlers, over the lpt_packing shell (if any)."""

    def __init__(
        self,
        mode: SchedulingMode,
        packing: Packing | None,
        prober: Prober,
        metrics: GatewayMetrics,
    ) -> None:
        self.mode = mode
        self._packing = packing
        self._prober = prober
        self._metrics = metrics

    def handlers(self) -> dict[str, UnaryHandler]:
        return {
            SERVICE + "GetSchedulingStatus": self._wrap(
                "GetSchedulingStatus", cpb.GetSchedulingStatusRequest, self.get_status
            ),
            SERVICE + "SetSchedulingPolicy": self._wrap(
                "SetSchedulingPolicy", cpb.SetSchedulingPolicyRequest, self.set_policy
            ),
            SERVICE + "SetModelPlacement": self._wrap(
                "SetModelPlacement", cpb.SetModelPlacementRequest, self.set_placement
            ),
            SERVICE + "Repack": self._wrap("Repack", cpb.RepackRequest, self.repack),
        }

    def _wrap(
        self, rpc: str, request_type: type[Req], method: Callable[[Req], Awaitable[Message]]
    ) -> UnaryHandler:
        async def handler(request: Req, call: ServerCall) -> Message:
            started = time.perf_counter()
            code = StatusCode.UNKNOWN
            try:
                response = await method(request)
                code = StatusCode.OK
                return response
            except (GrpcError, RsgwError) as exc:
                code = call.status_for(exc)
                raise
            except Exception as exc:
                code = StatusCode.INTERNAL
                logger.exception("gateway control call failed", extra={"rpc": rpc})
                raise GrpcError(code, f"gateway control call failed: {exc}") from exc
            except BaseException as exc:
                code = call.status_for(exc)
                raise
            finally:
                self._metrics.observe(rpc, "", code, time.perf_counter() - started)

        return typed_unary(request_type, handler)

    def _lpt(self) -> Packing:
        if self._packing is None:
            raise GrpcError(
                StatusCode.FAILED_PRECONDITION,
                f"gateway scheduling mode is '{self.mode}'; the scheduler control RPCs "
                "require lpt_packing",
            )
        return self._packing

    # -- GetSchedulingStatus ------------------------------------------------------------

    async def get_status(
        self, request: cpb.GetSchedulingStatusRequest
    ) -> cpb.GetSchedulingStatusResponse:
        packing = self._packing
        if packing is None:
            return cpb.GetSchedulingStatusResponse(mode=str(self.mode))
        return status_of(packing)

    # -- SetSchedulingPolicy ------------------------------------------------------------

    async def set_policy(
        self, request: cpb.SetSchedulingPolicyRequest
    ) -> cpb.SetSchedulingPolicyResponse:
        packing = self._lpt()
        mask = list(request.update_mask)
        if mask and not request.HasField("policy"):
            raise GrpcError(
                StatusCode.INVALID_ARGUMENT, "policy is unset; send the values update_mask names"
            )
        tick = packing.packer.last_tick
        before = packing.knobs
        change = update_policy(
            before,
            mask,
            policy_values(request.policy),
            accumulated=tick.compute_accum if tick is not None else 0.0,
            first_repack_done=packing.packer.did_first_tick_repack,
        )
        generation = packing.retune(change.knobs)
        logger.info(
            "scheduling policy changed at runtime",
            extra={
                "changed": list(change.changed),
                "generation": generation,
                "before": {name: str(getattr(before, name)) for name in change.changed},
                "after": {name: str(getattr(change.knobs, name)) for name in change.changed},
            },
        )
        return cpb.SetSchedulingPolicyResponse(
            applied=policy_message(change.knobs, generation),
            warnings=list(change.warnings),
            persisted=False,
        )

    # -- SetModelPlacement --------------------------------------------------------------

    async def set_placement(
        self, request: cpb.SetModelPlacementRequest
    ) -> cpb.SetModelPlacementResponse:
        packing = self._lpt()
        name = request.name
        if not name:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, "name is empty")
        known = bool(self._prober.table.replicas(name))
        if not known and not request.allow_unknown_model:
            raise GrpcError(
                StatusCode.NOT_FOUND,
                f"no worker currently serves model '{name}'; set allow_unknown_model to "
                "pre-seed an override for a model that is not loaded yet",
            )
        replicas = replicas_from_wire(request.replicas)
        knobs = update_override(
            packing.knobs, name, replicas, request.fill_mode, request.fill_factor
        )
        generation = packing.retune(knobs)
        ready = ready_count(packing)
        effective = effective_replicas(knobs, name, ready)
        warnings: list[str] = []
        if ready > 0 and replicas not in (None, ALL) and int(replicas or 0) > ready:
            warnings.append(
                f"replicas={replicas} exceeds the {ready} worker(s) ready at the last poll; "
                f"the placement will clamp to {ready}"
            )
        if not known:
            warnings.append(
                f"no worker currently serves '{name}'; the override is stored and applies "
                "once it is loaded"
            )
        plan = packing.scheduler.plan_for(name)
        if plan.mode is FillMode.INFLIGHT:
            warnings.append(PARKING_WARNING)
        warnings.extend(projection(packing, name, effective))
        warnings.append(NEXT_REPACK)
        logger.info(
            "model placement override changed at runtime",
            extra={
                "model": name,
                "replicas": replicas_to_wire(replicas),
                "fill_mode": str(plan.mode),
                "fill_quantum": plan.quantum,
                "generation": generation,
            },
        )
        return cpb.SetModelPlacementResponse(
            name=name,
            configured_replicas=replicas_to_wire(replicas),
            effective_replicas=effective,
            fill_mode=str(plan.mode),
            fill_quantum=plan.quantum,
            warnings=warnings,
            persisted=False,
        )

    # -- Repack -------------------------------------------------------------------------

    async def repack(self, request: cpb.RepackRequest) -> cpb.RepackResponse:
        packing = self._lpt()
        wait = request.wait_seconds
        if not wait >= 0:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, f"wait_seconds must be >= 0, got {wait}")
        warnings: list[str] = []
        if wait > MAX_REPACK_WAIT:
            wait = MAX_REPACK_WAIT
            warnings.append(f"wait_seconds clamped to the server maximum of {MAX_REPACK_WAIT}s")
        # The prober's last round is the freshest word on readiness; ticks run on it.
        if wait > 0 and not self._prober.ready:
            raise GrpcError(
                StatusCode.UNAVAILABLE,
                "no worker was ready at the last prober tick; a repack needs at least one "
                "ready worker (check the workers, then retry)",
            )
        outcome = await packing.request_repack(wait)
        if not outcome.completed:
            warnings.append(
                f"repack queued but not observed within {outcome.waited_seconds:.2f}s; it will "
                "run on the next prober round"
            )
        return cpb.RepackResponse(
            sequence=outcome.sequence,
            completed_sequence=outcome.completed_sequence,
            completed=outcome.completed,
            waited_seconds=outcome.waited_seconds,
            repack=repack_status(packing),
            warnings=warnings,
        )


# -- wire forms -----------------------------------------------------------------------------


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
        status.last_repack_unix_seconds = report.now
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
        status.last_tick_unix_seconds = tick.now
    else:
        knobs = packing.knobs
        first = knobs.first_rebalance_compute_seconds
        status.active_threshold_seconds = first if first > 0 else knobs.rebalance_compute_seconds
    return status


def status_of(packing: Packing) -> cpb.GetSchedulingStatusResponse:
    """The full lpt_packing status (REFERENCE.md §2.8 GetSchedulingStatus)."""
    knobs = packing.knobs
    packer = packing.packer
    scheduler = packing.scheduler
    assignment = packer.assignment
    report = packer.last_report
    outstanding = scheduler.router.outstanding()
    routed = scheduler.router.routed()
    mem = report.mem if report is not None else {}
    models = []
    for name in sorted({*assignment, *knobs.models, *scheduler.max_batch}):
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
    for url in sorted({*budgets, *hosted, *ready}):
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
