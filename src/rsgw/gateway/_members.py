"""Workers that join and leave a running gateway (issue 24).

Who the workers are is one immutable `Membership` (`rsgw.scheduling.fleet._membership`) over
three sources: gateway.yml's `endpoints` (the `config` source, re-read on SIGHUP), the
operator (AddWorker / RemoveWorker) and each `dns:///NAME:PORT` target (`Discovery`).
`Members` is its shell: every change goes through the membership first (all or
nothing), then the gateway follows it.

A worker that joins gets a channel (which registers the gateway's shared-memory
regions when it connects) and is probed at once, so round_robin and
least_outstanding route to it as soon as it reports ready; under lpt_packing it joins
the placement at a repack asked for once it is ready. A worker that leaves takes no
new call at once (out of the pool's members and the routing table), keeps its calls
in flight for the drain, has the gateway's regions unregistered, and then its channel
closes and its series leave /metrics. The inbound cap follows the number of workers.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable, Mapping

import trio

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import ConfigError
from rsgw.base._status import StatusCode
from rsgw.config._config import GatewayConfig
from rsgw.config._endpoints import check_target
from rsgw.gateway.calls._admission import intake_limit
from rsgw.gateway.calls._service import GatewayService
from rsgw.gateway.placement._packing import Packing
from rsgw.grpc._intake import Intake
from rsgw.scheduling.calls._reported import CounterSource
from rsgw.scheduling.fleet._capabilities import CapabilityTable
from rsgw.scheduling.fleet._membership import Change, Member, Membership, MembershipError
from rsgw.scheduling.fleet._stalls import StallWatch

logger = logging.getLogger(__name__)

#: Workers at most: each is a channel, probes and series; more is a mistake or an attack.
MAX_WORKERS = 1024
#: An operator-given name is a metrics label and a log field: short and printable.
MAX_NAME_LENGTH = 128
#: How often a worker being removed is checked for calls still running on it.
DRAIN_POLL_SECONDS = 0.05
#: How long unregistering the gateway's regions on a departing worker may take.
UNWIND_SECONDS = 5.0
CONFIG = "config"
OPERATOR = "operator"


class MembershipRefused(ConfigError):
    """A membership change that cannot be made; `status` is its gRPC answer."""

    def __init__(self, status: StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status


class Members:
    """Adds and removes the gateway's workers at run time (see the module docstring).

    gateway.yml's fixed workers join at once. What follows the workers is given here:
    the call path (`service`: pool, prober, admission), the repack loop (`packing`,
    under lpt_packing), the stall watch (`stalls`), and the listener's running-call
    cap (`intake`, built before the listener, which takes it). Departing workers
    drain in `nursery`.
    """

    def __init__(
        self,
        config: GatewayConfig,
        service: GatewayService,
        nursery: trio.Nursery,
        *,
        packing: Packing | None = None,
        stalls: StallWatch | None = None,
        intake: Intake | None = None,
    ) -> None:
        self._config = config
        self._nursery = nursery
        self._service = service
        self._packing = packing
        self._stalls = stalls
        self._intake = intake
        self._per_worker_cap = config.grpc.max_concurrent_requests_per_worker
        self.membership = Membership()
        #: The gateway's own gRPC port once it listens: a worker there would be itself.
        #: A fact learned when the listener binds, not a part: set then.
        self.own_port: int | None = None
        urls, names, metrics = config_workers(config)
        if urls:  # none when every endpoint is a dns:/// target
            self.sync(CONFIG, urls, names, metrics)

    @property
    def count(self) -> int:
        """The workers now (a removed one is gone once its removal starts)."""
        return len(self.membership.members)

    @property
    def inbound_cap(self) -> int:
        """Calls admitted at once: the per-worker cap times the workers (0 = uncapped)."""
        return self._per_worker_cap * self.count

    def status(
        self,
        ready: frozenset[str],
        capabilities: CapabilityTable,
        counter_sources: Mapping[str, CounterSource] | None = None,
    ) -> list[cpb.Member]:
        """The members for GetSchedulingStatus, in the order they joined."""
        sources = counter_sources or {}
        held = self._service.ledger.held
        return [
            cpb.Member(
                worker=m.label,
                address=m.url,
                public_name=m.public_name,
                source=m.source,
                ready=m.url in ready,
                inflight=held(m.url),
                capabilities=capabilities.of(m.url).names(),
                counters=str(sources.get(m.url, "")),
            )
            for m in self.membership.members.values()
        ]

    # -- the operator -------------------------------------------------------------------

    def add(self, url: str, name: str = "", metrics: str = "") -> str:
        """`url` joins the workers now: probed at once, routed to once it is ready.

        Returns its label.

        Raises:
            ConfigError: `url` or `metrics` is not host:port.
            MembershipRefused: `url` is a worker already, or its name is taken
                (ALREADY_EXISTS).
        """
        url = check_target(url, "worker")
        metrics = check_target(metrics, "metrics") if metrics else ""
        _check_name(name)
        if url in self.membership.members:
            raise MembershipRefused(StatusCode.ALREADY_EXISTS, f"{url} is a worker already")
        if self.count >= MAX_WORKERS:
            raise MembershipRefused(
                StatusCode.RESOURCE_EXHAUSTED, f"the gateway has {self.count} workers, its most"
            )
        own = self.own_port
        if own is not None and is_own_address(url, self._config.listen.grpc, own):
            raise MembershipRefused(
                StatusCode.INVALID_ARGUMENT,
                f"{url} is this gateway's own address; it would send its calls to itself",
            )
        try:
            after, member = self.membership.add(url, name)
        except MembershipError as exc:
            raise MembershipRefused(StatusCode.ALREADY_EXISTS, str(exc)) from None
        self.membership = after
        self._joined((member,), {url: metrics} if metrics else {})
        return member.label

    async def remove(self, key: str, drain_seconds: float | None = None) -> int:
        """The worker `key` (its address or name) leaves; returns the calls cut short.

        No new call goes to it from now on; the calls it holds get `drain_seconds`
        (`shutdown.grace_seconds` unless given) to finish, then its channel closes and
        what is still running fails over to the other replicas where it can.

        Raises:
            MembershipRefused: as `retire`.
        """
        return await self.drain(self.retire(key), drain_seconds)

    def retire(self, key: str) -> Member:
        """The first, synchronous half of `remove`: `key` takes no new call from now on.

        Apart so that a caller can act between the membership change and the drain
        (the control plane shares the removal with other gateways only once it took).

        Raises:
            MembershipRefused: no worker is called `key` (NOT_FOUND), or it is the last
                one (FAILED_PRECONDITION).
        """
        try:
            self.membership.find(key)
        except MembershipError as exc:
            raise MembershipRefused(StatusCode.NOT_FOUND, str(exc)) from None
        try:
            after, member = self.membership.remove(key)
        except MembershipError as exc:
            raise MembershipRefused(StatusCode.FAILED_PRECONDITION, str(exc)) from None
        self.membership = after
        self._retired(member)
        return member

    # -- a source's whole list (gateway.yml on SIGHUP, a DNS answer) ------------------------

    def sync(
        self, source: str, urls: Iterable[str], names: Mapping[str, str], metrics: Mapping[str, str]
    ) -> Change:
        """`source` now names exactly `urls`: the new ones join now, the departed ones
        leave and drain in the background (`shutdown.grace_seconds`).

        Raises:
            ConfigError: the change would give two workers one name, leave none, or pass
                MAX_WORKERS; nothing changes.
        """
        try:
            after, change = self.membership.apply(source, urls, names)
        except MembershipError as exc:
            raise ConfigError(str(exc)) from None
        if len(after.members) > MAX_WORKERS:
            raise ConfigError(
                f"{source} would bring the gateway to {len(after.members)} workers; "
                f"{MAX_WORKERS} is its most"
            )
        self.membership = after
        for member in change.removed:
            self._retired(member)
            self._nursery.start_soon(self.drain, member, None)
        self._joined(change.added, metrics)
        if change:
            logger.info(
                "workers changed",
                extra={
                    "source": source,
                    "added": [m.label for m in change.added],
                    "removed": [m.label for m in change.removed],
                    "workers": self.count,
                },
            )
        return change

    def reconfigure(self, config: GatewayConfig) -> Change:
        """gateway.yml read again (SIGHUP): its fixed workers become the `config`
        source's members. Its `dns:///` targets are `Discovery.retarget`'s.

        Raises:
            ConfigError: a worker would change its name (remove it and add it under the
                new one), or the change cannot be made (see `sync`); nothing changes.
        """
        urls, names, metrics = config_workers(config)
        for url in urls:
            member = self.membership.members.get(url)
            if member is not None and member.source == CONFIG and member.name != names.get(url, ""):
                raise ConfigError(
                    f"worker {url} would be renamed from '{member.label}' to "
                    f"'{names.get(url) or url}'; remove it from endpoints, reload, then add it "
                    "back under the new name"
                )
        return self.sync(CONFIG, urls, names, metrics)

    # -- the steps ----------------------------------------------------------------------

    def _joined(self, added: Iterable[Member], metrics: Mapping[str, str]) -> None:
        """`added` are members now: connect, probe, and (lpt_packing) place them: by a
        repack once they are ready, unless the startup repack is still to come."""
        service = self._service
        for member in added:
            service.pool.add(member, metrics.get(member.url, ""))
            service.metrics.worker_joined(member.label)
            logger.info("worker added", extra={"worker": member.label, "workers": self.count})
            if self._packing is not None and self._packing.started:
                self._nursery.start_soon(self._place_when_ready, member.url)
        self._resize()
        service.prober.wake()

    def _retired(self, member: Member) -> None:
        """`member` takes no new call from now on."""
        service = self._service
        service.pool.retire(member.url)
        service.prober.forget(member.url)
        if service.infer.measured is not None:
            service.infer.measured.forget(member.url)
        if self._stalls is not None:
            self._stalls.forget(member.url)
        if self._packing is not None:
            self._packing.request_repack_now()
        self._resize()

    async def drain(self, member: Member, drain_seconds: float | None) -> int:
        """Wait for the retired `member`'s calls (bounded), unwind its regions, close its
        channel; returns the calls cut short."""
        service = self._service
        url, ledger = member.url, service.ledger
        grace = self._config.shutdown.grace_seconds if drain_seconds is None else drain_seconds
        started = trio.current_time()
        with trio.move_on_after(grace):
            # The ledger is a pure core, with no event to wait on: poll it, bounded.
            while ledger.held(url) > 0:  # noqa: ASYNC110
                await trio.sleep(DRAIN_POLL_SECONDS)
        cut = ledger.held(url)
        with trio.move_on_after(UNWIND_SECONDS):
            await service.pool.regions.unwind(member.label, service.pool.channel_of(member).unary)
        await service.pool.close(member)
        service.metrics.forget_worker(member.label)
        service.admission.forecast.forget(url)
        if self._packing is not None:
            self._packing.forget(url)
        logger.info(
            "worker removed",
            extra={
                "worker": member.label,
                "workers": self.count,
                "seconds": round(trio.current_time() - started, 3),
                "calls_cut_short": cut,
            },
        )
        return cut

    async def _place_when_ready(self, url: str) -> None:
        """lpt_packing: ask for a repack once `url` answers ready, so the placement
        takes it in (until then it serves nothing placed elsewhere)."""
        prober = self._service.prober
        while url in self._service.pool.urls:
            if url in prober.ready:
                assert self._packing is not None
                self._packing.request_repack_now()
                return
            await prober.next_round()

    def _resize(self) -> None:
        """The inbound cap follows the workers (unless it is off)."""
        if not self._per_worker_cap:
            return
        cap = self.inbound_cap
        self._service.resize(cap)
        if self._intake is not None:
            self._intake.resize(intake_limit(cap))


def config_workers(
    config: GatewayConfig,
) -> tuple[tuple[str, ...], dict[str, str], dict[str, str]]:
    """gateway.yml's fixed workers (not its `dns:///` targets): addresses, explicit
    names and metrics endpoints, as `GatewayConfig.pairing()` pairs them."""
    fixed = [worker for worker in config.pairing().workers if not worker.dns]
    names = {worker.endpoint: worker.name for worker in fixed if worker.name}
    metrics = {worker.endpoint: worker.metrics for worker in fixed if worker.metrics}
    return tuple(worker.endpoint for worker in fixed), names, metrics


def _check_name(name: str) -> None:
    if len(name) > MAX_NAME_LENGTH or not all(c.isprintable() and not c.isspace() for c in name):
        raise ConfigError(
            f"worker name {name[:MAX_NAME_LENGTH]!r} must be at most {MAX_NAME_LENGTH} "
            "printable characters without spaces"
        )


def is_own_address(url: str, listen: str, port: int) -> bool:
    """Whether `url` reaches the gateway's own listener, `listen` bound on `port` (a
    literal IP or localhost; a host name is not resolved here)."""
    host, _, text = url.rpartition(":")
    if int(text) != port:
        return False
    host = host.strip("[]")
    try:
        address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
        bound = ipaddress.ip_address(listen.rpartition(":")[0].strip("[]") or "0.0.0.0")
    except ValueError:
        return False
    if not bound.is_unspecified:
        return address == bound
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(address), 0))  # succeeds only for an address of this host
        except OSError:
            return False
    return True
