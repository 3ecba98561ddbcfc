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

`needs` is the method the call will make of the replica. Every worker the
gateway has met implements every method it routes (rsgw's simulated worker,
Triton), so today the table's replicas are the answer for every method; the
resolution takes the method so that what a worker implements is decided here, once,
for every door and every routed call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rsgw.gateway._metrics import UNKNOWN_MODEL
from rsgw.scheduling._plan import no_ready_replica, unknown_model

if TYPE_CHECKING:
    from rsgw._methods import Method
    from rsgw.gateway._prober import Prober

logger = logging.getLogger(__name__)


class Resolver:
    """The one replica resolution of a gateway; see the module docstring."""

    __slots__ = ("_prober",)

    def __init__(self, prober: Prober) -> None:
        self._prober = prober

    def ready(self, model: str, needs: Method) -> tuple[str, ...]:
        """The routing table's replicas of `model` that can answer `needs`, or () when
        it has none (`resolve` then finds them or says why). ModelInfer's path asks
        this first: a plain call, where `resolve` costs a coroutine."""
        return self._prober.table.replicas(model)

    async def resolve(self, model: str, needs: Method) -> tuple[str, ...]:
        """The ready replicas of `model` that can answer `needs` (never empty).

        Raises:
            GrpcError: UNAVAILABLE when the model was served before but has no ready
                replica now; NOT_FOUND when no worker serves it (or `model` is "").
        """
        replicas = self.ready(model, needs)
        if replicas:
            return replicas
        prober = self._prober
        if model:
            await prober.refresh_now()
            replicas = prober.table.replicas(model)
            if replicas:
                return replicas
            if model in prober.known:
                raise no_ready_replica(model)
        # Debug only: the name is client-chosen, and a storm of them must not become a
        # log storm.
        logger.debug("model not found on any worker", extra={"model": model[:200]})
        raise unknown_model(model)

    def label(self, model: str) -> str:
        """The metrics label of a call for `model`: its name if some worker served it,
        else `_unknown_` (client-chosen names must not grow the metrics)."""
        return model if model in self._prober.known else UNKNOWN_MODEL
