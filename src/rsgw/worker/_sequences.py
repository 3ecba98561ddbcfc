"""Triton's sequence batcher, as the simulated worker keeps it: which sequences are live.

Pure: no clock (callers pass `now`), no I/O. A stateful model (one with a
`sequence:` block in the catalogue) serves requests that belong to a sequence,
named by Triton's correlation id (the `sequence_id` parameter, an integer or a
string) and delimited by the `sequence_start` and `sequence_end` flags. The book
decides, for each request, whether it may run and with what control values:
- a request without a correlation id (0 or "") is refused;
- the first request of a sequence must carry START; a START on a live sequence
  starts it over (Triton frees the old slot the same way);
- a sequence unused for its model's idle time is released, so its next request
  must START again;
- END releases it after this request, and the id may be used again at once.

Each live sequence keeps an accumulator, the state of models that accumulate
(Triton's dyna_sequence backend); the service sets it from what the request
computed.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsgw.base._errors import DecodeError, InvalidRequest
from rsgw.scheduling.calls._wire import peek_routing

CorrelationId = int | str


@dataclass(slots=True)
class LiveSequence:
    """One sequence in progress on one model."""

    correlation_id: CorrelationId
    last_used: float
    idle_seconds: float
    accumulator: int = 0

    def idle(self, now: float) -> bool:
        return now - self.last_used > self.idle_seconds


@dataclass(frozen=True, slots=True)
class SequenceStep:
    """What one request of a sequence runs with: its control values and the state so far."""

    start: bool
    end: bool
    correlation_id: CorrelationId
    #: The accumulator before this request (0 at START).
    accumulator: int


#: Every this many steps, sequences left idle (never ended) are swept out.
SWEEP_EVERY = 256


class SequenceBook:
    """The live sequences of every stateful model of one worker; see the module docstring.

    Sequences a client abandons without END are released when next touched or by a
    sweep every `SWEEP_EVERY` steps, so they cannot pile up.
    """

    def __init__(self) -> None:
        self._live: dict[tuple[str, CorrelationId], LiveSequence] = {}
        self._steps = 0

    def __len__(self) -> int:
        return len(self._live)

    def step(
        self,
        model: str,
        correlation_id: CorrelationId,
        *,
        start: bool,
        end: bool,
        now: float,
        idle_seconds: float,
    ) -> SequenceStep:
        """Admit one request of a sequence of `model`, or refuse it (InvalidRequest).

        A refused request changes nothing. An admitted one keeps its sequence live
        (until `finish`, which the caller runs once the request has computed).
        """
        if correlation_id == 0 or correlation_id == "":
            raise InvalidRequest(
                f"inference request to model '{model}' must specify a non-zero or non-empty "
                "correlation ID"
            )
        self._steps += 1
        if self._steps % SWEEP_EVERY == 0:
            self.sweep(now)
        key = (model, correlation_id)
        live = self._live.get(key)
        if live is not None and live.idle(now):
            del self._live[key]  # idle too long: released, as Triton's batcher does
            live = None
        if start:
            live = self._live[key] = LiveSequence(correlation_id, now, idle_seconds)
        elif live is None:
            raise InvalidRequest(
                f"inference request for sequence {correlation_id} to model '{model}' must "
                "specify the START flag on the first request of the sequence"
            )
        live.last_used = now
        return SequenceStep(start, end, correlation_id, 0 if start else live.accumulator)

    def finish(
        self, model: str, step: SequenceStep, accumulator: int | None, *, now: float
    ) -> None:
        """The request of `step` computed: keep its accumulator, or release at END."""
        key = (model, step.correlation_id)
        live = self._live.get(key)
        if live is None:
            return
        if step.end:
            del self._live[key]
            return
        live.last_used = now
        if accumulator is not None:
            live.accumulator = accumulator

    def abandon(self, model: str, step: SequenceStep) -> None:
        """The request of `step` failed: a START that never ran leaves no sequence behind."""
        if step.start:
            self._live.pop((model, step.correlation_id), None)

    def sweep(self, now: float) -> int:
        """Release every sequence idle past its model's idle time; returns how many."""
        idle = [key for key, live in self._live.items() if live.idle(now)]
        for key in idle:
            del self._live[key]
        return len(idle)

    def forget_model(self, model: str) -> int:
        """Release every sequence of `model` (it was unloaded); returns how many."""
        keys = [key for key in self._live if key[0] == model]
        for key in keys:
            del self._live[key]
        return len(keys)


def sequence_key(body: bytes) -> tuple[str, CorrelationId] | None:
    """(model, correlation id) of a streamed request that belongs to a sequence, else
    None (a request that does not parse fails on its own, when it is served)."""
    try:
        model, flags = peek_routing(body)
    except DecodeError:
        return None
    return None if flags is None else (model, flags.id)
