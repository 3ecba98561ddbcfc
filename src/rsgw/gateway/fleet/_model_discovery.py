"""Model discovery: which workers serve which models, and the routing-table swap.

Each probe round (and on demand) discovery reads what every worker serves and
builds a new routing table, swapped in by reference; request handlers never wait
for it. A worker with a RepositoryIndex is read from it: a model is served where
its state reads ready, in the spellings real servers use (`is_ready_state`). A
worker without one (KServe's ModelServer) is asked ModelReady about the candidate
models (`rsgw.scheduling.fleet._lookups`: the ones configured in `discovery.models`, and
the ones found on demand).

On demand: a request for a model the table lacks asks for a discovery, single-flight
and at most once a second, and, where some workers have no index, one bounded
lookup of that model on them (`refresh_now`). Discoveries (a round's, an on-demand
one, the one after a model load) never overlap: each waits for the one running, so
tables are swapped in the order their reads began and an older read never replaces
a newer table.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._methods import Method
from rsgw.gateway.fleet._pool import fan_out
from rsgw.gateway.fleet._probe_call import DEFAULT_PROBE_TIMEOUT, answer_of, probe_call
from rsgw.scheduling.calls._routing import RoutingTable, build_routing_table, is_ready_state
from rsgw.scheduling.fleet._capabilities import Capability, learned_from
from rsgw.scheduling.fleet._lookups import ModelLookups

if TYPE_CHECKING:
    from rsgw.gateway.fleet._capability_probe import CapabilityProbe
    from rsgw.gateway.fleet._pool import WorkerPool
    from rsgw.gateway.observe._metrics import GatewayMetrics

logger = logging.getLogger(__name__)

#: On-demand refreshes run at most this often.
MIN_REFRESH_INTERVAL = 1.0

_INDEX_REQUEST = pb.RepositoryIndexRequest(ready=True).SerializeToString()


class ModelDiscovery:
    """Keeps `table` and `known` current; see the module docstring.

    Args:
        ejected: the workers out of routing for not answering (the prober's, read
            live): discovery leaves them out.
        lookups: the candidates for workers without an index, and the on-demand
            lookups' memory.
    """

    def __init__(
        self,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        capabilities: CapabilityProbe,
        ejected: Mapping[str, float],
        *,
        lookups: ModelLookups | None = None,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        on_swap: Callable[[RoutingTable], None] | None = None,
    ) -> None:
        self._pool = pool
        self._metrics = metrics
        self._capabilities = capabilities
        self._ejected = ejected
        self.lookups = lookups or ModelLookups()
        self.probe_timeout = probe_timeout
        self.on_swap = on_swap
        #: The current routing table; replaced, never mutated.
        self.table = RoutingTable()
        #: Every model some worker has served since start (bounded by the fleet's
        #: catalogues and the lookups' memory): a request for one of these whose
        #: replicas are all down is UNAVAILABLE, not NOT_FOUND.
        self.known: frozenset[str] = frozenset()
        #: Set by the prober's nursery (`request_refresh` starts a refresh in it).
        self.nursery: trio.Nursery | None = None
        #: Discovery is single-flight: set while one runs, to its end. Reads are
        #: numbered as they begin; `_discovered` is the last one that swapped its table.
        self._discovering: trio.Event | None = None
        self._began = 0
        self._discovered = 0
        self._last_refresh = -math.inf
        self._generation = 0
        #: model -> set when its on-demand lookup ends.
        self._looking_up: dict[str, trio.Event] = {}
        #: (model, worker) pairs being unloaded: out of the table whatever a read says.
        self._unloading: set[tuple[str, str]] = set()
        #: worker -> (the number of the read that began it, the models its last
        #: RepositoryIndex answer listed READY). Unlike the table, a worker whose read
        #: failed keeps what it said before: what a GPU holds (issue 49's memory
        #: ledger) is not forgotten for one slow answer, and the ledger can tell an
        #: answer read before its own last load or unload from one read after.
        self.reported: dict[str, tuple[int, frozenset[str]]] = {}

    # -- the table -------------------------------------------------------------------

    def without(self, url: str) -> None:
        """Take `url` out of routing now (ejected, or gone)."""
        self._generation += 1
        self._swap(self.table.without(url, self._generation))

    @property
    def reads_begun(self) -> int:
        """Discovery reads begun so far (the number the next one's answers will carry
        is one more)."""
        return self._began

    def unloading(self, model: str, url: str) -> None:
        """Take `url` out of `model`'s replicas now and until `unloaded`: it is about to
        unload the model, and a discovery that read its index before must not put it
        back (a call routed there would find the model gone). Said twice, once."""
        if (model, url) in self._unloading:
            return
        self._unloading.add((model, url))
        self._generation += 1
        self._swap(self.table.without_copy(model, url, self._generation))

    def unloaded(self, model: str, url: str) -> None:
        """The unload of `model` on `url` has answered: discovery says again."""
        self._unloading.discard((model, url))

    def _swap(self, table: RoutingTable) -> None:
        if dict(table.models) != dict(self.table.models):
            logger.info(
                "routing table changed",
                extra={"models": len(table), "generation": table.generation},
            )
        self.table = table
        if not self.known.issuperset(table.models):
            self.known = self.known | frozenset(table.models)
        self._metrics.routing_table_size.set(len(table))
        if self.on_swap is not None:
            self.on_swap(table)

    # -- discovering -------------------------------------------------------------------

    async def refresh(self) -> None:
        """Wait until a discovery that began after this call has swapped its table in.

        Discoveries never overlap, so tables are swapped in the order their reads
        began and an older read never replaces a newer table. One running now may
        have read the indexes before what made us call (a model load, a new probe
        round): we wait for it, then begin the next one, unless another waiter began
        it first, in which case we share it. If the read we waited for failed or was
        cancelled, we run one ourselves.
        """
        wanted = self._began + 1
        while self._discovered < wanted:
            running = self._discovering
            if running is None:
                await self._discover()
            else:
                await running.wait()

    async def _discover(self) -> None:
        """One discovery: every worker's index (or its candidates), then the swap.

        Callers check `_discovering` is None first, with no await in between.
        """
        done = self._discovering = trio.Event()
        self._began += 1
        number = self._began
        try:
            urls = self._pool.urls
            table = self._capabilities.table
            indexed = table.able(urls, Method.REPOSITORY_INDEX)
            served = await self._read_indexes(indexed)
            for url, models in served.items():
                self.reported[url] = (number, frozenset(models))
            table = self._capabilities.table  # what the indexes' answers taught
            unindexed = [
                url
                for url in urls
                if not table.can(url, Method.REPOSITORY_INDEX) and url not in self._ejected
            ]
            if unindexed:
                now = trio.current_time()
                found = await self._ask_ready(unindexed, self.lookups.candidates(now))
                self.lookups.seen({m for models in found.values() for m in models}, now)
                served.update(found)
            for url in [u for u in self.reported if u not in urls]:
                del self.reported[url]  # left the pool
            for model, url in self._unloading:
                if url in served:
                    served[url] = [m for m in served[url] if m != model]
            self._generation += 1
            self._swap(build_routing_table(served, self._pool.urls, self._generation))
            self._discovered = number
        finally:
            self._last_refresh = trio.current_time()
            self._discovering = None
            done.set()

    async def _read_indexes(self, urls: Sequence[str]) -> dict[str, list[str]]:
        """What each of `urls` lists as ready; one answering UNIMPLEMENTED is learned
        to have no index (and asked about candidates instead)."""
        results = await fan_out(
            urls,
            lambda url: probe_call(
                self._pool,
                url,
                Method.REPOSITORY_INDEX,
                _INDEX_REQUEST,
                pb.RepositoryIndexResponse,
                self.probe_timeout,
            ),
        )
        served: dict[str, list[str]] = {}
        for url, each in results.items():
            if url in self._ejected:
                continue
            result = answer_of(each)
            if result.error is not None:
                error = result.error
                self._capabilities.learn(
                    url, Capability.REPOSITORY_INDEX, learned_from(error.code), error.message
                )
            if result.reply is not None:
                served[url] = [m.name for m in result.reply.models if is_ready_state(m.state)]
            elif result.timed_out:
                logger.warning(
                    "RepositoryIndex discovery timed out", extra={"worker": self._pool.label(url)}
                )
        return served

    async def _ask_ready(self, urls: Sequence[str], models: Sequence[str]) -> dict[str, list[str]]:
        """Which of `models` each of `urls` says is ready (ModelReady, all at once)."""
        ready: dict[str, list[str]] = {url: [] for url in urls}
        if not models:
            return ready

        async def ask(url: str, model: str) -> None:
            request = pb.ModelReadyRequest(name=model).SerializeToString()
            result = await probe_call(
                self._pool,
                url,
                Method.MODEL_READY,
                request,
                pb.ModelReadyResponse,
                self.probe_timeout,
            )
            if result.reply is not None and result.reply.ready:
                ready[url].append(model)

        async with trio.open_nursery() as nursery:
            for url in urls:
                for model in models:
                    nursery.start_soon(ask, url, model)
        order = {model: i for i, model in enumerate(models)}
        return {url: sorted(found, key=order.__getitem__) for url, found in ready.items()}

    # -- on demand -----------------------------------------------------------------------

    async def refresh_now(self, model: str = "") -> None:
        """Rediscover before answering (a request named a model we do not know).

        Single-flight: joins a discovery already running; skips if one finished
        less than a second ago. With `model`, and workers without an index, those
        workers are asked about it too (once at a time, bounded: `ModelLookups`).
        """
        running = self._discovering
        if running is not None:
            await running.wait()
        elif trio.current_time() - self._last_refresh >= MIN_REFRESH_INTERVAL:
            try:
                await self._discover()
            except Exception:  # a bug (a worker's failure is its probe's result): said once
                logger.exception("on-demand discovery failed; answering from the table in force")
        if model and not self.table.replicas(model):
            await self._look_up(model)

    async def _look_up(self, model: str) -> None:
        """Ask the workers without an index whether they serve `model`; if one does, it
        is a candidate from now on and a discovery puts it in the table."""
        table = self._capabilities.table
        unindexed = [
            url
            for url in self._pool.urls
            if not table.can(url, Method.REPOSITORY_INDEX) and url not in self._ejected
        ]
        if not unindexed:
            return
        running = self._looking_up.get(model)
        if running is not None:
            await running.wait()
            return
        if not self.lookups.begin(model, trio.current_time()):
            return
        done = self._looking_up[model] = trio.Event()
        try:
            answers = await self._ask_ready(unindexed, (model,))
        except BaseException:
            self.lookups.abandon(model)  # cut short: nothing learned
            raise
        else:
            found = any(answers.values())
            self.lookups.end(model, found, trio.current_time())
        finally:
            del self._looking_up[model]
            done.set()
        if found:
            await self.refresh()

    async def rediscover(self) -> None:
        """Rediscover now, unthrottled, and wait for it: the fleet's models just changed.

        A discovery already running may have read the indexes before the change, so
        this one runs after it. Model control answers only once routing agrees.
        """
        try:
            await self.refresh()
        except Exception:  # a bug (a worker's failure is its probe's result): said once
            logger.exception("discovery after a model change failed; routing as before")

    def request_refresh(self) -> None:
        """Rediscover soon, without waiting (a worker said NOT_FOUND)."""
        if (
            self._discovering is None
            and self.nursery is not None
            and trio.current_time() - self._last_refresh >= MIN_REFRESH_INTERVAL
        ):
            self.nursery.start_soon(self.refresh_now)
