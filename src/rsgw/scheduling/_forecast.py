"""Will a call finish in time? Deadline-aware admission's forecast and rule.

Pure: no trio, no clock of its own. The gateway (`rsgw.gateway._infer`,
`rsgw.gateway._admission`) and `rsgw simulate` ask the same questions of it, so the
simulator's predictions refuse what the gateway refuses.

Queueing a call that cannot finish before its deadline helps nobody: it waits its
whole deadline, then fails, and holds a place that a call that could have made it
needed. Under a sustained overload of the devices (not of the gateway's CPU) that is
almost every call (Clockwork, OSDI '20: admit only what can finish in time). So at
arrival the gateway predicts when the call would finish and refuses at once
(RESOURCE_EXHAUSTED, which a client may retry elsewhere) what would not finish
before its deadline, or would wait longer than `grpc.max_queue_seconds` for its
worker to start it.

What the gateway knows, per worker, is how many calls it holds there (the ledger)
and how long calls took there (each answered call: its latency, and its position,
the number of calls the worker held when it was sent, itself included). A worker
that batches serves a deep queue faster per call than a shallow one; the ratio
latency / position, smoothed, is the seconds each call ahead costs at the depth the
worker runs at now, so `calls ahead x seconds per call` is the wait, and one more
`seconds per call` the service. A worker not measured yet costs nothing: the first
calls are admitted and measured.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Weight of the newest answered call in a worker's seconds per call (an EMA).
FORECAST_ALPHA = 0.1
#: Admitted calls must be predicted to finish this long before their deadline
#: (the forecast's error, and the answer's way back).
DEADLINE_MARGIN = 0.25

QUEUE = "queue"
DEADLINE = "deadline"


class Forecast:
    """Seconds per call ahead, per worker (see the module docstring)."""

    __slots__ = ("_per_call",)

    def __init__(self) -> None:
        self._per_call: dict[str, float] = {}

    def record(self, url: str, seconds: float, position: int) -> None:
        """A call sent to `url` as its `position`-th held call was answered in `seconds`."""
        sample = seconds / max(1, position)
        known = self._per_call.get(url)
        self._per_call[url] = sample if known is None else known + FORECAST_ALPHA * (sample - known)

    def per_call(self, url: str) -> float:
        """Seconds each call held at `url` costs a newcomer (0.0 until measured)."""
        return self._per_call.get(url, 0.0)

    def typical(self) -> float:
        """The workers' seconds per call, averaged (0.0 before any is measured): what a
        call not yet routed will pay."""
        values = self._per_call.values()
        return sum(values) / len(values) if values else 0.0

    def forget(self, url: str) -> None:
        """`url` left the fleet (a worker that returns is measured afresh)."""
        self._per_call.pop(url, None)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a call is refused: `reason` (QUEUE or DEADLINE) and the prediction."""

    reason: str
    wait: float
    finish_in: float
    budget: float


@dataclass(frozen=True, slots=True)
class AdmissionRule:
    """`grpc.max_queue_seconds` (0: no limit but the deadline) and the deadline margin."""

    max_queue_seconds: float
    margin: float = DEADLINE_MARGIN

    def judge(self, wait: float, service: float, left: float) -> Verdict | None:
        """None to admit a call predicted to wait `wait` seconds and then take `service`,
        with `left` seconds to its deadline (inf: none); else why not."""
        limit = self.max_queue_seconds
        if limit and wait > limit:
            return Verdict(QUEUE, wait, wait + service, limit)
        if wait + service + self.margin > left:
            return Verdict(DEADLINE, wait, wait + service, left)
        return None


def describe(verdict: Verdict, model: str, where: str) -> str:
    """The refusal's message: what was predicted, against which limit. `model` may be
    "" (refused before the request was read)."""
    subject = f"model '{model}'" if model else "call"
    if verdict.reason == QUEUE:
        return (
            f"{subject} not admitted: it would wait about {verdict.wait:.2f} s {where}, "
            f"over grpc.max_queue_seconds ({verdict.budget:g} s); retry later or elsewhere"
        )
    return (
        f"{subject} not admitted: it would finish in about {verdict.finish_in:.2f} s "
        f"({verdict.wait:.2f} s waiting {where}), after its deadline "
        f"({max(0.0, verdict.budget):.2f} s left); retry later or elsewhere"
    )
