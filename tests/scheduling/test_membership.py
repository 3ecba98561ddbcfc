"""The membership core (`rsgw.scheduling.fleet._membership`): sources, ordinals, names."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw.scheduling.fleet._membership import DnsTarget, Membership, MembershipError

ADDRESSES = [f"10.0.0.{i}:8001" for i in range(1, 9)]


def test_sources_own_their_addresses() -> None:
    start, change = Membership().apply("config", ADDRESSES[:2])
    assert [m.public_name for m in change.added] == ["worker0", "worker1"]
    assert [m.label for m in change.added] == ADDRESSES[:2] and not change.removed
    dns = DnsTarget.parse("dns:///workers.ns.svc:8001")
    assert dns is not None and dns.source == "dns:workers.ns.svc:8001"
    both, change = start.apply(dns.source, dns.addresses(["10.0.0.2", "10.0.0.3"]))
    # 10.0.0.2 is the config's: the DNS source adds only 10.0.0.3.
    assert [m.url for m in change.added] == ["10.0.0.3:8001"]
    assert both.members["10.0.0.2:8001"].source == "config"
    # The config drops 10.0.0.1; the DNS answer changes; ordinals are never reused.
    later, change = both.apply("config", ADDRESSES[1:2])
    assert [m.url for m in change.removed] == ["10.0.0.1:8001"]
    last, change = later.apply(dns.source, dns.addresses(["10.0.0.4", "fd00::5"]))
    assert {m.url for m in change.removed} == {"10.0.0.3:8001"}
    assert {m.url: m.public_name for m in change.added} == {
        "10.0.0.4:8001": "worker3",
        "[fd00::5]:8001": "worker4",
    }
    assert last.members["10.0.0.2:8001"].public_name == "worker1"  # kept throughout


def test_the_operator_adds_and_removes() -> None:
    fleet, _ = Membership().apply("config", ADDRESSES[:2], {ADDRESSES[0]: "gpu-a"})
    fleet, added = fleet.add("10.0.0.9:8001", "gpu-z")
    assert added.label == added.public_name == "gpu-z" and added.source == "operator"
    with pytest.raises(MembershipError, match="already a worker"):
        fleet.add(ADDRESSES[0])
    with pytest.raises(MembershipError, match="'gpu-a' would name both"):
        fleet.add("10.0.0.10:8001", "gpu-a")
    fleet, gone = fleet.remove("gpu-a")  # by name, or by address
    assert gone.url == ADDRESSES[0] and fleet.urls == (ADDRESSES[1], "10.0.0.9:8001")
    fleet, _ = fleet.remove("10.0.0.9:8001")
    with pytest.raises(MembershipError, match="last worker"):
        fleet.remove(ADDRESSES[1])
    with pytest.raises(MembershipError, match="no worker is called"):
        fleet.remove("gpu-q")


def test_bad_dns_targets() -> None:
    assert DnsTarget.parse("10.0.0.1:8001") is None
    for bad in ("dns:///:8001", "dns:///name", "dns:///name:0", "dns:///name:99999"):
        with pytest.raises(MembershipError, match="not dns:///NAME:PORT"):
            DnsTarget.parse(bad)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["config", "dns:a", "dns:b"]), st.sets(st.sampled_from(ADDRESSES))
        ),
        max_size=12,
    )
)
@settings(max_examples=300, deadline=None)
def test_updates_keep_the_invariants(updates: list[tuple[str, set[str]]]) -> None:
    fleet = Membership()
    labels_seen: dict[str, str] = {}
    for source, urls in updates:
        try:
            after, change = fleet.apply(source, sorted(urls))
        except MembershipError:
            continue  # nothing would be left: the fleet is unchanged
        # What the source names is in; what it dropped is out; others' are untouched.
        assert set(urls) <= set(after.members)
        assert all(after.members[u] == m for u, m in fleet.members.items() if m.source != source)
        assert {m.url for m in change.removed}.isdisjoint(after.members)
        for member in after.members.values():  # a public name never changes hands
            assert labels_seen.setdefault(member.public_name, member.url) == member.url
        assert len({m.ordinal for m in after.members.values()}) == len(after.members)
        fleet = after
