"""lpt_packing's request path over real packer state, without sockets (docs/original.md §4.5)."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from rsgw.scheduling.calls._fill import FillReservation
from rsgw.scheduling.calls._routing import build_routing_table
from rsgw.scheduling.knobs._knobs import FillMode, SchedulingMode, WorkBasis
from rsgw.scheduling.knobs._settings import SchedulingConfig
from rsgw.scheduling.placement._lpt import LptScheduler
from rsgw.scheduling.placement._packer import Packer
from rsgw.scheduling.placement._reports import PollSummary
from tests.helpers import infer_request

A, B = "127.0.0.1:1", "127.0.0.1:2"


def summary(*, polled: tuple[str, ...] = (A, B), locator: bool = True) -> PollSummary:
    return PollSummary(
        max_batch=MappingProxyType({"m": 8} if polled else {}),
        batch_at=MappingProxyType({"m": ("x", 1)} if locator and polled else {}),
        workers=MappingProxyType({"m": polled} if polled else {}),
        polled=polled,
    )


def scheduler(basis: WorkBasis = WorkBasis.ITEMS) -> LptScheduler:
    knobs = SchedulingConfig(
        mode=SchedulingMode.LPT_PACKING, work_basis=basis, default_replicas="all"
    )
    lpt = LptScheduler(knobs, Packer())
    poll = summary()
    lpt.polled(poll)
    lpt.install(lpt.packer.repack(poll, knobs, 0.0, "startup").assignment)
    return lpt


def body(rows: int) -> bytes:
    request = infer_request("m", {"x": np.zeros((max(rows, 1), 4), dtype=np.float32)})
    request.inputs[0].shape[0] = rows  # what a client may claim, whatever it sends
    return request.SerializeToString()


def test_items_are_counted_from_the_published_locator() -> None:
    lpt = scheduler()
    order, reservation = lpt.select("m", (A, B), body(5))
    assert isinstance(reservation, FillReservation) and reservation.units == 5
    assert sorted(order) == [A, B] and lpt.loads()[order[0]] == 5.0
    lpt.release(reservation)
    assert lpt.loads()[order[0]] == 0.0


def test_a_negative_extent_charges_one_item_never_less() -> None:
    lpt = scheduler()
    _, reservation = lpt.select("m", (A, B), body(-3))
    assert isinstance(reservation, FillReservation) and reservation.units == 1
    assert min(lpt.loads().values()) >= 0.0


def test_a_poll_nobody_answered_keeps_plans_and_locators() -> None:
    lpt = scheduler()
    lpt.polled(summary(polled=()))
    assert lpt.plans["m"].quantum == 8 and lpt.plans["m"].batch_input == "x"
    lpt.polled(summary(locator=False))  # a worker mid-reload reports no locator
    assert lpt.plans["m"].batch_input == "x"


def test_replicas_discovery_lost_are_skipped_and_unplaced_models_are_fill_routed() -> None:
    lpt = scheduler()
    order, reservation = lpt.select("m", (B,), body(1))  # A is gone from the table
    assert order == (B,) and isinstance(reservation, FillReservation)
    # Unplaced (served by a worker without a control plane, say): fill-routed over the
    # workers that have it, not spread blindly.
    order, reservation = lpt.select("other", (A, B), body(1))
    assert isinstance(reservation, FillReservation) and sorted(order) == [A, B]
    assert lpt.select("other", (), body(1)) == ((), None)


def test_a_knob_change_keeps_locators_and_plan_for_covers_unknown_models() -> None:
    lpt = scheduler()
    lpt.knobs = SchedulingConfig(
        mode=SchedulingMode.LPT_PACKING, routing_fill_mode=FillMode.SPREAD, routing_fill_factor=2
    )
    assert lpt.plans["m"].mode is FillMode.SPREAD and lpt.plans["m"].quantum == 16
    assert lpt.plans["m"].batch_input == "x"
    ghost = lpt.plan_for("ghost")
    assert ghost.mode is FillMode.SPREAD and ghost.quantum == 1


def test_busy_placed_replicas_shed_and_dead_ones_fall_back() -> None:
    knobs = SchedulingConfig(mode=SchedulingMode.LPT_PACKING, work_basis=WorkBasis.ITEMS)
    lpt = LptScheduler(knobs, Packer())
    poll = summary()
    lpt.polled(poll)
    lpt.install(lpt.packer.repack(poll, knobs, 0.0, "startup").assignment)
    placed = lpt.packer.assignment["m"].urls
    other = B if placed == (A,) else A
    lpt.table_swapped(build_routing_table({A: ["m"], B: ["m"]}, (A, B), 1))
    # The placed replica is alive but holds its share: the service offers only the other.
    assert lpt.select("m", (other,), body(1)) == ((), None)
    # The placed replica is gone from discovery: the call may go to the survivor.
    lpt.table_swapped(build_routing_table({other: ["m"]}, (A, B), 2))
    order, reservation = lpt.select("m", (other,), body(1))
    assert order == (other,) and reservation is None
