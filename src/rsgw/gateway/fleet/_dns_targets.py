"""`dns:///NAME:PORT` endpoints: the workers a DNS name resolves to, followed over time.

A Kubernetes headless Service answers with one address per ready pod, so a gateway
that resolves it every probe round follows the pods as they come and go, without a
restart (issue 24). Each target is its own membership source: its addresses join and
leave through `Members.sync`, and another source's workers are never touched.

A lookup that fails, or answers with no address, keeps the target's workers as they
are (a DNS hiccup must not drain a healthy fleet) and says so in the log once per
outage; a name that has never resolved holds start-up until it does, since the
gateway has nothing to serve with.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Protocol

import trio

from rsgw.base._errors import ConfigError
from rsgw.config._config import GatewayConfig
from rsgw.scheduling.fleet._membership import DnsTarget

logger = logging.getLogger(__name__)

#: Bound on one lookup: a resolver that hangs must not stall discovery.
LOOKUP_SECONDS = 5.0

Resolve = Callable[[str, int], Awaitable[Sequence[str]]]


class Membership(Protocol):
    """Where a target's answer goes: the gateway's `Members` (`rsgw.gateway._members`),
    which this module does not import: the members are the gateway's wiring, above
    the fleet's rooms."""

    @property
    def count(self) -> int: ...

    def sync(
        self, source: str, urls: Iterable[str], names: Mapping[str, str], metrics: Mapping[str, str]
    ) -> object: ...


async def resolve_addresses(name: str, port: int) -> list[str]:
    """The IP addresses `name` resolves to (trio's resolver, so a test can stub it)."""
    answers = await trio.socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return [str(sockaddr[0]) for *_, sockaddr in answers]


def dns_targets(config: GatewayConfig) -> list[tuple[DnsTarget, DnsTarget | None]]:
    """gateway.yml's `dns:///` endpoints, each with its paired metrics target (if any)."""
    return [
        (target, DnsTarget.parse(worker.metrics))  # None when it has no metrics endpoint
        for worker in config.pairing().workers
        if (target := DnsTarget.parse(worker.endpoint)) is not None
    ]


class Discovery:
    """Resolves the configured `dns:///` targets every `interval` seconds."""

    def __init__(
        self,
        targets: Sequence[tuple[DnsTarget, DnsTarget | None]],
        members: Membership,
        interval: float,
        resolve: Resolve = resolve_addresses,
    ) -> None:
        #: (the workers' target, the paired metrics target or None), in config order.
        self.targets = tuple(targets)
        self._members = members
        self._interval = interval
        self._resolve = resolve
        self._failing: set[DnsTarget] = set()
        self._wake = trio.Event()
        #: Lookup rounds completed (tests wait on it).
        self.rounds = 0

    @classmethod
    def from_config(cls, config: GatewayConfig, members: Membership) -> Discovery:
        return cls(dns_targets(config), members, config.health_interval_seconds)

    def retarget(self, config: GatewayConfig) -> None:
        """gateway.yml read again (SIGHUP): follow its `dns:///` targets from now on.

        A target no longer listed has its workers leave (drained); a new one joins at
        the next lookup, which comes at once.
        """
        targets = dns_targets(config)
        kept = {target for target, _ in targets}
        for target, _ in self.targets:
            if target not in kept:
                self._members.sync(target.source, (), {}, {})
                self._failing.discard(target)
        self.targets = tuple(targets)
        self.wake()

    def wake(self) -> None:
        """Look up now rather than at the end of the interval."""
        self._wake.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resolve until every target has answered once, report started, then keep
        resolving every interval until cancelled."""
        while not await self.run_round() and not self._members.count:
            await self._pause()
        task_status.started()
        while True:
            await self._pause()
            await self.run_round()

    async def _pause(self) -> None:
        with trio.move_on_after(self._interval):
            await self._wake.wait()
        self._wake = trio.Event()

    async def run_round(self) -> bool:
        """One lookup of every target; whether every target answered."""
        answered = True
        for target, metrics in self.targets:
            addresses = await self._lookup(target)
            if not addresses:
                answered = False
                continue
            metrics_of = {}
            if metrics is not None:
                for url in addresses:
                    host = url.rpartition(":")[0]
                    metrics_of[url] = f"{host}:{metrics.port}"
            try:
                self._members.sync(target.source, addresses, {}, metrics_of)
            except ConfigError as exc:
                logger.warning(
                    "DNS discovery: cannot apply the answer",
                    extra={"target": f"{target.name}:{target.port}", "error": str(exc)},
                )
        self.rounds += 1
        return answered

    async def _lookup(self, target: DnsTarget) -> tuple[str, ...]:
        """The target's worker addresses now; () when the lookup fails or is empty."""
        shown = f"dns:///{target.name}:{target.port}"
        try:
            with trio.fail_after(LOOKUP_SECONDS):
                addresses = target.addresses(await self._resolve(target.name, target.port))
        except (OSError, trio.TooSlowError) as exc:
            if target not in self._failing:
                self._failing.add(target)
                logger.warning(
                    "DNS discovery: lookup failed; keeping the workers it found before",
                    extra={"target": shown, "error": str(exc) or type(exc).__name__},
                )
            return ()
        if not addresses:
            if target not in self._failing:
                self._failing.add(target)
                logger.warning(
                    "DNS discovery: no address; keeping the workers it found before",
                    extra={"target": shown},
                )
            return ()
        if target in self._failing:
            self._failing.discard(target)
            logger.info("DNS discovery: answering again", extra={"target": shown})
        return addresses
