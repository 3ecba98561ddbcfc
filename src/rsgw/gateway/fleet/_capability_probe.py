"""Learning what each worker implements: one harmless call per capability.

When a worker connects (and again whenever its channel connected anew: a worker that
restarted may be another server now), the prober has this module ask it once per
optional part of the API, each call under its own deadline and all at once, and
reads each answer as `rsgw.scheduling.fleet._capabilities.learned_from` does: a reply or
any status but UNIMPLEMENTED means the method is there. The calls are chosen to
change nothing: status and index reads, a configuration and statistics request for
a model no worker has, an unload of that same model, and a stream opened and closed
with no request on it.

The table (`table`) is replaced whole after each worker's probe and after any answer
that teaches something (RepositoryIndex during discovery, say), so readers never
lock; the metric `gateway_worker_capability` and `rsgw ctl status` show it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import GrpcError, RsgwError
from rsgw.base._methods import Method
from rsgw.gateway.fleet._pool import fan_out
from rsgw.scheduling.fleet._capabilities import Capability, CapabilityTable, learned_from

if TYPE_CHECKING:
    from rsgw.gateway.fleet._pool import WorkerPool
    from rsgw.gateway.observe._metrics import GatewayMetrics

logger = logging.getLogger(__name__)

#: A model name no worker serves: the probes ask about it, so they touch nothing.
PROBE_MODEL = "rsgw-capability-probe"
#: Each probe call's deadline.
PROBE_SECONDS = 5.0

#: capability -> the unary call that shows it (streaming is probed apart).
_UNARY_PROBES: tuple[tuple[Capability, Method, bytes], ...] = (
    (
        Capability.REPOSITORY_INDEX,
        Method.REPOSITORY_INDEX,
        pb.RepositoryIndexRequest(ready=True).SerializeToString(),
    ),
    (
        Capability.MODEL_CONFIG,
        Method.MODEL_CONFIG,
        pb.ModelConfigRequest(name=PROBE_MODEL).SerializeToString(),
    ),
    (
        Capability.STATISTICS,
        Method.MODEL_STATISTICS,
        pb.ModelStatisticsRequest(name=PROBE_MODEL).SerializeToString(),
    ),
    (
        Capability.MODEL_CONTROL,
        Method.REPOSITORY_MODEL_UNLOAD,
        pb.RepositoryModelUnloadRequest(model_name=PROBE_MODEL).SerializeToString(),
    ),
    (
        Capability.SYSTEM_SHARED_MEMORY,
        Method.SHM_STATUS,
        pb.SystemSharedMemoryStatusRequest().SerializeToString(),
    ),
    (
        Capability.CUDA_SHARED_MEMORY,
        Method.CUDA_SHM_STATUS,
        pb.CudaSharedMemoryStatusRequest().SerializeToString(),
    ),
    (
        Capability.IPC_NAMESPACE,
        Method.IPC_NAMESPACE,
        pb.IsSameIPCNamespaceRequest(name=PROBE_MODEL).SerializeToString(),
    ),
    (
        Capability.CONTROL_PLANE,
        Method.MODEL_CONTROL_STATUS,
        cpb.ModelControlStatusRequest().SerializeToString(),
    ),
)

Verdict = tuple[bool | None, str]


class CapabilityProbe:
    """Every worker's capabilities (`table`), learned per connection; see above."""

    def __init__(self, pool: WorkerPool, metrics: GatewayMetrics) -> None:
        self._pool = pool
        self._metrics = metrics
        #: What each worker implements; replaced, never changed.
        self.table = CapabilityTable()
        #: The channel connection each worker was last probed on (`Channel.connects`).
        self._probed: dict[str, int] = {}

    def stale(self, urls: Sequence[str]) -> list[str]:
        """Those of `urls` connected anew since their last probe (or never probed)."""
        channels = self._pool.channels
        return [url for url in urls if channels[url].connects != self._probed.get(url)]

    async def probe(self, urls: Sequence[str]) -> None:
        """Probe each of `urls` (at once), and swap the table in after each."""
        await fan_out(urls, self._probe_one)

    async def _probe_one(self, url: str) -> None:
        channel = self._pool.channels[url]
        connection = channel.connects
        verdicts: dict[Capability, Verdict] = {}

        async def unary(capability: Capability, method: Method, request: bytes) -> None:
            verdicts[capability] = await self._ask(url, method, request)

        async with trio.open_nursery() as nursery:
            for capability, method, request in _UNARY_PROBES:
                nursery.start_soon(unary, capability, method, request)
            verdicts[Capability.STREAMING] = await self._stream(url)
        self._probed[url] = connection
        self.learn_all(url, verdicts)

    async def _ask(self, url: str, method: Method, request: bytes) -> Verdict:
        async def call(deadline: float) -> None:
            await self._pool.channels[url].unary(
                method.wire, request, deadline=deadline, uncapped=True
            )

        return await _verdict(call)

    async def _stream(self, url: str) -> Verdict:
        """ModelStreamInfer, opened and half-closed at once: how the worker ends it."""

        async def call(deadline: float) -> None:
            async with self._pool.channels[url].stream(
                Method.MODEL_STREAM_INFER.wire, deadline=deadline
            ) as stream:
                stream.end()
                async for _ in stream:
                    pass

        return await _verdict(call)

    def learn(self, url: str, capability: Capability, implemented: bool | None, said: str) -> None:
        """One answer outside a probe taught something (RepositoryIndex in discovery)."""
        self.learn_all(url, {capability: (implemented, said)})

    def learn_all(self, url: str, verdicts: dict[Capability, Verdict]) -> None:
        before = self.table
        self.table = before.learn_all(url, verdicts)
        if self.table is before:
            return
        known = self.table.of(url)
        label = self._pool.label(url)
        self._metrics.capabilities_learned(label, known.names(), [str(c) for c in known.lacks])
        logger.info(
            "worker capabilities learned",
            extra={
                "worker": label,
                "has": list(known.names()),
                "lacks": sorted(map(str, known.lacks)),
            },
        )

    def forget(self, url: str) -> None:
        """`url` left the pool."""
        self.table = self.table.without(url)
        self._probed.pop(url, None)


async def _verdict(call: Callable[[float], Awaitable[None]]) -> Verdict:
    """What one probe call, given its deadline, teaches (`learned_from`)."""
    deadline = trio.current_time() + PROBE_SECONDS
    with trio.move_on_at(deadline + 1.0):  # the worker's own deadline first
        try:
            await call(deadline)
        except GrpcError as exc:
            return learned_from(exc.code), exc.message
        except RsgwError:
            return None, ""
        return True, ""
    return None, ""
