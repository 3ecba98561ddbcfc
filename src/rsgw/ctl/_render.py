"""Replies of GatewayControlService as the text an operator reads (docs/original.md §7).

Pure: protobuf messages in, strings out (no trailing newline), so every format is
tested on hand-built replies without a gateway. Tables are aligned on their
widest cell and lines never end in spaces, so the output diffs and greps cleanly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._values import human_bytes
from rsgw.ctl._commands import Command, SetPolicy, SetTenant

if TYPE_CHECKING:
    from google.protobuf.message import Message

#: What the mutators' `persisted=false` means for the operator.
NOT_PERSISTED_NOTE: Final = (
    "note: runtime changes are not persisted; a restart reverts to gateway.yml"
)
#: The same for a tenant's policy, which a reload applies again too.
TENANT_NOT_PERSISTED_NOTE: Final = (
    "note: runtime changes are not persisted; a reload (SIGHUP) or a restart reverts "
    "to gateway.yml's tenancy block"
)


def format_replicas(replicas: int) -> str:
    """A replica count in wire form as the operator writes it: -1 `all`, 0 `-` (none/default)."""
    if replicas == -1:
        return "all"
    if replicas == 0:
        return "-"
    return str(replicas)


def format_budget(count: int) -> str:
    """A weight budget; `-` when there is none (0: the worker's cache is disabled)."""
    return "-" if count <= 0 else human_bytes(count)


def format_bool(value: bool) -> str:
    return "true" if value else "false"


def format_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Rows aligned under `header`, columns two spaces apart, indented by two."""
    table = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  "
        + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]


def warning_lines(warnings: Iterable[str]) -> list[str]:
    return [f"  warning: {warning}" for warning in warnings]


def format_error(code: str, message: str, target: str) -> str:
    """The one stderr line for a failed call, e.g. `error: UNAVAILABLE: ... (from h:p)`."""
    return f"error: {code}: {message} (from {target})"


# ---------------------------------------------------------------------------
# status


def render_status(status: cpb.GetSchedulingStatusResponse) -> str:
    """GetSchedulingStatus: mode, knobs, repack block, models, workers, warnings."""
    lines = [f"mode: {status.mode}"]
    if status.HasField("coordination"):
        lines += _coordination_lines(status.coordination)
    if status.HasField("policy"):
        lines += _knob_lines(status.policy)
    else:
        lines.append("(this scheduling mode has no runtime knobs)")
    if status.HasField("repack"):
        lines += _repack_block(status.repack)
    if status.HasField("policy") or status.models:
        lines += _model_lines(status.models)
    if status.HasField("policy") or status.workers:
        lines += _worker_lines(status.workers, any(m.residency for m in status.models))
    if status.members:
        lines += _member_lines(status.members)
    if status.HasField("tenancy"):
        lines += _tenancy_lines(status.tenancy)
    lines += warning_lines(status.warnings)
    return "\n".join(lines)


def _coordination_lines(coordination: cpb.Coordination) -> list[str]:
    """How this gateway stands among the coordinated ones (issue 39)."""
    state = coordination.state
    if state == "placer":
        role = "placer (this gateway places for all)"
    elif state == "follower":
        role = f"follower of {coordination.placer or '?'}"
    else:
        role = f"disconnected: {coordination.last_error or 'etcd unreachable'}"
    lines = [
        f"coordination: {coordination.member}, {role}",
        f"  epoch: {coordination.epoch}  gateways: {', '.join(coordination.members) or '-'}",
        f"  etcd: {', '.join(coordination.etcd_endpoints)}, last answered "
        f"{coordination.seconds_since_contact:.1f} s ago",
    ]
    return lines


def _knob_lines(policy: cpb.SchedulingPolicy) -> list[str]:
    if policy.generation == 0:
        title = "knobs (as configured):"
    else:
        title = f"knobs (generation {policy.generation}, tuned at runtime):"
    knobs = [
        ("rebalance_compute_seconds", str(policy.rebalance_compute_seconds)),
        ("first_rebalance_compute_seconds", str(policy.first_rebalance_compute_seconds)),
        ("hysteresis", str(policy.hysteresis)),
        ("ema_halflife_compute_seconds", str(policy.ema_halflife_compute_seconds)),
        ("default_replicas", format_replicas(policy.default_replicas)),
        ("routing_policy", policy.routing_policy),
        ("work_basis", policy.work_basis),
        ("routing_fill_mode", policy.routing_fill_mode),
        ("routing_fill_factor", str(policy.routing_fill_factor)),
        (
            "compaction",
            f"{policy.compaction_mode} every {policy.compaction_interval} repack(s)",
        ),
        ("forbid_memory_oversubscription", format_bool(policy.forbid_memory_oversubscription)),
    ]
    return [title, *format_table(("knob", "value"), knobs)[1:]]


def _repack_block(repack: cpb.RepackStatus) -> list[str]:
    # The first-repack budget is the one in force until the first traffic-driven repack.
    armed = not repack.first_tick_repack_done
    return [
        f"repacks: {repack.repack_count} total, last trigger '{repack.last_trigger}' "
        f"({repack.last_models_placed} models, {repack.last_models_moved} moved)",
        f"  compute since last repack {repack.compute_accumulated_seconds:.2f} of "
        f"{repack.active_threshold_seconds:.2f} GPU-seconds",
        f"  first-repack budget armed {format_bool(armed)}",
        f"  operator repacks {repack.operator_repacks_requested} requested, "
        f"{repack.operator_repacks_completed} served",
    ]


def _placement(model: cpb.ModelSchedulingStatus) -> str:
    text = "  ".join(
        f"{replica.worker} {replica.routed_total}req/{replica.outstanding}it"
        for replica in model.replicas
    )
    text = text or "-"
    if not model.placed:
        text += " [unplaced]"
    if model.drifted:
        text += " [drifted]"
    return text


def _model_lines(models: Sequence[cpb.ModelSchedulingStatus]) -> list[str]:
    """One row per model; a `resident` column (resident, loading, cold) where the
    gateway loads models on demand (issue 49)."""
    if not models:
        return ["models: none"]
    residency = any(model.residency for model in models)
    header: tuple[str, ...] = ("name", "cfg", "eff", "fill", "quant", "util", "cost")
    rows = [
        (
            model.name,
            format_replicas(model.configured_replicas),
            str(model.effective_replicas),
            model.fill_mode,
            str(model.fill_quantum),
            f"{model.utilization:.4f}",
            f"{model.cost_seconds:.4f}",
            *((model.residency or "-",) if residency else ()),
            _placement(model),
        )
        for model in models
    ]
    header += ("resident", "placement") if residency else ("placement",)
    return ["models:", *format_table(header, rows)]


def _member_lines(members: Sequence[cpb.Member]) -> list[str]:
    header = ("worker", "address", "name", "source", "ready", "calls", "counters", "implements")
    rows = [
        (
            member.worker,
            member.address,
            member.public_name,
            member.source,
            format_bool(member.ready),
            str(member.inflight),
            member.counters or "-",
            ",".join(member.capabilities) or "-",
        )
        for member in members
    ]
    return [f"members: {len(members)}", *format_table(header, rows)]


def _worker_lines(workers: Sequence[cpb.WorkerSchedulingStatus], residency: bool) -> list[str]:
    """One row per worker; with `residency` (the gateway loads models on demand), the
    bytes of handed models each holds (`used`) and what its budget leaves (`free`)."""
    if not workers:
        return ["workers: none"]
    header: tuple[str, ...] = ("worker", "ready", "models", "in-flight", "weights", "budget")
    if residency:
        header += ("used", "free")
    rows = [
        (
            worker.worker,
            format_bool(worker.ready),
            str(worker.models_placed),
            f"{worker.inflight_compute:.3f}",
            human_bytes(worker.assigned_weight_bytes),
            format_budget(worker.weight_budget_bytes),
            *((human_bytes(worker.resident_weight_bytes), _free(worker)) if residency else ()),
        )
        for worker in workers
    ]
    lines = format_table(header, rows)
    for i, worker in enumerate(workers, start=1):
        if worker.oversubscribed:
            lines[i] += "  OVERSUBSCRIBED"
    return ["workers:", *lines]


def format_quota(policy: cpb.TenantPolicy) -> str:
    """A tenant's quotas in words: `10/s burst 20, 4 at once`, or `none`."""
    parts = []
    if policy.rate:
        burst = policy.burst or max(1.0, policy.rate)
        parts.append(f"{policy.rate:g}/s burst {burst:g}")
    if policy.max_concurrent:
        parts.append(f"{policy.max_concurrent} at once")
    return ", ".join(parts) or "none"


def _tenancy_lines(tenancy: cpb.TenancyStatus) -> list[str]:
    """Who the tenants are, and each one's share and use (issue 52)."""
    source = f"header {tenancy.header}" if tenancy.header else "the caller's identity"
    levels = tenancy.priority_levels
    priorities = f"{levels} levels, default {tenancy.default_priority}" if levels > 1 else "off"
    header = ("tenant", "weight", "share", "priority", "quota", "calls", "admitted", "refused")
    rows = [
        (
            tenant.tenant + ("" if tenant.listed else " *"),
            f"{tenant.policy.weight:g}",
            f"{tenant.share:.2f}",
            str(tenant.policy.priority or tenancy.default_priority) if levels > 1 else "-",
            format_quota(tenant.policy),
            str(tenant.inflight),
            str(tenant.admitted),
            f"{tenant.refused} + {tenant.over_quota} over quota",
        )
        for tenant in tenancy.tenants
    ]
    lines = [
        f"tenancy: tenant from {source}; priorities {priorities}; "
        f"default quota {format_quota(tenancy.default)}"
    ]
    if rows:
        lines += format_table(header, rows)
        lines.append("  (* not listed: the default quota applies)")
    return lines


def _free(worker: cpb.WorkerSchedulingStatus) -> str:
    """The budget left for loads: what the gateway may still load there."""
    if worker.weight_budget_bytes <= 0:
        return "-"
    return human_bytes(max(worker.weight_budget_bytes - worker.resident_weight_bytes, 0))


# ---------------------------------------------------------------------------
# mutators


def render_repack(reply: cpb.RepackResponse) -> str:
    """Repack: whether it ran within the wait, then the counters it left behind."""
    if reply.completed:
        head = f"repack {reply.sequence} completed in {reply.waited_seconds:.2f}s"
    else:
        head = f"repack {reply.sequence} queued (not observed within {reply.waited_seconds:.2f}s)"
    repack = reply.repack
    lines = [
        head,
        f"  now {repack.repack_count} repack(s) total, last trigger '{repack.last_trigger}', "
        f"{repack.last_models_moved} model(s) moved",
    ]
    return "\n".join(lines + warning_lines(reply.warnings))


def render_placement(reply: cpb.SetModelPlacementResponse) -> str:
    """SetModelPlacement: the override as stored and the plan it resolves to."""
    lines = [
        f"{reply.name}: replicas {format_replicas(reply.configured_replicas)} "
        f"(effective {reply.effective_replicas}), fill {reply.fill_mode} "
        f"quantum {reply.fill_quantum}",
        *warning_lines(reply.warnings),
    ]
    if not reply.persisted:
        lines.append(NOT_PERSISTED_NOTE)
    return "\n".join(lines)


def render_policy(keys: Sequence[str], reply: cpb.SetSchedulingPolicyResponse) -> str:
    """SetSchedulingPolicy: the knobs applied, in the order given, and the new generation."""
    lines = [
        f"applied {', '.join(keys)} (generation {reply.applied.generation})",
        *warning_lines(reply.warnings),
    ]
    if not reply.persisted:
        lines.append(NOT_PERSISTED_NOTE)
    return "\n".join(lines)


def render_tenant(command: SetTenant, reply: cpb.SetTenantPolicyResponse) -> str:
    """SetTenantPolicy: the tenant's policy in force, after the change if one was asked."""
    applied = reply.applied
    priority = str(applied.priority) if applied.priority else "the default"
    head = "applied " + ", ".join(command.keys) + ": " if command.keys else ""
    lines = [
        f"{head}tenant '{reply.tenant}' weight {applied.weight:g}, priority {priority}, "
        f"quota {format_quota(applied)}",
        *warning_lines(reply.warnings),
    ]
    if command.keys and not reply.persisted:
        lines.append(TENANT_NOT_PERSISTED_NOTE)
    return "\n".join(lines)


def render_reply(command: Command, reply: Message) -> str:
    """The text for the reply to `command` (the reply type `call_for(command)` names)."""
    if isinstance(reply, cpb.GetSchedulingStatusResponse):
        return render_status(reply)
    if isinstance(reply, cpb.RepackResponse):
        return render_repack(reply)
    if isinstance(reply, cpb.SetModelPlacementResponse):
        return render_placement(reply)
    if isinstance(reply, cpb.SetSchedulingPolicyResponse) and isinstance(command, SetPolicy):
        return render_policy(command.keys, reply)
    if isinstance(reply, cpb.SetTenantPolicyResponse) and isinstance(command, SetTenant):
        return render_tenant(command, reply)
    if isinstance(reply, cpb.AddWorkerResponse):
        return f"added {reply.worker}; {reply.workers} workers"
    if isinstance(reply, cpb.RemoveWorkerResponse):
        return (
            f"removed {reply.worker} after {reply.drained_seconds:.1f} s of drain "
            f"({reply.calls_cut_short} calls cut short); {reply.workers} workers"
        )
    raise TypeError(f"no rendering of {type(reply).__name__} for {command!r}")
