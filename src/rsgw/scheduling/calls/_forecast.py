"""Will a call finish in time? Deadline-aware admission's forecast and rule.

Pure: no trio, no clock of its own. The gateway (`rsgw.gateway.calls._infer`,
`rsgw.gateway.calls._admission`) and `rsgw simulate` ask the same questions of it, so the
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
and when each was sent and answered. From those, `Forecast` keeps each worker's
seconds per answered call while it was busy (time it held at least one call,
divided by the calls it answered, both decayed with a half-life of
`FORECAST_HALFLIFE`): the inverse of the rate it drains its queue at, batching and
weight loads included. A call that arrives to find `n` calls held there waits about
`n x seconds per call`, and takes one more. A call to a worker that holds nothing is
never refused: it waits for nobody, and its answer is what brings a forecast that
went up (a weight load, a stall) back down. That is the time to drain everything
the worker holds; a call may do better (a batching worker runs it with the calls of
its model ahead of it, an EDF worker runs it before later deadlines) or worse. So
each answer also compares the call's latency with what `position x seconds per call`
(its place when sent) foretold, and the ratio, smoothed and held to [1/10, 10],
scales the forecast: the forecast corrects its own bias at each worker. A worker not
measured yet costs nothing: the first calls are admitted and measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Seconds after which a worker's past busy time and answers count half.
FORECAST_HALFLIFE = 0.5
#: Answers closer together than this (a busy worker's) are counted, and folded into
#: the forecast at the next one that is not: the request path pays a counter.
FOLD_SECONDS = 0.005
#: Weight of the newest answer in a worker's bias correction (an EMA), and its bounds.
BIAS_ALPHA = 0.05
BIAS_BOUNDS = (0.1, 10.0)
#: How long an admitted call holds its inbound slot, before any is measured, and the
#: weight of the newest in its average (an EMA): the slot queue's forecast.
INITIAL_SLOT_SECONDS = 0.01
SLOT_ALPHA = 0.05
#: Admitted calls must be predicted to finish this long before their deadline
#: (the forecast's error, and the answer's way back).
DEADLINE_MARGIN = 0.25

#: The wait admitted is held this far under `max_queue_seconds`, so that with the
#: forecast's error the answered calls' waits stay within it.
QUEUE_TARGET = 0.95

QUEUE = "queue"
DEADLINE = "deadline"


class _Worker:
    __slots__ = ("answered", "bias", "busy", "busy_since", "last", "unfolded")

    def __init__(self, now: float) -> None:
        self.busy = 0.0  # seconds busy, decayed
        self.answered = 0.0  # calls answered, decayed
        self.busy_since = now  # when it last went from idle to busy
        self.last = now  # its last answer folded in
        self.bias = 1.0  # latency / forecast, smoothed
        self.unfolded = 0  # answers since `last`, not folded in yet


class Forecast:
    """Seconds per call, per worker (see the module docstring).

    `estimates` is read on the request path: a dict lookup, no call.
    """

    __slots__ = ("_reset", "_workers", "estimates")

    def __init__(self) -> None:
        self._workers: dict[str, _Worker] = {}
        #: url -> when it was last reset: answers to calls sent before are not counted.
        self._reset: dict[str, float] = {}
        #: Each measured worker's seconds per call ahead, bias included.
        self.estimates: dict[str, float] = {}

    def busy_from(self, url: str, now: float) -> None:
        """An idle worker was sent a call at `now` (the gateway calls this only when the
        call is the only one it holds there): its busy time starts."""
        worker = self._workers.get(url)
        if worker is None:
            self._workers[url] = _Worker(now)
        else:
            worker.busy_since = now

    def answered(self, url: str, now: float, held: int, latency: float, position: int) -> None:
        """A call at `url` was answered at `now`, `latency` seconds after it was sent as
        the `position`-th call held there; `held` still counts it."""
        worker = self._workers.get(url)
        if worker is None:
            if self._reset and now - latency < self._reset.get(url, -math.inf):
                return  # sent before a reset: it waited behind the load
            self._reset.pop(url, None)
            worker = self._workers[url] = _Worker(now - latency)
        elif now - worker.last < FOLD_SECONDS and held > 1:
            worker.unfolded += 1  # folded in with the next answer that is not this close
            return
        raw = worker.busy / worker.answered if worker.answered else 0.0
        last = worker.last
        decay = 0.5 ** ((now - last) / FORECAST_HALFLIFE)
        bias = 1.0 + (worker.bias - 1.0) * decay  # forgotten as the rest is
        if raw > 0.0 and position > 0:
            ratio = latency / (position * raw)
            ratio = BIAS_BOUNDS[0] if ratio < BIAS_BOUNDS[0] else min(ratio, BIAS_BOUNDS[1])
            bias += BIAS_ALPHA * (ratio - bias)
        worker.bias = bias
        since = worker.busy_since if worker.busy_since > last else last
        worker.busy = worker.busy * decay + (now - since if now > since else 0.0)
        worker.answered = worker.answered * decay + 1.0 + worker.unfolded
        worker.unfolded = 0
        worker.last = now
        if held <= 1:  # it is idle now, until the next call is sent
            worker.busy_since = now
        self.estimates[url] = worker.busy / worker.answered * worker.bias

    def per_call(self, url: str) -> float:
        """Seconds each call held at `url` costs a newcomer (0.0 until measured)."""
        return self.estimates.get(url, 0.0)

    def typical(self) -> float:
        """The workers' seconds per call, averaged (0.0 before any is measured): what a
        call not yet routed will pay."""
        values = self.estimates.values()
        return sum(values) / len(values) if values else 0.0

    def forget(self, url: str) -> None:
        """`url` left the fleet (a worker that returns is measured afresh)."""
        self._workers.pop(url, None)
        self.estimates.pop(url, None)
        self._reset.pop(url, None)

    def reset(self, url: str, now: float) -> None:
        """Measure `url` afresh from now: the gateway is loading a model there (issue
        49), and the calls that wait behind that load say nothing about how fast it
        drains its queue once the load is done. Until its next answers, it is not
        measured, so no call to it is refused for its queue."""
        self._workers.pop(url, None)
        self.estimates.pop(url, None)
        self._reset[url] = now


def wait_for_slot(waiting: int, cap: int, slot_seconds: float, per_call: float) -> float:
    """The wait of a call that finds the inbound cap full, until its worker starts it:
    a slot frees every `slot_seconds / cap` and the `waiting` calls go first; then, of
    the `slot_seconds` a call holds its slot, all but its own service (`per_call`) is
    waiting at the worker."""
    return (waiting + 1) * slot_seconds / cap + max(0.0, slot_seconds - per_call)


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

    @property
    def queue_limit(self) -> float:
        """The longest wait admitted (inf: no limit)."""
        return self.max_queue_seconds * QUEUE_TARGET if self.max_queue_seconds else math.inf

    def judge(self, wait: float, service: float, left: float) -> Verdict | None:
        """None to admit a call predicted to wait `wait` seconds and then take `service`,
        with `left` seconds to its deadline (inf: none); else why not."""
        limit = self.max_queue_seconds
        if wait > self.queue_limit:
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
