"""Replica resolution: which workers may take a call for a model, or why none may.

Every call routed by model name (ModelInfer, ModelStreamInfer's requests, the model
RPCs: ModelReady, ModelMetadata, ModelConfig, ModelStatistics) asks the same
question the same way, here: the routing table's replicas of the model; if it has
none, one on-demand rediscovery (single-flight and throttled by the prober: a
model loaded a moment ago is found on its first call, and a storm of unknown names
costs at most one discovery a second); if there are still none, the answer every
door gives alike. A model some worker served before but none serves ready now is
UNAVAILABLE (its replicas are down, a client may retry); a model no worker ever
served is NOT_FOUND in Triton's words. The name is client-chosen, so it never
becomes a metric label or per-model state unless a worker serves it (`label`).

`needs` is the method the call will make of the replica: only replicas that
implement it are offered (`rsgw.scheduling.fleet._capabilities`), and when the model's
replicas are all workers that lack it, the call is UNIMPLEMENTED in the worker's own
words. Every worker answers ModelInfer, so its path asks `infer_replicas`, which
checks nothing more than the table.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.gateway.observe._metrics import UNKNOWN_MODEL
from rsgw.scheduling.calls._plan import no_ready_replica, unknown_model
from rsgw.scheduling.fleet._capabilities import NEEDS

if TYPE_CHECKING:
    from rsgw.base._methods import Method
    from rsgw.gateway.fleet._capability_probe import CapabilityProbe
    from rsgw.gateway.fleet._model_discovery import ModelDiscovery

logger = logging.getLogger(__name__)


class ColdPath(Protocol):
    """Loads a handed model a call asks for while it is loaded nowhere (issue 49;
    `rsgw.gateway.placement._cold_starts`)."""

    def handed(self, model: str) -> bool: ...

    async def warm(self, model: str, deadline: float) -> None: ...


class Resolver:
    """The one replica resolution of a gateway; see the module docstring."""

    __slots__ = ("_capabilities", "_cold", "_discovery")

    def __init__(
        self,
        discovery: ModelDiscovery,
        capabilities: CapabilityProbe,
        cold: ColdPath | None = None,
    ) -> None:
        self._discovery = discovery
        self._capabilities = capabilities
        self._cold = cold

    def infer_replicas(self, model: str) -> tuple[str, ...]:
        """The routing table's replicas of `model`, or () when it has none (`resolve`
        then finds them or says why): ModelInfer's path asks this first, a plain call
        where `resolve` costs a coroutine, and every worker answers ModelInfer."""
        return self._discovery.table.replicas(model)

    def ready(self, model: str, needs: Method) -> tuple[str, ...]:
        """The routing table's replicas of `model` that can answer `needs`, or ().

        Raises:
            GrpcError: UNIMPLEMENTED, the model has replicas but none implements
                `needs` (what the first of them said when it was asked).
        """
        replicas = self._discovery.table.replicas(model)
        if replicas and needs in NEEDS:
            table = self._capabilities.table
            able = table.able(replicas, needs)
            if not able:
                raise GrpcError(StatusCode.UNIMPLEMENTED, table.refusal(replicas, needs))
            return able
        return replicas

    async def resolve(
        self, model: str, needs: Method, deadline: float | None = None
    ) -> tuple[str, ...]:
        """The ready replicas of `model` that can answer `needs` (never empty). With a
        `deadline`, a handed model loaded nowhere is loaded first, within it (the cold
        path); without one (ModelReady: a probe must not load models) it is not.

        Raises:
            GrpcError: UNAVAILABLE when the model was served before but has no ready
                replica now (or a cold one cannot be loaded in time); NOT_FOUND when no
                worker serves it (or `model` is ""); UNIMPLEMENTED when no replica
                implements `needs`.
        """
        replicas = self.ready(model, needs)
        if replicas:
            return replicas
        cold = self._cold
        if cold is not None and deadline is not None and cold.handed(model):
            await cold.warm(model, deadline)
            replicas = self.ready(model, needs)
            if replicas:
                return replicas
        discovery = self._discovery
        if model:
            await discovery.refresh_now(model)
            replicas = self.ready(model, needs)
            if replicas:
                return replicas
            if model in discovery.known:
                raise no_ready_replica(model)
        # Debug only: the name is client-chosen, and a storm of them must not become a
        # log storm.
        logger.debug("model not found on any worker", extra={"model": model[:200]})
        raise unknown_model(model)

    def holding(self, replicas: tuple[str, ...], regions: frozenset[Method]) -> tuple[str, ...]:
        """Those of `replicas` that hold shared memory regions of the kinds `regions`
        (register methods): the gateway registered its regions only on workers that
        implement them, so a call naming one goes nowhere else.

        Raises:
            GrpcError: UNIMPLEMENTED, none of `replicas` implements them.
        """
        table = self._capabilities.table
        able = replicas
        for kind in regions:
            able = table.able(able, kind)
        if not able:
            said = next((table.refusal(replicas, kind) for kind in regions), "")
            raise GrpcError(StatusCode.UNIMPLEMENTED, said)
        return able

    def label(self, model: str) -> str:
        """The metrics label of a call for `model`: its name if some worker served it,
        else `_unknown_` (client-chosen names must not grow the metrics)."""
        return model if model in self._discovery.known else UNKNOWN_MODEL
