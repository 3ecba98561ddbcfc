"""One gateway's part in its cluster's coordination: elect, publish, follow, share demand.

Theory of operation. Each gateway holds an etcd lease (`coordination.lease_ttl_seconds`)
for as long as it lives and can reach etcd, and registers under it. The first to
create the `placer` key under its lease is the placer: its packing repacks as a lone
gateway's does, and after each repack the placement is published, in a transaction
that writes it only while `placer` still names this gateway (so a gateway that lost
its place, and does not know it yet, can publish nothing: the fence). The placement's
etcd revision is its epoch. The others watch `placement` and route by it
(`Packing.follow`), repacking, loading, unloading and compacting nothing; each
reports the calls it routed, per model, about once a second (`demand/<name>`), and the
placer folds what is new into its own counts before each tick, so it places by the
whole fleet's traffic. When the placer's lease ends (it died, or lost etcd for a TTL),
its key goes with it, the others see the deletion and campaign; the winner starts from
the placement it was following, so nothing is placed cold.

etcd unreachable: the keep-alive fails within `rsgw.coordination._etcd.CALL_SECONDS`;
the gateway says so (state `disconnected`, a warning, the metrics), stops placing (a
placer that cannot publish must not move models under the others), keeps routing by
the last placement, and retries with the same lease, so a short outage changes
nothing; a lease that expired meanwhile is replaced and the election runs again.

Operator changes: SetSchedulingPolicy and SetModelPlacement, applied where they were
made, are written under `changes/` for every other gateway to apply in the order etcd
stored them (a gateway that starts later applies the history first); a Repack asked of
a follower is written under `repacks/`, the placer repacks, and the follower answers
once a placement newer than its request is published.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import socket
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import trio

from rsgw._proto import etcd_v3_pb2 as epb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.config._fleet_blocks import CoordinationConfig
from rsgw.coordination._etcd import (
    CALL_SECONDS,
    Etcd,
    EtcdUnavailable,
    LeaseLost,
    create_if_absent,
    put_while,
)
from rsgw.coordination._records import (
    DISCONNECTED,
    FOLLOWER,
    PLACER,
    ChangeRecord,
    CoordinationView,
    DemandFold,
    Keys,
    PlacementRecord,
    RecordError,
    decode_demand,
    encode_demand,
)
from rsgw.gateway.placement._latest import Latest
from rsgw.runtime._net import TCP, Network
from rsgw.scheduling.placement._reports import RepackReport, RepackWait

if TYPE_CHECKING:
    from rsgw.scheduling.placement._packer import Packer
    from rsgw.scheduling.placement._placement import Placement

logger = logging.getLogger(__name__)

#: How often a follower reports its demand (and the placer reads the others').
DEMAND_SECONDS = 1.0
#: The longest wait between attempts to reach etcd again.
MAX_RETRY_SECONDS = 2.0


class Placing(Protocol):
    """What coordination drives of the packing shell it belongs to
    (`rsgw.gateway.placement._packing.Packing`, which builds its coordinator)."""

    packer: Packer

    def request_repack_now(self) -> None: ...

    def follow(self, assignment: Mapping[str, Placement]) -> None: ...

    def load_on_demand(self, model: str) -> None: ...


def default_member(grpc_port: int) -> str:
    """A gateway's name among the coordinating ones when none is configured."""
    return f"{socket.gethostname()}:{grpc_port}"


