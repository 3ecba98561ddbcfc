"""What workers implement, as routing reads it (rsgw.scheduling.fleet._capabilities)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.scheduling.fleet._capabilities import (
    NEEDS,
    Capability,
    CapabilityTable,
    WorkerCapabilities,
    learned_from,
)

A, B, C = "a:1", "b:1", "c:1"


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        (None, None),  # no answer: unreachable
        (StatusCode.UNIMPLEMENTED, False),
        (StatusCode.NOT_FOUND, True),  # it looked for the probe's model: the method is there
        (StatusCode.INVALID_ARGUMENT, True),
        (StatusCode.INTERNAL, True),  # MLServer's ModelStreamInfer with no request
        (StatusCode.UNKNOWN, True),
        (StatusCode.UNAVAILABLE, None),
        (StatusCode.DEADLINE_EXCEEDED, None),
        (StatusCode.RESOURCE_EXHAUSTED, None),
        (StatusCode.UNAUTHENTICATED, None),
    ],
)
def test_what_an_answer_says_of_its_method(code: StatusCode | None, verdict: bool | None) -> None:
    assert learned_from(code) is verdict


def test_the_core_needs_nothing_and_every_optional_method_has_its_capability() -> None:
    for method in (
        Method.SERVER_LIVE,
        Method.SERVER_READY,
        Method.SERVER_METADATA,
        Method.MODEL_READY,
        Method.MODEL_METADATA,
        Method.MODEL_INFER,
    ):
        assert method not in NEEDS
    assert set(NEEDS.values()) == set(Capability)
    assert NEEDS[Method.SHM_REGISTER] is NEEDS[Method.SHM_STATUS]


def test_a_table_offers_only_workers_that_implement_a_method() -> None:
    table = CapabilityTable().learn_all(
        A,
        {
            Capability.MODEL_CONFIG: (False, "Method not found!"),
            Capability.REPOSITORY_INDEX: (True, ""),
        },
    )
    table = table.learn(B, Capability.MODEL_CONFIG, True)
    # C never learned: counts as implemented (the call goes; the worker answers).
    assert table.able((A, B, C), Method.MODEL_CONFIG) == (B, C)
    assert table.able((A, B, C), Method.MODEL_INFER) == (A, B, C)
    assert table.can(A, Method.REPOSITORY_INDEX)
    assert not table.can(A, Method.MODEL_CONFIG)
    assert table.refusal((C, A), Method.MODEL_CONFIG) == (
        "no worker implements ModelConfig (Method not found!)"
    )
    assert table.refusal((B, C), Method.MODEL_CONFIG) == "no worker implements ModelConfig"
    assert table.of(A).names() == ("repository_index",)


def test_an_answer_that_says_nothing_keeps_what_was_known() -> None:
    table = CapabilityTable().learn(A, Capability.STATISTICS, False, "no")
    assert table.learn(A, Capability.STATISTICS, None) is table
    assert not table.can(A, Method.MODEL_STATISTICS)
    # A restarted worker that now implements it says so on its next probe.
    table = table.learn(A, Capability.STATISTICS, True)
    assert table.can(A, Method.MODEL_STATISTICS)
    assert table.without(A).of(A) == WorkerCapabilities()
    assert table.without(B) is table


verdicts = st.dictionaries(
    st.sampled_from(list(Capability)),
    st.tuples(st.sampled_from([True, False, None]), st.sampled_from(["", "no"])),
)


@given(st.lists(verdicts, max_size=6))
def test_the_last_word_on_each_capability_wins(
    probes: list[dict[Capability, tuple[bool | None, str]]],
) -> None:
    table = CapabilityTable()
    last: dict[Capability, bool] = {}
    for probe in probes:
        table = table.learn_all(A, probe)
        for capability, (verdict, _) in probe.items():
            if verdict is not None:
                last[capability] = verdict
    known = table.of(A)
    assert known.has.isdisjoint(known.lacks)
    for capability in Capability:
        assert known.implements(capability) is last.get(capability, True)
        assert (capability in known.has) is (last.get(capability) is True)
