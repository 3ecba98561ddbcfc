"""RepositoryModelLoad and Unload on workers, counted in the memory ledger as they answer.

The placer and the cold path decide which (model, worker) pairs to load and unload;
this module makes the calls, all of a batch at once, each within
`repository.load_timeout_seconds`, and ends each pair in the `MemoryLedger` as it
answers, with its load time (learned for the cold path's promise) and its metrics.

An unload has answered when the worker no longer holds the model, not when the RPC
returns: Triton's RepositoryModelUnload returns at once and unloads afterwards
(`TRITONSERVER_ServerUnloadModel` "does not wait for the requested model to be fully
unloaded"), so a load asked for the room at once found both models on the GPU (seen
against real Triton: five models on a budget of four). So after the RPC, the worker's
RepositoryIndex is read until the model is neither READY nor UNLOADING; only then is
its room given back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from google.protobuf.message import DecodeError

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import RsgwError
from rsgw.base._methods import Method
from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.gateway.fleet._pool import WorkerPool
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.gateway.placement._memory_ledger import MemoryLedger
from rsgw.scheduling.placement._repository_moves import Pair

logger = logging.getLogger("rsgw.gateway.placement._repository_placer")

#: Seconds between looks at a worker's index while a model it was told to unload goes.
UNLOAD_POLL_SECONDS = 0.01
#: RepositoryIndex states in which a model still holds its memory.
_HOLDING = frozenset({"READY", "UNLOADING", "LOADING"})
_WHOLE_INDEX = pb.RepositoryIndexRequest(ready=False).SerializeToString()


class RepositoryCalls:
    """Loads and unloads on the pool's workers; see the module docstring."""

    def __init__(
        self,
        config: RepositoryConfig,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        ledger: MemoryLedger,
        on_loading: Callable[[str], None],
    ) -> None:
        self._config = config
        self._pool = pool
        self._metrics = metrics
        self._ledger = ledger
        #: Told of each worker as a load there begins and ends (the admission
        #: forecast measures it afresh: the calls behind a load are no measure).
        self._on_loading = on_loading

    async def act(self, method: Method, pairs: tuple[Pair, ...], reason: str) -> set[Pair]:
        """`method` (RepositoryModelLoad or Unload) on every pair at once, each already
        begun in the ledger and ended there as it answers (an unload once the worker
        no longer holds the model); the failed ones."""
        load = method is Method.REPOSITORY_MODEL_LOAD
        action = "load" if load else "unload"
        deadline = trio.current_time() + self._config.load_timeout_seconds
        failed: set[Pair] = set()
        ledger = self._ledger

        async def one(model: str, url: str) -> None:
            request = (
                pb.RepositoryModelLoadRequest(model_name=model)
                if load
                else pb.RepositoryModelUnloadRequest(model_name=model)
            )
            started = trio.current_time()
            done = False
            if load:
                self._on_loading(url)
            try:
                await self._pool.channels[url].unary(
                    method.wire, request.SerializeToString(), deadline=deadline
                )
                if not load:
                    await self._until_gone(model, url, deadline)
                done = True
            except RsgwError as exc:
                failed.add((model, url))
                self._metrics.repack_failures.labels(action).inc()
                logger.warning(
                    f"lpt_packing: {method.rpc} failed; the placement keeps what is loaded",
                    extra={
                        "model": model,
                        "worker": self._pool.label(url),
                        "status": exc.code.name,
                        "said": exc.message[:200],
                    },
                )
            else:
                self._metrics.placement_actions.labels(action).inc()
                self._metrics.residency_changes.labels(action, reason).inc()
            finally:
                now = trio.current_time()
                if load:
                    self._on_loading(url)
                    ledger.end_load(
                        model,
                        url,
                        loaded=done,
                        now=now,
                        seconds=now - started,
                        protected=reason != "startup",
                    )
                else:
                    ledger.end_unload(model, url, unloaded=done)

        async with trio.open_nursery() as nursery:
            for model, url in pairs:
                if url in self._pool.channels:  # not one that left meanwhile
                    nursery.start_soon(one, model, url)
                elif load:
                    ledger.end_load(model, url, loaded=False, now=0.0, seconds=0.0)
                else:
                    ledger.end_unload(model, url, unloaded=False)
        return failed

    async def _until_gone(self, model: str, url: str, deadline: float) -> None:
        """Return once `url`'s index no longer shows `model` holding memory (or the
        worker has no index to ask, or its answer cannot be read: then at once)."""
        channel = self._pool.channels[url]
        with trio.move_on_at(deadline):
            while True:
                try:
                    reply = await channel.unary(
                        Method.REPOSITORY_INDEX.wire, _WHOLE_INDEX, deadline=deadline
                    )
                    index = pb.RepositoryIndexResponse.FromString(reply)
                except (RsgwError, DecodeError):
                    return
                states = {
                    m.state.rpartition(".")[2].upper() for m in index.models if m.name == model
                }
                if not states & _HOLDING:
                    return
                await trio.sleep(UNLOAD_POLL_SECONDS)
