"""The call state machine: the transition table, and how endings read to the caller."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._errors import GrpcError, ResponseInterrupted, WorkerUnavailable
from rsgw.base._status import StatusCode
from rsgw.grpc.protocol._calls import (
    CANCEL,
    FINISHED,
    REFUSED_STREAM,
    TRANSITIONS,
    Call,
    CallStateError,
    EndCause,
    HalfState,
    Step,
    http_status_error,
    lost,
    reset_by_peer,
)
from rsgw.grpc.protocol._framing import MessageDecoder

HALVES = ("inbound", "outbound")


def new_call() -> Call:
    return Call(1, MessageDecoder())


@pytest.mark.parametrize(
    ("steps", "state"),
    [
        ((Step.HEADERS,), HalfState.OPEN),
        ((Step.HEADERS, Step.MESSAGE, Step.MESSAGE), HalfState.OPEN),
        ((Step.HEADERS, Step.MESSAGE, Step.END), HalfState.CLOSED),
        ((Step.END,), HalfState.CLOSED),  # trailers-only, or a request with no body
        ((Step.HEADERS, Step.RESET), HalfState.RESET),
        ((Step.RESET,), HalfState.RESET),
        ((Step.HEADERS, Step.END, Step.RESET), HalfState.CLOSED),  # complete stays complete
    ],
)
def test_legal_paths(steps: tuple[Step, ...], state: HalfState) -> None:
    call = new_call()
    for step in steps:
        call.advance("inbound", step)
    assert call.inbound is state
    assert call.outbound is HalfState.IDLE


@pytest.mark.parametrize(
    "steps",
    [
        (Step.MESSAGE,),  # a message before headers
        (Step.HEADERS, Step.HEADERS),
        (Step.HEADERS, Step.END, Step.MESSAGE),  # after the end
        (Step.END, Step.HEADERS),
        (Step.RESET, Step.HEADERS),  # after a reset nothing but another reset
        (Step.RESET, Step.END),
    ],
)
def test_illegal_steps_raise_and_change_nothing(steps: tuple[Step, ...]) -> None:
    call = new_call()
    for step in steps[:-1]:
        call.advance("outbound", step)
    before = call.outbound
    with pytest.raises(CallStateError, match=steps[-1].name.lower()):
        call.advance("outbound", steps[-1])
    assert call.outbound is before


def test_every_state_and_step_is_decided() -> None:
    # Each (state, step) pair either has a row or is an error: no state is a dead end
    # for RESET, and finished states take nothing but RESET.
    for state in HalfState:
        assert (state, Step.RESET) in TRANSITIONS
        if state in FINISHED:
            assert {step for (s, step) in TRANSITIONS if s is state} == {Step.RESET}


@given(st.lists(st.tuples(st.sampled_from(HALVES), st.sampled_from(list(Step))), max_size=30))
def test_any_sequence_follows_the_table(steps: list[tuple[str, Step]]) -> None:
    call = new_call()
    for half, step in steps:
        current = getattr(call, half)
        expected = TRANSITIONS.get((current, step))
        if expected is None:
            with pytest.raises(CallStateError):
                call.advance(half, step)
            assert getattr(call, half) is current
        else:
            assert call.advance(half, step) is expected
        # Once finished, a half never carries anything again.
        if current in FINISHED:
            assert getattr(call, half) is current
    assert call.over == (call.inbound in FINISHED and call.outbound in FINISHED)


@given(st.lists(st.sampled_from(list(Step)), max_size=10))
def test_reset_always_ends_both_halves(steps: list[Step]) -> None:
    call = new_call()
    for step in steps:
        if (call.outbound, step) in TRANSITIONS:
            call.advance("outbound", step)
    call.outbox.append(b"pending")
    call.end_pending = True
    call.reset()
    assert call.over
    assert not call.sending


# -- how endings read ---------------------------------------------------------------------


def test_a_client_call_lost_before_any_response_may_go_elsewhere() -> None:
    call = new_call()
    error = lost(call, "w:1", "closed by the peer", client_side=True)
    assert type(error) is WorkerUnavailable
    assert str(error) == "connection to w:1 closed by the peer"
    call.response_started = True
    assert isinstance(lost(call, "w:1", "failed", client_side=True), ResponseInterrupted)


def test_a_server_call_lost_is_cancelled() -> None:
    error = lost(new_call(), "the client", "closed by the peer", client_side=False)
    assert isinstance(error, GrpcError)
    assert error.code is StatusCode.CANCELLED


@pytest.mark.parametrize(
    ("error_code", "cause", "kind", "code"),
    [
        (REFUSED_STREAM, EndCause.REFUSED, WorkerUnavailable, StatusCode.UNAVAILABLE),
        (CANCEL, EndCause.RESET, GrpcError, StatusCode.CANCELLED),
        (2, EndCause.RESET, WorkerUnavailable, StatusCode.UNAVAILABLE),  # INTERNAL_ERROR
        (99, EndCause.RESET, WorkerUnavailable, StatusCode.UNAVAILABLE),  # unknown code
    ],
)
def test_resets_by_the_peer(
    error_code: int, cause: EndCause, kind: type[Exception], code: StatusCode
) -> None:
    got_cause, error = reset_by_peer(new_call(), error_code, "w:1", client_side=True)
    assert got_cause is cause
    assert type(error) is kind
    assert error is not None and error.code is code


def test_a_reset_after_a_whole_answer_keeps_the_answer() -> None:
    call = new_call()
    call.status = GrpcError(StatusCode.NOT_FOUND, "no such model")
    assert reset_by_peer(call, 0, "w:1", client_side=True) == (EndCause.ANSWERED, call.status)
    ok = new_call()
    ok.answered_ok = True
    assert reset_by_peer(ok, 0, "w:1", client_side=True) == (EndCause.ANSWERED, None)


@pytest.mark.parametrize(
    ("status", "code"),
    [(b"404", StatusCode.UNIMPLEMENTED), (b"503", StatusCode.UNAVAILABLE), (b"", 2)],
)
def test_http_statuses_map_as_the_grpc_spec_says(status: bytes, code: int) -> None:
    assert http_status_error(status, "w:1").code == code
