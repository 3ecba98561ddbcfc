"""Fan-outs: asking every worker (or every holder of a model) at once, and the rules
that make one answer of theirs.

Each client call answered by the fleet is one fan-out (`rsgw.gateway.fleet._pool.fan_out`:
the workers at once, each result or its error) and one of two rules:
- **all or nothing** (SystemSharedMemoryRegister, CudaSharedMemoryRegister,
  RepositoryModelLoad): every worker must succeed; where some did and others did
  not, the ones that did are undone (unregister, unload) and the call fails with
  FAILED_PRECONDITION naming the workers that failed and why;
- **any succeeds** (the Unregisters, RepositoryModelUnload, CompactMemory): the call
  succeeds if one worker did; only if every worker failed does it fail.
When every worker failed with the same status (a key that does not exist, a model
no worker knows), the call fails with that status: it is the client's answer, and
more precise than the original's FAILED_PRECONDITION for every failure. Workers are
named in what the client reads, never addressed.

Which workers a fan-out asks is chosen in one place, `Targets`: every member, the
ready ones, or the ones that should hold a model (its lpt_packing placement, every
worker in the other modes). The calls themselves are in `rsgw.gateway.calls._shm_calls`
(shared memory) and `rsgw.gateway.calls._fleet_calls` (model control, IPC namespace,
compaction); the model RPCs merged over the fleet are in `rsgw.gateway.calls._models`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import trio
from google.protobuf.message import DecodeError

from rsgw.base._errors import GrpcError, RsgwError, WorkerUnavailable
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.gateway.fleet._pool import fan_out
from rsgw.runtime._logging import log_limited

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from rsgw.base._call import CallContext
    from rsgw.gateway.fleet._pool import WorkerPool
    from rsgw.gateway.fleet._prober import Prober
    from rsgw.gateway.observe._metrics import GatewayMetrics
    from rsgw.gateway.observe._tracing import Tracer
    from rsgw.grpc.protocol._metadata import HeaderBlock

logger = logging.getLogger(__name__)

Results = dict[str, bytes | RsgwError]


class Targets:
    """Which workers a fan-out asks, chosen from the pool in this one place.

    `needs` is the method the fan-out will call on each worker: only the workers
    that implement it are asked (`rsgw.scheduling.fleet._capabilities`), and when there
    are workers to ask but none implements it, the call is UNIMPLEMENTED in the
    words of the first that said so.

    Args:
        holders: the workers that should hold a model (model control).
    """

    def __init__(
        self, pool: WorkerPool, prober: Prober, holders: Callable[[str], tuple[str, ...]]
    ) -> None:
        self._pool = pool
        self._prober = prober
        self._holders = holders

    def members(self) -> tuple[str, ...]:
        """Every member, whatever it implements, in the order they joined."""
        return self._pool.urls

    def capable(self, urls: tuple[str, ...], needs: Method) -> tuple[str, ...]:
        """Those of `urls` that implement `needs` (perhaps none)."""
        return self._prober.capabilities.table.able(urls, needs)

    def every(self, needs: Method) -> tuple[str, ...]:
        """Every member that implements `needs`, in the order they joined (the
        configured ones first)."""
        return self._required(self._pool.urls, needs)

    def ready(self, needs: Method) -> tuple[str, ...]:
        """The members whose last ServerReady said ready and that implement `needs`."""
        ready = self._prober.ready
        return self._required(tuple(url for url in self._pool.urls if url in ready), needs)

    def holders(self, model: str, needs: Method) -> tuple[str, ...]:
        """The workers that should hold `model` and implement `needs`."""
        return self._required(self._holders(model), needs)

    def _required(self, urls: tuple[str, ...], needs: Method) -> tuple[str, ...]:
        table = self._prober.capabilities.table
        able = table.able(urls, needs)
        if urls and not able:
            raise GrpcError(StatusCode.UNIMPLEMENTED, table.refusal(urls, needs))
        return able


class FanOut:
    """The fan-out rules over one gateway's pool; see the module docstring.

    Args:
        request_timeout: the budget of a fan-out's calls unless a call says more.
    """

    def __init__(
        self,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        targets: Targets,
        *,
        request_timeout: float,
        tracer: Tracer | None = None,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.targets = targets
        self.request_timeout = request_timeout
        #: With tracing on, each worker's call is a span under the client call's.
        self.tracer = tracer

    async def all_or_nothing(
        self,
        method: Method,
        body: bytes,
        urls: Sequence[str],
        deadline: float,
        undo: Callable[[list[str]], Awaitable[None]],
        *,
        gated: bool = False,
        unreachable_later: bool = False,
    ) -> bytes:
        """Every worker in `urls` succeeds, or the ones that did are undone and we fail.

        With `unreachable_later`, a worker that cannot be reached is not a failure
        (it will be told when it is back: see `rsgw.gateway.fleet._regions`), as long as
        one worker succeeded.
        """
        results = await self.ask(method, body, urls, deadline, gated=gated)
        failed = [url for url in urls if isinstance(results[url], RsgwError)]
        if unreachable_later and len(failed) < len(urls):
            failed = [url for url in failed if not isinstance(results[url], WorkerUnavailable)]
        if not failed:
            return _first_reply(results)
        succeeded = [url for url in urls if url not in failed]
        await undo(succeeded)
        code = StatusCode.FAILED_PRECONDITION
        if not succeeded:
            code = _common_code([results[url] for url in failed]) or code
        log_limited(
            logger,
            logging.WARNING,
            "fan-out failed; undone where it succeeded",
            {
                "rpc": method.rpc,
                "failed": [self.pool.label(u) for u in failed],
                "undone": len(succeeded),
            },
            method.rpc,
        )
        raise GrpcError(
            code,
            f"{method.rpc} failed on {len(failed)} of {len(urls)} workers "
            f"({self.why(failed, results)})",
        )

    async def any_succeeds(
        self, method: Method, body: bytes, urls: Sequence[str], deadline: float, *, gated: bool
    ) -> bytes:
        """One worker's success is the call's; it fails only if every worker did."""
        results = await self.ask(method, body, urls, deadline, gated=gated)
        failed = [url for url in urls if isinstance(results[url], RsgwError)]
        if failed and len(failed) == len(urls):
            code = _common_code([results[url] for url in failed]) or StatusCode.UNAVAILABLE
            raise GrpcError(
                code, f"{method.rpc} failed on every worker ({self.why(failed, results)})"
            )
        if failed:
            log_limited(
                logger,
                logging.WARNING,
                "fan-out failed on some workers",
                {"rpc": method.rpc, "failed": [self.pool.label(u) for u in failed]},
                method.rpc,
            )
        return _first_reply(results)

    async def ask(
        self, method: Method, body: bytes, urls: Sequence[str], deadline: float, *, gated: bool
    ) -> Results:
        """The fan-out; with `gated`, each worker's register gate is closed meanwhile."""
        gate = self.pool.gate
        tracer = self.tracer

        async def one(url: str) -> bytes:
            if gated:
                gate.begin(url)
            metadata: HeaderBlock = ()
            attempt = None
            if tracer is not None:
                attempt, metadata = tracer.worker_call(self.pool.public_name(url), metadata)
            try:
                reply = await self.pool.channels[url].unary(
                    method.wire, body, deadline=deadline, metadata=metadata
                )
            except BaseException as exc:
                if attempt is not None:
                    attempt.ended_by(exc)
                raise
            finally:
                if gated:
                    gate.end(url)
            if attempt is not None:
                attempt.end(answered=True)
            return reply

        return await fan_out(urls, one, self._observe_worker(method.rpc))

    def why(self, urls: Sequence[str], results: Results) -> str:
        """What went wrong on each worker, in words a client may read (no addresses)."""
        reasons = []
        for url in urls:
            error = results[url]  # a failed worker's: an RsgwError
            if isinstance(error, RsgwError) and not isinstance(error, WorkerUnavailable):
                text = error.message
            else:
                text = "unavailable"
            reasons.append(f"{self.pool.public_name(url)}: {text}")
        return "; ".join(reasons)

    def deadline(self, call: CallContext, at_least: float = 0.0) -> float:
        budget = max(self.request_timeout, at_least)
        return min(call.deadline, trio.current_time() + budget)

    # -- shared memory ------------------------------------------------------------------

    def undoer(self, method: Method, body: bytes) -> Callable[[list[str]], Awaitable[None]]:
        """Best effort: run `method` where the failed call had succeeded."""

        async def undo(urls: list[str]) -> None:
            if not urls:
                return
            deadline = trio.current_time() + self.request_timeout
            results = await self.ask(method, body, urls, deadline, gated=False)
            for url, result in results.items():
                if isinstance(result, RsgwError):
                    logger.warning(
                        "undo failed",
                        extra={
                            "rpc": method.rpc,
                            "worker": self.pool.label(url),
                            "error": str(result),
                        },
                    )

        return undo

    def _observe_worker(self, rpc: str) -> Callable[[str, float], None]:
        return lambda url, seconds: self.metrics.observe_worker(rpc, url, seconds)


def _common_code(errors: Sequence[bytes | RsgwError]) -> StatusCode | None:
    """The status every worker answered alike (a client's fault, say), or None."""
    codes = {e.code if isinstance(e, GrpcError) else None for e in errors}
    code = codes.pop() if len(codes) == 1 else None
    return code


def _first_reply(results: Results) -> bytes:
    return next((r for r in results.values() if isinstance(r, bytes)), b"")


def parsed(message: type[Message], body: bytes) -> Message:
    try:
        return message.FromString(body)
    except DecodeError as exc:
        raise GrpcError(
            StatusCode.INVALID_ARGUMENT, f"malformed {message.DESCRIPTOR.name}: {exc}"
        ) from exc