class Coordinator:
    """This gateway's coordination (see the module docstring); `run` it in a nursery."""

    def __init__(
        self,
        config: CoordinationConfig,
        packing: Placing,
        *,
        member: str,
        address: str,
        network: Network = TCP,
    ) -> None:
        self.config = config
        self.keys = Keys(config.cluster)
        self.member = member
        self._address = address
        self._network = network
        self._packing = packing
        self._ttl = config.lease_ttl_seconds
        self.view = CoordinationView(state=DISCONNECTED, member=member)
        #: Other gateways' operator changes, in etcd's order, for the control service
        #: to apply here (`GatewayControl.serve_changes`). Unbounded: they come at the
        #: pace an operator types, and one must not be lost while another applies.
        self._send_change, self.changes = trio.open_memory_channel[ChangeRecord](math.inf)
        self._etcd: Etcd | None = None
        self._lease = 0
        self._placing = False
        self._publish: Latest[RepackReport] = Latest()
        self._published = trio.Event()
        self._reports: dict[str, dict[str, int]] = {}
        self._fold = DemandFold()
        self._demand: dict[str, int] = {}
        self._applied: set[bytes] = set()
        self._serial = itertools.count(1)
        #: Times this gateway became the placer, and placements it published.
        self.elections_won = 0
        self.publications = 0

    # -- the packing shell's hooks --------------------------------------------------------

    def may_place(self) -> bool:
        """This gateway is the placer."""
        return self._placing

    def before_tick(self) -> None:
        """The placer is about to tick: fold the other gateways' demand in."""
        for model, count in self._fold.fold(self._reports).items():
            self._packing.packer.record_arrival(model, count)

    def placed(self, report: RepackReport) -> None:
        """The placer installed a new placement: publish it."""
        self._publish.post(report)

    # -- what the control service asks ----------------------------------------------------

    @property
    def placing(self) -> bool:
        return self._placing

    async def changed(self, method: str, request: bytes) -> None:
        """An operator changed the scheduling here: have every other gateway apply it.

        Raises:
            EtcdUnavailable: etcd did not take it (the change holds here only).
        """
        etcd = self._require()
        key = self.keys.changes + f"{self.member}-{trio.current_time():.6f}".encode()
        self._applied.add(key)
        await etcd.put(key, ChangeRecord(self.member, method, request).encode())

    async def request_repack(self, wait_seconds: float) -> RepackWait:
        """A Repack asked of a follower: have the placer repack, and wait up to
        `wait_seconds` for a placement published after the request."""
        etcd = self._require()
        key = self.keys.repacks + f"{self.member}-{next(self._serial)}".encode()
        started = trio.current_time()
        await self._report_demand(etcd)  # so the repack counts this gateway's calls so far
        asked_at = await etcd.put(key, b"", lease=self._lease)
        completed = False
        with trio.move_on_after(wait_seconds):
            while self.view.epoch <= asked_at:
                await self._published.wait()
            completed = True
        return RepackWait(asked_at, self.view.epoch, completed, trio.current_time() - started)

    async def ask_load(self, model: str) -> None:
        """A call on this follower found `model` cold: have the placer load it (the
        caller then waits for it to appear in this gateway's routing table)."""
        etcd = self._require()
        await etcd.put(self.keys.loads + model.encode(), self.member.encode(), lease=self._lease)

    async def resign(self) -> None:
        """This gateway is stopping: end its lease, so its keys go now and another
        gateway places at once rather than after the lease's TTL."""
        self._placing = False
        etcd, lease = self._etcd, self._lease
        if etcd is None or not lease:
            return
        self._lease = 0
        with trio.move_on_after(CALL_SECONDS), contextlib.suppress(EtcdUnavailable):
            await etcd.revoke(lease)

    def _require(self) -> Etcd:
        if self._etcd is None or self.view.state == DISCONNECTED:
            raise EtcdUnavailable(
                f"etcd is unreachable ({self.view.last_error or 'not connected yet'}); "
                "the change was not shared with the other gateways"
            )
        return self._etcd

    # -- running ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take part until cancelled; started once etcd answered or the first try failed
        (the gateway serves either way: routing never waits for etcd)."""
        async with trio.open_nursery() as nursery:
            self._etcd = Etcd(self.config.etcd_endpoints, nursery, network=self._network)
            self._task_status: trio.TaskStatus[None] | None = task_status
            delay = 0.1
            while True:
                try:
                    await self._session()
                except (EtcdUnavailable, LeaseLost) as exc:
                    self._disconnected(exc)
                except Exception as exc:  # a bug here must not stop the gateway's routing
                    logger.exception("coordination failed; starting it again")
                    self._disconnected(exc)
                else:
                    delay = 0.1
                self._started()  # the first try failed: the gateway serves all the same
                await trio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)

    def _started(self) -> None:
        status, self._task_status = self._task_status, None
        if status is not None:
            status.started()

    async def _session(self) -> None:
        """One stretch of being connected: the lease kept alive, and everything on it."""
        etcd = self._etcd
        assert etcd is not None
        if self._lease:
            try:  # the same lease if it is still alive: a short outage changes nothing
                await _refresh(etcd, self._lease)
            except LeaseLost:
                self._lease = 0
        if not self._lease:
            self._lease = await etcd.grant(self._ttl)
        address = json.dumps({"address": self._address}).encode()
        await etcd.put(self.keys.member(self.member), address, lease=self._lease)
        self._contact()
        self._started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(etcd.keep_alive, self._lease, self._ttl / 3)
                nursery.start_soon(self._campaign, etcd)
                nursery.start_soon(self._follow, etcd)
                nursery.start_soon(self._share_demand, etcd)
                nursery.start_soon(self._publish_placements, etcd)
                nursery.start_soon(self._apply_changes, etcd)
                nursery.start_soon(self._serve_repacks, etcd)
                nursery.start_soon(self._serve_loads, etcd)
        except BaseExceptionGroup as group:  # the first failure says why the session ended
            raise _first(group) from None

    # -- the election ----------------------------------------------------------------

    async def _campaign(self, etcd: Etcd) -> None:
        """Be the placer, or watch the one there is until its key goes, then try again."""
        while True:
            claim = create_if_absent(self.keys.placer, self.member.encode(), self._lease)
            reply = await etcd.txn(claim)
            self._contact()
            revision = reply.header.revision
            if reply.succeeded:
                holder, lease = self.member, self._lease
            else:
                kvs = reply.responses[0].response_range.kvs
                if not kvs:
                    continue  # gone between the compare and the read: try again
                holder, lease = kvs[0].value.decode("utf-8", "replace"), kvs[0].lease
            if holder == self.member and lease == self._lease:
                await self._became_placer(etcd, won=reply.succeeded)
            else:
                self._placing = False
                self._set(state=FOLLOWER, placer=holder)
            async with etcd.watch(self.keys.placer, start_revision=revision + 1) as events:
                async for event in events:
                    if event.type == epb.Event.DELETE:
                        break
            self._placing = False
            logger.warning(
                "coordination: the placer's lease ended; electing another",
                extra={"placer": self.view.placer, "member": self.member},
            )

    async def _became_placer(self, etcd: Etcd, *, won: bool) -> None:
        """This gateway places from now on, starting from what it follows: the published
        placement if there is one (no cold placement), else a repack of its own."""
        self._reports = await self._read_demand(etcd)
        self._fold.begin(self._reports)  # what they hold went to the placer before
        self._placing = True
        self._set(state=PLACER, placer=self.member)
        if won:
            self.elections_won += 1
            logger.info(
                "coordination: this gateway is the placer",
                extra={"member": self.member, "epoch": self.view.epoch},
            )
        if await etcd.get(self.keys.placement) is None:
            # Nothing published yet: place now (and so publish), rather than publish a
            # placement this gateway computed while it could not move models.
            self._packing.request_repack_now()

    # -- publishing and following --------------------------------------------------------

    async def _publish_placements(self, etcd: Etcd) -> None:
        """Write each placement the placer installs, fenced by its `placer` key."""
        while True:
            report = await self._publish.take()
            if not self._placing:
                continue
            record = PlacementRecord(self.member, report.assignment, str(report.trigger))
            me = self.member.encode()
            fenced = put_while(self.keys.placer, me, self.keys.placement, record.encode())
            reply = await etcd.txn(fenced)
            self._contact()
            if not reply.succeeded:
                self._placing = False
                logger.warning(
                    "coordination: not the placer any more; placement not published",
                    extra={"member": self.member},
                )
                continue
            self.publications += 1
            self._set(epoch=reply.header.revision)
            self._wake_published()

    async def _follow(self, etcd: Etcd) -> None:
        """Route by each placement published (the placer's own are already in force)."""
        kv = await etcd.get(self.keys.placement)
        revision = 0
        if kv is not None:
            self._adopt(kv)
            revision = kv.mod_revision
        else:
            _, revision = await etcd.get_prefix(self.keys.placement)
        async with etcd.watch(self.keys.placement, start_revision=revision + 1) as events:
            async for event in events:
                if event.type == epb.Event.PUT:
                    self._adopt(event.kv)

    def _adopt(self, kv: epb.KeyValue) -> None:
        try:
            record = PlacementRecord.decode(kv.value)
        except RecordError as exc:
            logger.error("coordination: ignoring a malformed placement", extra={"why": str(exc)})
            return
        self._contact()
        self._set(epoch=max(self.view.epoch, kv.mod_revision))
        if record.placer != self.member or not self._placing:
            self._packing.follow(record.assignment)
        self._wake_published()

    def _wake_published(self) -> None:
        published, self._published = self._published, trio.Event()
        published.set()

    # -- demand ------------------------------------------------------------------------

    async def _share_demand(self, etcd: Etcd) -> None:
        """A follower reports its calls per model; the placer reads everyone's."""
        while True:
            if self._placing:
                self._reports = await self._read_demand(etcd)
            else:
                await self._report_demand(etcd)
            members, _ = await etcd.get_prefix(self.keys.members)
            self._set(members=tuple(Keys.name_in(kv.key, self.keys.members) for kv in members))
            self._contact()
            await trio.sleep(DEMAND_SECONDS)

    async def _report_demand(self, etcd: Etcd) -> None:
        """Write this gateway's calls per model since it started."""
        for model, count in self._packing.packer.take_arrivals().items():
            self._demand[model] = self._demand.get(model, 0) + count
        key = self.keys.demand_of(self.member)
        await etcd.put(key, encode_demand(self._demand), lease=self._lease)

    async def _read_demand(self, etcd: Etcd) -> dict[str, dict[str, int]]:
        """Every other gateway's demand report."""
        kvs, _ = await etcd.get_prefix(self.keys.demand)
        reports: dict[str, dict[str, int]] = {}
        for kv in kvs:
            name = Keys.name_in(kv.key, self.keys.demand)
            if name != self.member:
                with contextlib.suppress(RecordError):
                    reports[name] = decode_demand(kv.value)
        return reports

    # -- operator changes made elsewhere ------------------------------------------------

    async def _apply_changes(self, etcd: Etcd) -> None:
        """Hand every other gateway's operator change to the control service (`changes`),
        history first, in etcd's order."""
        kvs, revision = await etcd.get_prefix(self.keys.changes)
        for kv in sorted(kvs, key=lambda kv: kv.create_revision):
            self._apply(kv)
        async with etcd.watch(
            self.keys.changes, prefix=True, start_revision=revision + 1
        ) as events:
            async for event in events:
                if event.type == epb.Event.PUT:
                    self._apply(event.kv)

    def _apply(self, kv: epb.KeyValue) -> None:
        if kv.key in self._applied:
            return
        self._applied.add(kv.key)
        try:
            change = ChangeRecord.decode(kv.value)
        except RecordError as exc:
            logger.error("coordination: ignoring a malformed change", extra={"why": str(exc)})
            return
        if change.origin != self.member:
            self._send_change.send_nowait(change)

    async def _serve_repacks(self, etcd: Etcd) -> None:
        """The placer repacks when a follower's operator asks (`repacks/`)."""
        _, revision = await etcd.get_prefix(self.keys.repacks)
        async with etcd.watch(
            self.keys.repacks, prefix=True, start_revision=revision + 1
        ) as events:
            async for event in events:
                if event.type == epb.Event.PUT and self._placing:
                    # The asker wrote its demand first: read it, so the repack counts it.
                    self._reports = await self._read_demand(etcd)
                    self._packing.request_repack_now()

    async def _serve_loads(self, etcd: Etcd) -> None:
        """The placer loads a cold model a follower's call asked for (`loads/`)."""
        _, revision = await etcd.get_prefix(self.keys.loads)
        async with etcd.watch(self.keys.loads, prefix=True, start_revision=revision + 1) as events:
            async for event in events:
                if event.type == epb.Event.PUT and self._placing:
                    model = event.kv.key[len(self.keys.loads) :].decode("utf-8", "replace")
                    self._packing.load_on_demand(model)

    # -- the view ----------------------------------------------------------------------

    def _contact(self) -> None:
        if self.view.state == DISCONNECTED:
            self._set(state=PLACER if self._placing else FOLLOWER, last_error="")
            logger.info("coordination: etcd reachable", extra={"member": self.member})
        self._set(last_contact=trio.current_time())

    def _disconnected(self, exc: Exception) -> None:
        self._placing = False
        if self.view.state != DISCONNECTED:
            logger.warning(
                "coordination: etcd unreachable; routing on the last placement, repacks "
                "paused until it is back",
                extra={"member": self.member, "why": str(exc)},
            )
        self._set(state=DISCONNECTED, last_error=str(exc))

    def _set(self, **changes: object) -> None:
        self.view = replace(self.view, **changes)  # type: ignore[arg-type]


async def _refresh(etcd: Etcd, lease: int) -> None:
    """One keep-alive of `lease` (LeaseLost if it expired)."""
    with trio.move_on_after(CALL_SECONDS * 2):
        await etcd.keep_alive(lease, math.inf)


def _first(group: BaseExceptionGroup) -> BaseException:
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf


def coordination_message(coordinator: Coordinator) -> cpb.Coordination:
    """GetSchedulingStatus's `coordination`: how this gateway stands among the others."""
    view = coordinator.view
    since = trio.current_time() - view.last_contact if view.last_contact else 0.0
    return cpb.Coordination(
        state=view.state,
        member=view.member,
        placer=view.placer,
        epoch=view.epoch,
        members=list(view.members),
        last_error=view.last_error,
        seconds_since_contact=since,
        etcd_endpoints=list(coordinator.config.etcd_endpoints),
    )
