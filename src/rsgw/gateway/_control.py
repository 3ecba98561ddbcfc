"""`reactant_control.GatewayControlService`: retune a live fleet without a restart.

Served on the inference port next to the data plane (docs/original.md §2.8). Status works
in every mode; the three scheduler mutators need lpt_packing and answer
FAILED_PRECONDITION otherwise. AddWorker and RemoveWorker (rsgw's own, issue 24) change
the workers (`rsgw.gateway._members`); SetTenantPolicy (rsgw's own, issue 52) a tenant's
weight, priority and quotas (`rsgw.gateway.calls._tenancy`), where gateway.yml has a
`tenancy:` block (FAILED_PRECONDITION otherwise). Every change is validated with the
gateway.yml validators (`rsgw.scheduling.knobs._policy`, `rsgw.config._tenancy`),
all-or-nothing, swapped in by reference (a scheduling change bumps the generation), and
lives in memory only: every mutator's answer says `persisted=false`, and a restart (for
a tenant's policy, a reload) reverts to gateway.yml.

With coordination (several gateways, one placement: `rsgw.coordination`), a policy or
placement change and a worker added or removed are shared with the other gateways,
which apply them as their own, and a Repack asked of a gateway that does not place is
carried out by the one that does. A tenant's policy is each gateway's own (its quotas
count the calls that gateway sees).

Errors: a bad value is INVALID_ARGUMENT with the validator's message (the one
gateway.yml would print); a deliberate gRPC error passes through; anything else is
INTERNAL `gateway control call failed: ...`, logged with its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import trio
from google.protobuf.message import Message

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._call import CallContext, UnaryHandler
from rsgw.base._errors import ConfigError, GrpcError, InvalidRequest, RsgwError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.base._usage import nearest
from rsgw.config._tenancy import TENANT_FIELDS, with_tenant
from rsgw.gateway._members import Members, MembershipRefused
from rsgw.gateway.calls._tenancy import Tenancy, tenant_policy_message
from rsgw.gateway.fleet._prober import Prober
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.gateway.placement._coordinator import Coordinator, coordination_message
from rsgw.gateway.placement._packing import Packing
from rsgw.gateway.placement._preconditions import NO_CONTROL_PLANE
from rsgw.gateway.placement._scheduling_status import (
    policy_message,
    policy_values,
    projection,
    ready_count,
    repack_status,
    status_of,
)
from rsgw.grpc._metering import metered
from rsgw.grpc._typed import typed_unary
from rsgw.scheduling.calls._reported import CounterSource
from rsgw.scheduling.knobs._knobs import ALL, FillMode, SchedulingMode
from rsgw.scheduling.knobs._policy import (
    NEXT_REPACK,
    PARKING_WARNING,
    effective_replicas,
    replicas_from_wire,
    replicas_to_wire,
    update_override,
    update_policy,
)

logger = logging.getLogger(__name__)

#: The longest a Repack call may wait for its repack.
MAX_REPACK_WAIT = 120.0
_CONTROL_STATUS = Method.MODEL_CONTROL_STATUS

Req = TypeVar("Req", bound=Message)


class GatewayControl:
    """The GatewayControlService handlers, over the lpt_packing shell (if any)."""

    def __init__(
        self,
        mode: SchedulingMode,
        packing: Packing | None,
        prober: Prober,
        metrics: GatewayMetrics,
        members: Members,
        counter_sources: Mapping[str, CounterSource] | None = None,
        coordinator: Coordinator | None = None,
        tenancy: Tenancy | None = None,
    ) -> None:
        self.mode = mode
        #: The tenants' policies in force (None: no `tenancy:` block).
        self._tenancy = tenancy
        self._packing = packing
        self._prober = prober
        self._metrics = metrics
        self._members = members
        #: Where each worker's work counters come from (the metadata poller's, live).
        self._counter_sources = counter_sources or {}
        #: Several gateways, one placement (None: this gateway alone): this gateway's
        #: scheduling changes are shared through it, the others' applied here
        #: (`serve_changes`).
        self.coordination = coordinator

    async def serve_changes(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Apply the other gateways' scheduling changes as the coordinator hands them on,
        in etcd's order, until cancelled (nothing to do without coordination)."""
        task_status.started()
        if self.coordination is None:
            return
        async for change in self.coordination.changes:
            try:
                await self.apply_change(change.method, change.request)
            except RsgwError as exc:  # one that does not apply must not stop the others
                logger.error(
                    "coordination: another gateway's change does not apply here",
                    extra={"origin": change.origin, "method": change.method, "why": str(exc)},
                )
            except Exception:  # a bug: said with its traceback; the next ones still apply
                logger.exception(
                    "coordination: applying another gateway's change failed",
                    extra={"origin": change.origin, "method": change.method},
                )

    async def apply_change(self, method: str, body: bytes) -> None:
        """Apply a scheduling change another gateway's operator made (already checked
        there; a model it knows and this gateway does not yet is stored all the same)."""
        if method == Method.SET_SCHEDULING_POLICY.rpc:
            await self.set_policy(cpb.SetSchedulingPolicyRequest.FromString(body), share=False)
        elif method == Method.SET_MODEL_PLACEMENT.rpc:
            request = cpb.SetModelPlacementRequest.FromString(body)
            request.allow_unknown_model = True
            await self.set_placement(request, share=False)
        elif method == Method.ADD_WORKER.rpc:
            await self.add_worker(cpb.AddWorkerRequest.FromString(body), share=False)
        elif method == Method.REMOVE_WORKER.rpc:
            await self.remove_worker(cpb.RemoveWorkerRequest.FromString(body), share=False)
        else:
            raise InvalidRequest(f"no such shared change: {method}")

    async def _share_quietly(self, rpc: Method, request: Message) -> None:
        """`_share`, for answers without warnings: a failure is logged instead."""
        warnings: list[str] = []
        await self._share(rpc, request, warnings)
        for warning in warnings:
            logger.warning(
                "gateway control change not shared", extra={"rpc": rpc.rpc, "why": warning}
            )

    async def _share(self, rpc: Method, request: Message, warnings: list[str]) -> None:
        """Tell the other gateways of a change made here; a warning if etcd did not take it."""
        if self.coordination is None:
            return
        try:
            await self.coordination.changed(rpc.rpc, request.SerializeToString())
        except RsgwError as exc:
            warnings.append(f"applied on this gateway only: {exc}")

    def handlers(self) -> dict[str, UnaryHandler]:
        """The handler table: one row per GatewayControlService method."""
        table: dict[Method, UnaryHandler] = {
            Method.GET_SCHEDULING_STATUS: self._wrap(
                Method.GET_SCHEDULING_STATUS, cpb.GetSchedulingStatusRequest, self.get_status
            ),
            Method.SET_SCHEDULING_POLICY: self._wrap(
                Method.SET_SCHEDULING_POLICY, cpb.SetSchedulingPolicyRequest, self.set_policy
            ),
            Method.SET_MODEL_PLACEMENT: self._wrap(
                Method.SET_MODEL_PLACEMENT, cpb.SetModelPlacementRequest, self.set_placement
            ),
            Method.REPACK: self._wrap(Method.REPACK, cpb.RepackRequest, self.repack),
            Method.ADD_WORKER: self._wrap(Method.ADD_WORKER, cpb.AddWorkerRequest, self.add_worker),
            Method.REMOVE_WORKER: self._wrap(
                Method.REMOVE_WORKER, cpb.RemoveWorkerRequest, self.remove_worker
            ),
            Method.SET_TENANT_POLICY: self._wrap(
                Method.SET_TENANT_POLICY, cpb.SetTenantPolicyRequest, self.set_tenant_policy
            ),
        }
        return {method.path: handler for method, handler in table.items()}

    def _wrap(
        self, rpc: Method, request_type: type[Req], method: Callable[[Req], Awaitable[Message]]
    ) -> UnaryHandler:
        observe = self._metrics.observer(rpc.rpc)

        async def handler(request: Req, call: CallContext) -> Message:
            with metered(call, observe):
                try:
                    return await method(request)
                except RsgwError:
                    raise
                except Exception as exc:  # a bug: logged here, its text kept from the client
                    logger.exception("gateway control call failed", extra={"rpc": rpc.rpc})
                    raise GrpcError(
                        StatusCode.INTERNAL,
                        f"gateway control call failed: {rpc.rpc} hit an internal error "
                        "(the gateway's log has its traceback)",
                    ) from exc

        return typed_unary(request_type, handler)

    def _lpt(self) -> Packing:
        if self._packing is None:
            raise GrpcError(
                StatusCode.FAILED_PRECONDITION,
                f"gateway scheduling mode is '{self.mode}'; the scheduler control RPCs "
                "require lpt_packing (start the gateway with --mode lpt_packing, or set "
                "scheduling.mode in gateway.yml or REACTANT_GATEWAY_SCHEDULING_MODE)",
            )
        return self._packing

    # -- AddWorker, RemoveWorker --------------------------------------------------------

    async def add_worker(
        self, request: cpb.AddWorkerRequest, *, share: bool = True
    ) -> cpb.AddWorkerResponse:
        try:
            label = self._members.add(request.address, request.name, request.metrics)
        except MembershipRefused as exc:
            raise GrpcError(exc.status, str(exc)) from None
        except ConfigError as exc:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if share:
            await self._share_quietly(Method.ADD_WORKER, request)
        return cpb.AddWorkerResponse(worker=label, workers=self._members.count)

    async def remove_worker(
        self, request: cpb.RemoveWorkerRequest, *, share: bool = True
    ) -> cpb.RemoveWorkerResponse:
        drain = request.drain_seconds if request.drain_seconds > 0 else None
        started = trio.current_time()
        try:
            member = self._members.retire(request.worker)
        except MembershipRefused as exc:
            raise GrpcError(exc.status, str(exc)) from None
        if share:  # once it took here, before the drain, so the others drain meanwhile
            # The others name the worker by its address: labels are each gateway's own.
            shared = cpb.RemoveWorkerRequest(worker=member.url, drain_seconds=request.drain_seconds)
            await self._share_quietly(Method.REMOVE_WORKER, shared)
        cut = await self._members.drain(member, drain)
        return cpb.RemoveWorkerResponse(
            worker=request.worker,
            calls_cut_short=cut,
            drained_seconds=trio.current_time() - started,
            workers=self._members.count,
        )

    # -- GetSchedulingStatus ------------------------------------------------------------

    async def get_status(
        self, request: cpb.GetSchedulingStatusRequest
    ) -> cpb.GetSchedulingStatusResponse:
        packing = self._packing
        status = (
            cpb.GetSchedulingStatusResponse(mode=str(self.mode))
            if packing is None
            else status_of(packing)
        )
        table = self._prober.capabilities.table
        status.members.extend(
            self._members.status(self._prober.ready, table, self._counter_sources)
        )
        if self.coordination is not None:
            status.coordination.CopyFrom(coordination_message(self.coordination))
        if self._tenancy is not None:
            status.tenancy.CopyFrom(self._tenancy.status(trio.current_time()))
        if packing is not None:
            members = self._members.membership.members
            loadable = set(table.loadable(m.url for m in members.values()))
            unplaced = [
                m.label
                for m in members.values()
                if not table.can(m.url, _CONTROL_STATUS)
                and not (m.url in loadable and packing.placer.handed)
            ]
            if unplaced:
                status.warnings.append(f"{NO_CONTROL_PLANE}: {', '.join(unplaced)}")
        return status

    # -- SetTenantPolicy ----------------------------------------------------------------

    async def set_tenant_policy(
        self, request: cpb.SetTenantPolicyRequest
    ) -> cpb.SetTenantPolicyResponse:
        tenancy = self._tenancy
        if tenancy is None:
            raise GrpcError(
                StatusCode.FAILED_PRECONDITION,
                "this gateway has no tenancy: block, so it tells no tenants apart; add one "
                'to gateway.yml (docs/configuration.md, "Tenancy") and restart the gateway',
            )
        tenant, mask = request.tenant, list(request.update_mask)
        values = {name: getattr(request.policy, name) for name in TENANT_FIELDS}
        try:
            config = with_tenant(tenancy.config, tenant, mask, values)
        except ConfigError as exc:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, str(exc)) from None
        before = tenancy.config.policy(tenant)
        tenancy.apply(config, trio.current_time())
        after = config.policy(tenant)
        if mask:
            logger.info(
                "tenant policy changed at runtime",
                extra={"tenant": tenant, "before": str(before), "after": str(after)},
            )
        warnings = []
        if tenancy.labels.label(tenant) != tenant:
            warnings.append(
                f"tenancy.max_tenant_series ({config.max_tenant_series}) tenants have their "
                f"own series already: '{tenant}' is counted as {tenancy.labels.label(tenant)}"
            )
        return cpb.SetTenantPolicyResponse(
            tenant=tenant, applied=tenant_policy_message(after), warnings=warnings, persisted=False
        )

    # -- SetSchedulingPolicy ------------------------------------------------------------

    async def set_policy(
        self, request: cpb.SetSchedulingPolicyRequest, *, share: bool = True
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
        warnings = list(change.warnings)
        if share:
            await self._share(Method.SET_SCHEDULING_POLICY, request, warnings)
        return cpb.SetSchedulingPolicyResponse(
            applied=policy_message(change.knobs, generation),
            warnings=warnings,
            persisted=False,
        )

    # -- SetModelPlacement --------------------------------------------------------------

    async def set_placement(
        self, request: cpb.SetModelPlacementRequest, *, share: bool = True
    ) -> cpb.SetModelPlacementResponse:
        packing = self._lpt()
        name = request.name
        if not name:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, "name is empty")
        table = self._prober.discovery.table
        known = bool(table.replicas(name))
        if not known and not request.allow_unknown_model:
            # A typo is likelier than a model not loaded yet: the nearest name first.
            raise GrpcError(
                StatusCode.NOT_FOUND,
                f"no worker currently serves model '{name}'{nearest(name, sorted(table.models))}"
                "; set allow_unknown_model to pre-seed an override for a model that is not "
                "loaded yet (rsgw ctl set-replicas --allow-unknown)",
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
        if share:
            await self._share(Method.SET_MODEL_PLACEMENT, request, warnings)
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
        coordination = self.coordination
        if coordination is not None and not coordination.placing:
            outcome = await coordination.request_repack(wait)  # the placer repacks
        else:
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
