"""What coordinating gateways write in etcd, and what they make of it: pure.

The keys of one cluster, under `/rsgw/<cluster>/`:

- `placer`: the elected placer's member name, created once by a transaction, under
  the placer's lease (it goes when the placer does).
- `placement`: a `PlacementRecord` (JSON), written by the placer after each repack and
  only while `placer` names it; no lease, so it outlives the placer.
- `members/<name>`: each gateway's address, under its own lease.
- `demand/<name>`: each gateway's arrivals per model since it started (JSON), written
  about once a second by every gateway but the placer, under its own lease.
- `changes/<name>-<n>`: an operator's scheduling change made on gateway `name`
  (`ChangeRecord`), for every gateway to apply in order; no lease.
- `repacks/<name>-<n>`: an operator's repack asked of gateway `name`, under its lease.
- `loads/<model>`: a cold model a follower's call asked for (issue 49), under the
  asker's lease: the placer loads it.

The placement's epoch is its key's etcd revision: every gateway reads the same number
for the same placement, and a later placement always has a larger one.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from rsgw.scheduling.placement._placement import Placement

#: How the coordination of one gateway stands, as `rsgw ctl status` and the metrics say.
OFF = "off"  # no etcd configured
PLACER = "placer"
FOLLOWER = "follower"
DISCONNECTED = "disconnected"  # etcd unreachable: routing on the last placement


class RecordError(ValueError):
    """A value in etcd that is not what a gateway writes there."""


@dataclass(frozen=True, slots=True)
class Keys:
    """The etcd keys of one cluster's coordination (see the module docstring)."""

    cluster: str

    @property
    def root(self) -> bytes:
        return f"/rsgw/{self.cluster}/".encode()

    @property
    def placer(self) -> bytes:
        return self.root + b"placer"

    @property
    def placement(self) -> bytes:
        return self.root + b"placement"

    @property
    def members(self) -> bytes:
        return self.root + b"members/"

    @property
    def demand(self) -> bytes:
        return self.root + b"demand/"

    @property
    def changes(self) -> bytes:
        return self.root + b"changes/"

    @property
    def repacks(self) -> bytes:
        return self.root + b"repacks/"

    @property
    def loads(self) -> bytes:
        return self.root + b"loads/"

    def member(self, name: str) -> bytes:
        return self.members + name.encode()

    def demand_of(self, name: str) -> bytes:
        return self.demand + name.encode()

    @staticmethod
    def name_in(key: bytes, prefix: bytes) -> str:
        """The member name a key under `prefix` is for."""
        return key[len(prefix) :].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    """One published placement: who placed it, and model -> replicas and weights."""

    placer: str
    assignment: Mapping[str, Placement]
    #: The repack's trigger (startup, compute, operator).
    trigger: str = ""

    def encode(self) -> bytes:
        return json.dumps(
            {
                "placer": self.placer,
                "trigger": self.trigger,
                "assignment": {
                    model: [[url, weight] for url, weight in placement]
                    for model, placement in sorted(self.assignment.items())
                },
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, value: bytes) -> PlacementRecord:
        """Raises RecordError: not a placement a gateway wrote."""
        try:
            data = json.loads(value)
            assignment = {
                str(model): Placement(tuple((str(url), float(weight)) for url, weight in pairs))
                for model, pairs in data["assignment"].items()
            }
            return cls(str(data["placer"]), MappingProxyType(assignment), str(data["trigger"]))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise RecordError(f"not a placement record: {exc}") from exc


def encode_demand(totals: Mapping[str, int]) -> bytes:
    return json.dumps(dict(sorted(totals.items())), separators=(",", ":")).encode()


def decode_demand(value: bytes) -> dict[str, int]:
    """Raises RecordError: not a demand record."""
    try:
        data = json.loads(value)
        return {str(model): int(count) for model, count in data.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise RecordError(f"not a demand record: {exc}") from exc


@dataclass(slots=True)
class DemandFold:
    """The placer's view of the other gateways' demand: what each has reported so far,
    so that each fold adds only what is new.

    `begin` takes the reports there are when this gateway becomes the placer: what they
    hold already went to the placer before (or nowhere), so only what they add counts.
    A gateway that reports for the first time later is new: all of it counts. One
    whose totals went back (it restarted) counts from its new totals.
    """

    _seen: dict[str, dict[str, int]] = field(default_factory=dict)

    def begin(self, reports: Mapping[str, Mapping[str, int]]) -> None:
        self._seen = {member: dict(totals) for member, totals in reports.items()}

    def fold(self, reports: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
        """model -> arrivals reported since the last fold, over every gateway in `reports`."""
        new: dict[str, int] = {}
        for member, totals in reports.items():
            before = self._seen.get(member, {})
            self._seen[member] = dict(totals)
            for model, total in totals.items():
                delta = total - before.get(model, 0)
                if delta < 0:  # it restarted: its totals start again
                    delta = total
                if delta > 0:
                    new[model] = new.get(model, 0) + delta
        for gone in set(self._seen) - set(reports):
            del self._seen[gone]
        return new


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """An operator's scheduling change made on one gateway, for the others to apply."""

    origin: str
    #: The control method's name: "SetSchedulingPolicy" or "SetModelPlacement".
    method: str
    request: bytes

    def encode(self) -> bytes:
        return json.dumps(
            {
                "origin": self.origin,
                "method": self.method,
                "request": base64.b64encode(self.request).decode("ascii"),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, value: bytes) -> ChangeRecord:
        """Raises RecordError: not a change record."""
        try:
            data = json.loads(value)
            return cls(
                str(data["origin"]),
                str(data["method"]),
                base64.b64decode(data["request"], validate=True),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordError(f"not a change record: {exc}") from exc


@dataclass(frozen=True, slots=True)
class CoordinationView:
    """How this gateway's coordination stands now (swapped whole on every change)."""

    state: str = OFF
    member: str = ""
    placer: str = ""
    epoch: int = 0
    members: tuple[str, ...] = ()
    #: When etcd last answered (the Trio clock), and the last failure's words.
    last_contact: float = 0.0
    last_error: str = ""
