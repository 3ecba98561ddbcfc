"""lpt_packing's request path: placement first, fill quantum within it, discovery last.

The packer (`rsgw.scheduling.placement._packer`) decides where each model lives; this scheduler
routes each request inside that decision (docs/original.md §4.5). Everything it reads is
an immutable snapshot replaced by reference: the knobs (the control plane swaps
them), the fill plans (republished every tick and on every knob change), the
packer's assignment and cost snapshot (replaced by each repack) and the routing
metadata (replaced by each poll). `select` reads them, picks and charges with no
`await`, so no two requests can both see the same least-loaded replica.

Where the original is weaker and we are not: a placed replica that discovery no
longer lists (a dead or hung worker) is skipped at once instead of being tried
first and failed over after its timeout, and a knob change keeps every model's
batch locator (docs/product.md §3.4), so item counting never degrades.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from rsgw.scheduling.calls._fill import DEFAULT_FILL_PLAN, FillPlan, FillReservation, FillRouter
from rsgw.scheduling.calls._fill import resolve_fill_plan as resolve
from rsgw.scheduling.calls._meta import RoutingMeta
from rsgw.scheduling.calls._routing import RoundRobin, RoutingTable
from rsgw.scheduling.calls._schedulers import AnyReservation
from rsgw.scheduling.calls._wire import peek_batch_size
from rsgw.scheduling.knobs._knobs import WorkBasis
from rsgw.scheduling.knobs._settings import SchedulingConfig
from rsgw.scheduling.placement._packer import Packer
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._reports import PollSummary


def fill_plans(
    knobs: SchedulingConfig,
    max_batch: Mapping[str, int],
    batch_at: Mapping[str, tuple[str, int]],
) -> Mapping[str, FillPlan]:
    """Every polled model's plan, plus every overridden model's (docs/original.md §4.8).

    An overridden model nobody reported yet gets a plan with max batch 0 (quantum 1),
    so its fill mode applies before its first successful poll.
    """
    plans: dict[str, FillPlan] = {}
    for model in sorted({*max_batch, *knobs.models}):
        override = knobs.models.get(model)
        batch_input, batch_axis = batch_at.get(model, ("", 0))
        plans[model] = resolve(
            knobs.routing_fill_mode,
            knobs.routing_fill_factor,
            override.fill_mode if override is not None else None,
            override.fill_factor if override is not None else None,
            max_batch.get(model, 0),
            batch_input,
            batch_axis,
        )
    return MappingProxyType(plans)


class LptScheduler:
    """The `Scheduler` of lpt_packing; the packing shell owns its packer and knobs."""

    needs_routing_meta = True

    def __init__(self, knobs: SchedulingConfig, packer: Packer) -> None:
        self.packer = packer
        self.router = FillRouter()
        self._knobs = knobs
        self._rr = RoundRobin()
        self._table = RoutingTable()
        #: model -> (its placement, the placement's replicas the table has).
        self._live_cache: dict[str, tuple[Placement, tuple[str, ...]]] = {}
        #: model -> the placement requests are routed by (`install`).
        self.routing: Mapping[str, Placement] = MappingProxyType({})
        self._meta = RoutingMeta()
        self._max_batch: Mapping[str, int] = MappingProxyType({})
        self._batch_at: Mapping[str, tuple[str, int]] = MappingProxyType({})
        #: model -> fill plan in force (replaced, never mutated).
        self.plans: Mapping[str, FillPlan] = fill_plans(knobs, self._max_batch, self._batch_at)

    # -- snapshots the shell swaps ----------------------------------------------------

    @property
    def knobs(self) -> SchedulingConfig:
        return self._knobs

    @knobs.setter
    def knobs(self, knobs: SchedulingConfig) -> None:
        """Install new knobs and republish the plans against them, locators kept."""
        self._knobs = knobs
        self.plans = fill_plans(knobs, self._max_batch, self._batch_at)

    @property
    def max_batch(self) -> Mapping[str, int]:
        """model -> its max batch: the last poll's, or an earlier one's if it lacked it."""
        return self._max_batch

    def polled(self, poll: PollSummary) -> None:
        """A tick's poll: republish max batch, locators and plans (docs/original.md §4.6.2 step 2).

        What this poll lacks keeps its previous value (a worker mid-reload reports no
        locator; a worker that missed the poll reports nothing), as the routing
        metadata does, so item counting never degrades for a round. State stays
        bounded by the models the fleet ever reported.
        """
        if not poll.polled:
            return
        self._max_batch = MappingProxyType({**self._max_batch, **poll.max_batch})
        self._batch_at = MappingProxyType({**self._batch_at, **poll.batch_at})
        self.plans = fill_plans(self._knobs, self._max_batch, self._batch_at)

    def plan_for(self, model: str) -> FillPlan:
        """The model's plan in force, or the one it would get with no poll yet."""
        plan = self.plans.get(model)
        if plan is None:
            plan = fill_plans(self._knobs, {model: 0}, {})[model]
        return plan

    def install(self, assignment: Mapping[str, Placement]) -> None:
        """Route by `assignment` from now on, and re-key the fill counters to it.

        Usually the packer's, as its repack decided; while models placed by loading
        and unloading move, the one their loads allow
        (`rsgw.scheduling.placement._repository_moves`).
        """
        self.routing = assignment
        self.router.rebuild({model: placement.urls for model, placement in assignment.items()})

    # -- Scheduler --------------------------------------------------------------------

    def arrived(self, model: str) -> None:
        """Count the call as demand, whether or not its replicas have room for it."""
        self.packer.record_arrival(model)

    def select(
        self, model: str, replicas: tuple[str, ...], body: bytes
    ) -> tuple[tuple[str, ...], AnyReservation | None]:
        """Route within the placement; `replicas` are the discovered ones with room.

        An empty order means the model's placed replicas are all busy: the service
        sheds the call rather than spill it (and its weights) onto another GPU.
        """
        placement = self.routing.get(model)
        if placement is None:
            urls: tuple[str, ...] = ()
        elif replicas is self._table.replicas(model):  # none is full: the usual case
            urls = self._live(model, placement)
        else:
            room = set(replicas)
            urls = tuple(u for u in placement.urls if u in room)
        if not urls:
            if placement is None:
                # Unplaced (a worker without a control plane serves it, or no repack
                # has placed it yet): fill-routed over the workers that have it.
                urls = replicas
            elif any(u in self._table.replicas(model) for u in placement.urls):
                return (), None  # its replicas are alive but busy: shed, never spill
            else:
                return self._rr.select(model, replicas), None  # its placed replicas gone
        if not urls:
            return (), None
        knobs = self._knobs
        plan = self.plans.get(model, DEFAULT_FILL_PLAN)
        units = 1
        if plan.batch_axis >= 1:
            extent = peek_batch_size(body, plan.batch_input, plan.batch_axis)
            units = extent if extent > 0 else 1  # a negative dim must not charge < 0
        # The placement only: the service falls back on the other discovered replicas
        # after a failure, never to spill load (that would move weights).
        return self.router.select(
            model, urls, plan, knobs.routing_policy, units, self._weight(model, units, knobs)
        )

    def release(self, reservation: AnyReservation | None) -> None:
        if isinstance(reservation, FillReservation):
            self.router.release(reservation)

    def table_swapped(self, table: RoutingTable) -> None:
        self._table = table
        self._live_cache = {}
        self._rr.forget_missing(table)

    def _live(self, model: str, placement: Placement) -> tuple[str, ...]:
        """`placement`'s replicas that the routing table has, computed once per pair of
        placement and table (a select at 64 replicas must not test 64 x 64 pairs)."""
        cached = self._live_cache.get(model)
        if cached is not None and cached[0] is placement:
            return cached[1]
        present = set(self._table.replicas(model))
        urls = tuple(u for u in placement.urls if u in present)
        self._live_cache[model] = (placement, urls)
        return urls

    def meta_refreshed(self, meta: RoutingMeta) -> None:
        self._meta = meta

    def _weight(self, model: str, units: int, knobs: SchedulingConfig) -> float:
        """The request's charge on its worker's load, in `work_basis` units.

        docs/original.md §4.5.
        """
        basis = knobs.work_basis
        if basis is WorkBasis.ITEMS:
            return float(units)
        if basis is WorkBasis.COMPUTE:
            return units * self._meta.item_cost(model)
        costs = self.packer.cost_snapshot
        cost = costs.get(model, 0.0)
        if cost > 0:
            return cost
        mean = costs.get("", 0.0)
        return mean if mean > 0 else 1.0

    def loads(self) -> Mapping[str, float]:
        """Live per-worker in-flight work, for `gateway_worker_inflight_work`."""
        return self.router.loads()
