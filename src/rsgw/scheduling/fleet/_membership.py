"""Who the gateway's workers are: an immutable membership, and the changes between two.

Pure: no trio, no sockets, no clock. The gateway's worker list comes from three places
that change at run time (issue 24): gateway.yml's `endpoints` (re-read on SIGHUP), the
operator's AddWorker / RemoveWorker, and DNS names (`dns:///NAME:PORT`) resolved every
probe round. Each source is a set of addresses; `Membership.apply` takes a source's new
set and returns the next membership and what changed, so the shell can connect the new
workers and drain the departed ones, and every reader sees one snapshot at a time
(swapped by reference, never edited in place).

Invariants:
- An address is a member at most once; the first source to name it owns it, and a
  source's update never removes what another source owns.
- A worker keeps its ordinal (its public name `worker<N>` when unnamed) for as long as
  it is a member; ordinals are never reused, so a public name never changes hands.
- A label (an explicit name, else the address) and a public name belong to one member,
  so two workers' metrics series never merge.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

DNS_SCHEME = "dns:///"
_HOST_PORT = re.compile(r"(?P<host>.+):(?P<port>[0-9]{1,5})")


class MembershipError(ValueError):
    """A change that cannot be applied: names the address or the name at fault."""


@dataclass(frozen=True, slots=True)
class DnsTarget:
    """`dns:///NAME:PORT`: every address NAME resolves to, on PORT."""

    name: str
    port: int

    @classmethod
    def parse(cls, text: str) -> DnsTarget | None:
        """The DNS target `text` names; None when it is not a `dns:///` target.

        Raises:
            MembershipError: a `dns:///` target without a name or a valid port.
        """
        if not text.startswith(DNS_SCHEME):
            return None
        match = _HOST_PORT.fullmatch(text[len(DNS_SCHEME) :])
        if match is None or not 1 <= int(match["port"]) <= 65535:
            raise MembershipError(f"'{text}' is not dns:///NAME:PORT")
        return cls(match["host"], int(match["port"]))

    @property
    def source(self) -> str:
        """The membership source its addresses belong to."""
        return f"dns:{self.name}:{self.port}"

    def addresses(self, resolved: Iterable[str]) -> tuple[str, ...]:
        """The worker addresses for resolved IPs (IPv6 in brackets), on its port, sorted
        and distinct: the same answer in any order gives the same members."""
        return tuple(
            sorted({f"[{ip}]:{self.port}" if ":" in ip else f"{ip}:{self.port}" for ip in resolved})
        )


@dataclass(frozen=True, slots=True)
class Member:
    """One worker: its address, who added it, its ordinal, and an explicit name."""

    url: str
    source: str  # "config", "operator", or a DnsTarget's source
    ordinal: int
    name: str = ""

    @property
    def label(self) -> str:
        """Its metrics and log label: the explicit name, else its address (as the
        gateway labels an unnamed worker)."""
        return self.name or self.url

    @property
    def public_name(self) -> str:
        """How client-facing messages name it, never by address: the explicit name,
        else `worker<ordinal>` (an ordinal is never reused, so neither is the name)."""
        return self.name or f"worker{self.ordinal}"


@dataclass(frozen=True, slots=True)
class Change:
    """What one update did: the members that joined and those that left."""

    added: tuple[Member, ...] = ()
    removed: tuple[Member, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


@dataclass(frozen=True, slots=True)
class Membership:
    """The workers at one moment, in the order they joined."""

    members: Mapping[str, Member] = field(default_factory=lambda: MappingProxyType({}))
    next_ordinal: int = 0

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(self.members)

    def owned_by(self, source: str) -> frozenset[str]:
        return frozenset(u for u, m in self.members.items() if m.source == source)

    def apply(
        self,
        source: str,
        urls: Iterable[str],
        names: Mapping[str, str] | None = None,
    ) -> tuple[Membership, Change]:
        """`source` now names exactly `urls` (with optional explicit `names`).

        Addresses another source owns are left to it; the source's addresses that are
        gone leave. Raises MembershipError, changing nothing, when a name would be
        taken twice.
        """
        names = names or {}
        wanted = list(dict.fromkeys(urls))
        kept = {u: m for u, m in self.members.items() if m.source != source or u in wanted}
        removed = tuple(m for u, m in self.members.items() if u not in kept)
        ordinal = self.next_ordinal
        added = []
        for url in wanted:
            if url in kept:
                continue
            member = Member(url, source, ordinal, names.get(url, ""))
            ordinal += 1
            kept[url] = member
            added.append(member)
        for url, name in names.items():  # a renamed existing member takes its new name
            if url in kept and kept[url].source == source and kept[url].name != name:
                kept[url] = replace(kept[url], name=name)
        labels: dict[str, str] = {}
        for member in kept.values():
            for label in {member.label, member.public_name}:
                other = labels.setdefault(label, member.url)
                if other != member.url:
                    raise MembershipError(
                        f"worker name '{label}' would name both {other} and {member.url}"
                    )
        if not kept:
            raise MembershipError("the change would leave the gateway without workers")
        return (
            Membership(MappingProxyType(kept), ordinal),
            Change(tuple(added), removed),
        )

    def add(self, url: str, name: str = "") -> tuple[Membership, Member]:
        """The operator adds `url` (AddWorker).

        Raises:
            MembershipError: `url` is a member already, or `name` is taken.
        """
        if url in self.members:
            raise MembershipError(f"{url} is already a worker ({self.members[url].public_name})")
        current = sorted(self.owned_by("operator"))
        after, change = self.apply("operator", [*current, url], {url: name} if name else None)
        (member,) = change.added
        return after, member

    def find(self, key: str) -> Member:
        """The member with address or label `key` (RemoveWorker takes either).

        Raises:
            MembershipError: no member is called that.
        """
        if key in self.members:
            return self.members[key]
        for member in self.members.values():
            if key in (member.label, member.public_name):
                return member
        raise MembershipError(f"no worker is called '{key}'")

    def remove(self, key: str) -> tuple[Membership, Member]:
        """Any source's member `key` leaves (RemoveWorker: the operator decides).

        Raises:
            MembershipError: no such member, or it is the last one.
        """
        member = self.find(key)
        rest = {u: m for u, m in self.members.items() if u != member.url}
        if not rest:
            raise MembershipError(f"{member.public_name} is the last worker; it cannot leave")
        return Membership(MappingProxyType(rest), self.next_ordinal), member
