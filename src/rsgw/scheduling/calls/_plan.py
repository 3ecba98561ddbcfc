"""One call's route through the replicas: which to try next, and what each failure means.

Pure, in the shape of httpcore's connection pool: the bookkeeping is synchronous
and tells the shell what to do; the shell does the I/O and reports back. The
gateway's request path asks `RouteWalk.next` for a replica, sends, and on a
failure asks `RouteWalk.failed` whether to answer now or go on.

The failover rule (docs/product.md §3.5): move on only where the request
certainly did not run: the worker said NOT_FOUND, UNAVAILABLE or
RESOURCE_EXHAUSTED (its own admission shed), or the connection was refused or
lost before any response. Any other status reaches the client with its own code
and the worker's message, from exactly one worker.

Where the walk goes: first the scheduler's order (its choice first). Replicas it
did not choose (discovered, but outside lpt_packing's placement, say) are a last
resort after a replica failed, never after a worker's own admission shed: a busy
replica must not drag its model's weights onto another GPU. A replica that holds
its share of calls is passed over; if that leaves nothing to try, the call is shed.
"""

from __future__ import annotations

from collections.abc import Callable

from rsgw.base._errors import GrpcError, ResponseInterrupted, RsgwError, WorkerUnavailable, shown
from rsgw.base._status import StatusCode

#: Worker statuses after which the request certainly did not run, so another replica may.
FAILOVER_CODES = frozenset(
    {StatusCode.NOT_FOUND, StatusCode.UNAVAILABLE, StatusCode.RESOURCE_EXHAUSTED}
)
#: Failures after which the call stays on the scheduler's replicas: a worker's own
#: admission shed means it is busy, not gone, and spilling would move weights.
NO_SPILL_CODES = frozenset({StatusCode.RESOURCE_EXHAUSTED})
#: Worker statuses that blame the request itself (the shell logs them at debug only).
CLIENT_FAULT_CODES = frozenset(
    {
        StatusCode.INVALID_ARGUMENT,
        StatusCode.FAILED_PRECONDITION,
        StatusCode.OUT_OF_RANGE,
        StatusCode.ALREADY_EXISTS,
        StatusCode.PERMISSION_DENIED,
        StatusCode.UNAUTHENTICATED,
        StatusCode.CANCELLED,
        StatusCode.DEADLINE_EXCEEDED,
    }
)


class Shed(GrpcError):
    """A call refused for want of room (RESOURCE_EXHAUSTED); no latency is observed."""


def shed_at_gateway(cap: int) -> Shed:
    return Shed(
        StatusCode.RESOURCE_EXHAUSTED, f"gateway is at its limit of {cap} concurrent requests"
    )


def shed_at_replicas(model: str, cap: int) -> Shed:
    return Shed(
        StatusCode.RESOURCE_EXHAUSTED,
        f'every replica of model "{model}" is at its limit of {cap} concurrent requests',
    )


def unknown_model(model: str) -> GrpcError:
    """No worker serves `model`, nor ever did: Triton's NOT_FOUND and its wording."""
    return GrpcError(
        StatusCode.NOT_FOUND, f"Request for unknown model: '{shown(model)}' is not found"
    )


def no_ready_replica(model: str) -> GrpcError:
    """The fleet served `model` once, but none of its replicas is ready now."""
    return GrpcError(StatusCode.UNAVAILABLE, f"model '{model}' has no ready replica")


def gateway_deadline(model: str) -> GrpcError:
    return GrpcError(
        StatusCode.DEADLINE_EXCEEDED, f'deadline exceeded at gateway for model "{model}"'
    )


class RouteWalk:
    """The failover walk of one call over its replicas; see the module docstring.

    Args:
        model: the call's model (for messages).
        order: the scheduler's order, its choice first (never empty).
        replicas: every discovered replica of the model (the last resort).
        per_worker_cap: the per-worker share, for the shed message.
    """

    __slots__ = ("_cap", "_index", "_order", "_replicas", "_targets", "answered", "last", "model")

    def __init__(
        self, model: str, order: tuple[str, ...], replicas: tuple[str, ...], per_worker_cap: int
    ) -> None:
        self.model = model
        self._order = order
        self._replicas = replicas
        self._cap = per_worker_cap
        self._targets = order
        self._index = 0
        #: The failure to answer with if no replica is left.
        self.last: GrpcError | None = None
        #: The replica that answered, once one has (the shell says so).
        self.answered: str | None = None

    @property
    def tried(self) -> int:
        return self._index

    def next(self, is_full: Callable[[str], bool]) -> str | None:
        """The next replica to send to, or None when the walk is over (see `outcome`)."""
        while True:
            if self._index == len(self._targets) and not self._spill():
                return None
            url = self._targets[self._index]
            self._index += 1
            if not is_full(url):
                return url

    def _spill(self) -> bool:
        """Widen to the last resort, once, and only after a replica failed for real."""
        last = self.last
        if self._targets is not self._order or last is None or last.code in NO_SPILL_CODES:
            return False
        self._targets = self._order + tuple(u for u in self._replicas if u not in self._order)
        return self._index < len(self._targets)

    def failed(self, url: str, error: RsgwError, *, expired: bool, who: str) -> GrpcError | None:
        """Record a failed attempt on `url`: the error to answer with now, or None to go on.

        `expired`: the call's deadline has passed, so nothing more will be tried.
        `who`: the worker as the client may read it (a name, never an address: a
        connection failure's own text names the address, so it stays in the log).
        """
        if expired:
            return gateway_deadline(self.model)
        if isinstance(error, WorkerUnavailable):
            failure = GrpcError(StatusCode.UNAVAILABLE, f"{who} is unavailable")
        else:
            failure = GrpcError(error.code, f"{who}: {error.message}", error.trailers)
        if isinstance(error, ResponseInterrupted) or failure.code not in FAILOVER_CODES:
            return failure  # it may have run, or the worker judged it: one answer only
        self.last = failure
        return None

    def outcome(self) -> GrpcError:
        """What the call ends with once `next` returned None."""
        if self.last is None:  # nothing was tried: every chosen replica holds its share
            return shed_at_replicas(self.model, self._cap)
        return self.last
