"""The upload budget (`rsgw.base._uploads`): who may keep sending a large message, pure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw.base._uploads import Share, Ticket, UploadBudget, unfinished_refusal

MIB = 1024 * 1024


class Woken:
    """A wake callback that remembers what it woke."""

    def __init__(self) -> None:
        self.tickets: list[Ticket] = []

    def __call__(self, ticket: Ticket) -> None:
        self.tickets.append(ticket)


def test_tickets_within_the_budget_are_granted_at_once() -> None:
    budget = UploadBudget(10 * MIB, MIB)
    woken = Woken()
    first = budget.request(4 * MIB, Share(64 * MIB), woken)
    second = budget.request(6 * MIB, Share(64 * MIB), woken)
    assert first is not None and first.granted and second is not None and second.granted
    assert budget.granted == 10 * MIB and budget.granted_at_once == 2 and not woken.tickets
    first.release()
    second.release()
    assert budget.granted == 0 and budget.waiting == 0


def test_a_ticket_over_the_budget_waits_and_is_woken_in_order() -> None:
    budget = UploadBudget(10 * MIB, MIB)
    woken = Woken()
    holder = budget.request(8 * MIB, Share(64 * MIB), woken)
    later = [budget.request(4 * MIB, Share(64 * MIB), woken) for _ in range(3)]
    assert holder is not None and all(t is not None and not t.granted for t in later)
    assert budget.waiting == 3 * MIB  # each holds at most a window meanwhile
    holder.release()
    assert woken.tickets == later[:2]  # 8 of 10: the third waits on
    assert budget.granted == 8 * MIB and budget.waiting == MIB
    woken.tickets[0].release()
    assert woken.tickets == later and budget.granted_after_wait == 3


def test_a_message_larger_than_the_budget_goes_alone_and_is_not_starved() -> None:
    budget = UploadBudget(10 * MIB, MIB)
    woken = Woken()
    small = budget.request(2 * MIB, Share(64 * MIB), woken)
    huge = budget.request(30 * MIB, Share(64 * MIB), woken)
    behind = budget.request(MIB, Share(64 * MIB), woken)
    assert small is not None and small.granted
    assert huge is not None and not huge.granted
    assert behind is not None and not behind.granted  # first come, first served
    small.release()
    assert woken.tickets == [huge] and budget.granted == 30 * MIB
    huge.release()
    assert woken.tickets == [huge, behind]


def test_one_connection_gets_one_large_message_at_a_time() -> None:
    budget = UploadBudget(100 * MIB, MIB)
    woken = Woken()
    share = Share(3 * MIB)
    first = budget.request(2 * MIB, share, woken)
    second = budget.request(2 * MIB, share, woken)  # 4 MiB is over the connection's 3
    other = budget.request(2 * MIB, Share(3 * MIB), woken)  # another connection: not held up
    assert first is not None and first.granted
    assert second is not None and not second.granted
    assert other is not None and other.granted
    assert share.admits(MIB) and not share.admits(2 * MIB)
    first.release()
    assert woken.tickets == [second] and share.granted == 2 * MIB


def test_waiting_past_the_budget_is_refused() -> None:
    budget = UploadBudget(2 * MIB, MIB)
    woken = Woken()
    holder = budget.request(2 * MIB, Share(64 * MIB), woken)
    waiting = [budget.request(2 * MIB, Share(64 * MIB), woken) for _ in range(2)]
    assert holder is not None and all(t is not None for t in waiting)
    assert budget.request(2 * MIB, Share(64 * MIB), woken) is None
    assert budget.refused == 1
    assert unfinished_refusal(2 * MIB, budget) == (
        "the gateway holds too many unfinished requests to take a 2097152-byte message now "
        "(2097152 of 2097152 bytes granted, 2 messages waiting (2097152 bytes)); retry later"
    )


def test_a_released_waiting_ticket_leaves_the_queue() -> None:
    budget = UploadBudget(2 * MIB, MIB)
    woken = Woken()
    holder = budget.request(2 * MIB, Share(64 * MIB), woken)
    gone = budget.request(MIB, Share(64 * MIB), woken)
    assert holder is not None and gone is not None
    gone.release()
    gone.release()  # twice is harmless (a call ends after its message did)
    assert budget.waiting == 0 and budget.waiting_tickets == 0
    holder.release()
    assert not woken.tickets


def test_a_ticket_behind_one_its_connection_holds_back_is_granted_at_once() -> None:
    budget = UploadBudget(100 * MIB, MIB)
    woken = Woken()
    share = Share(MIB)
    budget.request(2 * MIB, share, woken)
    held_back = budget.request(2 * MIB, share, woken)
    assert held_back is not None and not held_back.granted
    fresh = budget.request(2 * MIB, Share(MIB), woken)
    assert fresh is not None and fresh.granted and not woken.tickets


# -- properties -----------------------------------------------------------------------------

_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.integers(0, 3), st.integers(1, 24)),
        st.tuples(st.just("release"), st.integers(0, 40), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps=_STEPS, limit=st.integers(4, 16), share_limit=st.integers(1, 16))
def test_the_budget_keeps_its_bounds_and_every_ticket_is_granted_in_the_end(
    steps: list[tuple[str, int, int]], limit: int, share_limit: int
) -> None:
    """Whatever the order of asks and releases: granted bytes within the budget (or one
    ticket alone), each connection within its share (or one ticket), waiting bytes within
    the budget, the books add up; and releasing what is granted grants everything."""
    budget = UploadBudget(limit, 2)
    shares = [Share(share_limit) for _ in range(4)]
    woken = Woken()
    live: list[Ticket] = []
    for kind, which, size in steps:
        if kind == "ask":
            ticket = budget.request(size, shares[which], woken)
            if ticket is not None:
                live.append(ticket)
        elif live:
            live.pop(which % len(live)).release()
        granted = [t for t in live if t.granted]
        assert budget.granted == sum(t.size for t in granted)
        assert budget.granted <= limit or len(granted) == 1
        assert budget.waiting == sum(t.waiting_bytes for t in live if not t.granted) <= limit
        for share in shares:
            mine = [t for t in granted if t.share is share]
            assert share.granted == sum(t.size for t in mine)
            assert share.granted <= share.limit or len(mine) == 1
    assert all(t.granted for t in woken.tickets)
    while live:  # the uploads that were granted finish: the others' turns come
        granted = [t for t in live if t.granted]
        assert granted, "tickets wait with nothing granted: nobody would ever wake them"
        for ticket in granted:
            ticket.release()
            live.remove(ticket)
    assert budget.granted == budget.waiting == 0
