"""The simulated device's weight memory: the pure `WeightCache` plus the time loads take.

The shell half of `_weights.py`. The cache decides (what to load, what to
evict); this module pays for the decision in device time, counts it, and logs
the transitions. Every method that awaits is called from the device's dispatch
loop only, between batches, so no batch ever loses its weights while it runs
and no two loads overlap (one copy engine, as the original worker models it).

A load of `weight_bytes` takes `weight_bytes / load_bandwidth` seconds, or the
model's catalogue `load_ms`, times `time_scale`. Load time is device time but
not compute: it is counted in the weight counters, never in a model's
`total_compute_seconds` (docs/original.md §8.2).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from rsgw.base._errors import ConfigError, FailedPrecondition, GrpcError, shown
from rsgw.base._status import StatusCode
from rsgw.base._values import human_bytes
from rsgw.worker.device._weights import Load, Residency, ResidencyMode, WeightCache

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from rsgw.worker.models._specs import Catalogue, ModelSpec

logger = logging.getLogger(__name__)

#: Host-to-device weight copy rate, bytes/s. PCIe 4.0 x16 peaks near 32 GB/s, and
#: loading weights from pinned host memory reaches a third to a half of that once
#: allocation and framework overhead are counted; 8 GiB/s is that, rounded.
DEFAULT_LOAD_BANDWIDTH = 8 * 1024**3


@dataclass(slots=True)
class WeightCounters:
    """Cumulative weight movements of the device."""

    loads: int = 0
    evicts: int = 0
    load_seconds: float = 0.0
    compactions: int = 0


@dataclass(frozen=True, slots=True)
class Residence:
    """Where one routable model's weights are; a meta's are its sub-models' together."""

    residency: Residency  # the least resident floor among its weights
    device_resident: bool
    host_resident: bool
    pinned: bool
    weight_nbytes: int


def unloaded_model(model: str) -> GrpcError:
    """The error of any call naming a model RepositoryModelUnload unloaded (Triton's words).

    UNAVAILABLE, not NOT_FOUND: the model exists and a RepositoryModelLoad brings it
    back; through the gateway, another replica may still hold it.
    """
    return GrpcError(
        StatusCode.UNAVAILABLE,
        f"Request for unknown model: '{shown(model)}' has no available versions",
    )


def gpu_out_of_memory(model: str, size: int, memory: DeviceMemory) -> GrpcError:
    """A RepositoryModelLoad past the GPU's memory: INTERNAL, as Triton's load fails when
    CUDA cannot allocate the model's weights (and the model stays unloaded)."""
    used = memory.loaded_bytes()
    return GrpcError(
        StatusCode.INTERNAL,
        f"failed to load '{shown(model)}' version 1: Internal: out of memory: its weights "
        f"need {size} bytes of GPU memory and {memory.gpu_memory_bytes - used} of "
        f"{memory.gpu_memory_bytes} are free ({used} in use by the loaded models)",
    )


def not_resident(model: str) -> FailedPrecondition:
    """The error of inference on an externally managed model that is not pinned."""
    return FailedPrecondition(
        f"model '{model}' is not resident on the device; "
        "the control plane must pin it before inference"
    )


class DeviceMemory:
    """The weights of one simulated device, in device time.

    Args:
        catalogue: the models; a meta's weights are its sub-models'.
        weight_cache_bytes: the on-demand budget; 0 disables the cache.
        mode: who decides what is on the device.
        load_bandwidth: bytes/s for models without `load_ms`.
        time_scale: multiplies every load time.
        pinned: routable models pinned on the device from the start.
        loaded_at_start: explicit model control: only these routable models are
            loaded at start (None: all of them).
        gpu_memory_bytes: the GPU's memory for loaded models' weights, enforced as
            a GPU would (`gpu_out_of_memory`); 0: no limit.

    Raises:
        ConfigError: `pinned` or `loaded_at_start` names a model clients cannot
            call, or the models loaded at start do not fit `gpu_memory_bytes`.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        weight_cache_bytes: int = 0,
        mode: ResidencyMode = ResidencyMode.SELF_MANAGED,
        load_bandwidth: float = DEFAULT_LOAD_BANDWIDTH,
        time_scale: float = 1.0,
        pinned: Iterable[str] = (),
        loaded_at_start: Iterable[str] | None = None,
        gpu_memory_bytes: int = 0,
    ) -> None:
        self.catalogue = catalogue
        self.gpu_memory_bytes = gpu_memory_bytes
        self.mode = mode
        self.load_bandwidth = load_bandwidth
        self.time_scale = time_scale
        self.counters = WeightCounters()
        #: Each model's floor at start, which RepositoryModelLoad restores.
        self._start_floors = self._initial_floors(pinned, cache_enabled=weight_cache_bytes > 0)
        self.cache = WeightCache(
            {m.name: m.weight_bytes for m in catalogue.models if not m.is_meta},
            weight_cache_bytes,
            self._start_floors,
        )
        #: Routable models RepositoryModelUnload took away (until a RepositoryModelLoad).
        self.unloaded: set[str] = set()
        self._over_budget_warned: set[str] = set()
        if loaded_at_start is not None:
            self._start_explicit(frozenset(loaded_at_start))
        used = self.loaded_bytes()
        if gpu_memory_bytes and used > gpu_memory_bytes:
            raise ConfigError(
                f"the models loaded at start take {used} bytes of weights, more than the "
                f"GPU memory of {gpu_memory_bytes} bytes (--gpu-memory-bytes); load fewer "
                "(--model-control-mode explicit --load-model NAME)"
            )

    def _start_explicit(self, loaded: frozenset[str]) -> None:
        """Explicit model control: every routable model but `loaded` starts unloaded."""
        routable = {spec.name for spec in self.catalogue.routable}
        unknown = sorted(loaded - routable)
        if unknown:
            raise ConfigError(f"--load-model {unknown[0]}: no such model in the catalogue")
        for name in sorted(routable - loaded):
            spec = self.catalogue.get(name)
            assert spec is not None
            self.unloaded.add(name)
            for sub in self._exclusive_submodels(spec):
                self.cache.unpin(sub, Residency.UNPINNED)

    def loaded_bytes(self, extra: str | None = None) -> int:
        """The weights of the loaded routable models (and of `extra`), each sub-model
        counted once: what a GPU holds for them."""
        names = {s.name for s in self.catalogue.routable if s.name not in self.unloaded}
        if extra is not None:
            names.add(extra)
        subs: dict[str, int] = {}
        for name in names:
            spec = self.catalogue.get(name)
            assert spec is not None
            for sub in self.catalogue.submodels(spec):
                subs[sub.name] = sub.weight_bytes
        return sum(subs.values())

    def _initial_floors(
        self, pinned: Iterable[str], *, cache_enabled: bool
    ) -> dict[str, Residency]:
        """Every model's floor at start.

        Externally managed: nothing on the device until the control plane pins
        it. Self-managed with a cache: a host copy of everything, loaded on
        demand. Self-managed without one: everything on the device for good,
        which is how the worker behaved before it had a cache.
        """
        if self.mode is ResidencyMode.EXTERNALLY_MANAGED:
            default = Residency.UNPINNED
        elif cache_enabled:
            default = Residency.PINNED_SYSTEM
        else:
            default = Residency.PINNED_DEVICE
        floors = {m.name: default for m in self.catalogue.models if not m.is_meta}
        for name in pinned:
            spec = self.catalogue.route(name)
            if spec is None:
                raise ConfigError(f"cannot pin {name!r}: the catalogue has no such model")
            for sub in self.catalogue.submodels(spec):
                floors[sub.name] = Residency.PINNED_DEVICE
        return floors

    @property
    def cache_enabled(self) -> bool:
        return self.cache.max_bytes > 0

    def residence(self, model: str) -> Residence:
        """Where a routable model's weights are now."""
        spec = self.catalogue.get(model)
        assert spec is not None
        subs = [s.name for s in self.catalogue.submodels(spec)]
        floors = [self.cache.floor(s) for s in subs]
        return Residence(
            residency=min(floors),
            device_resident=all(self.cache.is_resident(s) for s in subs),
            host_resident=all(f is not Residency.UNPINNED for f in floors),
            pinned=all(self.cache.is_pinned(s) for s in subs),
            weight_nbytes=sum(self.cache.sizes[s] for s in subs),
        )

    def is_servable(self, model: str) -> bool:
        """Whether a request for `model` may be queued now (READY in RepositoryIndex)."""
        if model in self.unloaded:
            return False
        if self.mode is ResidencyMode.SELF_MANAGED:
            return True
        return self.residence(model).device_resident

    # -- from the dispatch loop only ------------------------------------------------

    async def make_resident(self, spec: ModelSpec) -> bool:
        """Before a batch of `spec`: load it if needed. False if it may not run.

        Self-managed, a missing model is loaded (paying the time, evicting by
        LRU). Externally managed, the worker never loads on its own: a model
        unpinned while its requests waited may not run.
        """
        now = trio.current_time()
        if self.cache.is_resident(spec.name):
            self.cache.touch(spec.name, now)
            return True
        if self.mode is ResidencyMode.EXTERNALLY_MANAGED:
            return False
        load = self.cache.load(spec.name, now)
        assert load is not None
        await self._pay(spec, load)
        return True

    async def set_residency(self, model: str, target: Residency) -> None:
        """Pin a routable model on the device (paying its loads), or unpin it to `target`."""
        spec = self.catalogue.get(model)
        assert spec is not None
        changed = False
        for sub in self.catalogue.submodels(spec):
            if target is Residency.PINNED_DEVICE:
                load = self.cache.pin(sub.name)
                if load is not None:
                    changed = True
                    await self._pay(sub, load)
            else:
                changed = self.cache.unpin(sub.name, target) or changed
        if changed:
            logger.info(
                "model residency changed",
                extra={"model": model, "residency": target.name.lower()},
            )

    async def unload(self, model: str) -> None:
        """RepositoryModelUnload: `model` is gone until loaded again; its weights are freed.

        A sub-model another loaded meta still uses keeps its weights.
        """
        spec = self.catalogue.get(model)
        assert spec is not None
        self.unloaded.add(model)
        for sub in self._exclusive_submodels(spec):
            self.cache.unpin(sub, Residency.UNPINNED)
        logger.info("model unloaded", extra={"model": model})

    async def load(self, model: str) -> None:
        """RepositoryModelLoad: `model` is back as the worker started with it.

        A model the worker started pinned on the device is loaded again (paying the
        load); the others come back at their start floor, and a self-managed worker
        with a weight cache loads their weights now (paying the load, evicting the
        least recently used if it must), as a load on Triton returns once the model
        can serve; an externally managed one waits for the control plane to pin them.
        """
        spec = self.catalogue.get(model)
        assert spec is not None
        if model not in self.unloaded:
            return
        if self.gpu_memory_bytes:
            needed = self.loaded_bytes(model)
            if needed > self.gpu_memory_bytes:
                raise gpu_out_of_memory(model, needed - self.loaded_bytes(), self)
        self.unloaded.discard(model)
        for sub in self.catalogue.submodels(spec):
            floor = self._start_floors[sub.name]
            if floor is Residency.PINNED_DEVICE:
                load = self.cache.pin(sub.name)
                if load is not None:
                    await self._pay(sub, load)
            elif not self.cache.is_pinned(sub.name):
                self.cache.unpin(sub.name, floor)
                if self.cache_enabled and self.mode is ResidencyMode.SELF_MANAGED:
                    # Loaded means ready to serve, as Triton's load returns once the
                    # weights are on the GPU: the first call does not pay for them.
                    load = self.cache.load(sub.name, trio.current_time())
                    if load is not None:
                        await self._pay(sub, load)
        logger.info("model loaded", extra={"model": model})

    def _exclusive_submodels(self, spec: ModelSpec) -> list[str]:
        """`spec`'s sub-models that no other loaded routable model uses."""
        shared = {
            sub.name
            for other in self.catalogue.routable
            if other.name != spec.name and other.name not in self.unloaded
            for sub in self.catalogue.submodels(other)
        }
        return [sub.name for sub in self.catalogue.submodels(spec) if sub.name not in shared]

    async def compact(self, requested: Sequence[str]) -> tuple[int, int]:
        """CompactMemory: free every unpinned weight, then reload `requested` (self-managed).

        Names that are unknown, internal, pinned or already resident are
        skipped. A meta counts as one model reloaded when any of its sub-models
        was. Without a weight cache this is a no-op.

        Returns:
            (models reloaded, on-demand resident bytes afterwards).
        """
        before = self.cache.resident_bytes
        if not self.cache_enabled:
            return 0, before
        freed = self.cache.free_unpinned()
        self.counters.compactions += 1
        reloaded = 0
        if self.mode is ResidencyMode.SELF_MANAGED:
            for name in requested:
                spec = self.catalogue.route(name)
                if spec is None:
                    continue
                loaded = False
                for sub in self.catalogue.submodels(spec):
                    load = self.cache.load(sub.name, trio.current_time())
                    if load is not None:
                        await self._pay(sub, load)
                        loaded = True
                reloaded += loaded
        logger.info(
            "memory compacted",
            extra={
                "freed": len(freed),
                "reloaded": reloaded,
                "requested": len(requested),
                "resident_bytes_before": before,
                "resident_bytes_after": self.cache.resident_bytes,
            },
        )
        return reloaded, self.cache.resident_bytes

    async def _pay(self, spec: ModelSpec, load: Load) -> None:
        """Spend the device time of `load` and count it (its evictions already happened)."""
        self.counters.evicts += len(load.evicted)
        if load.over_budget and spec.name not in self._over_budget_warned:
            # Once per model: under thrash this would otherwise log every batch.
            self._over_budget_warned.add(spec.name)
            logger.warning(
                "model weights exceed the weight cache",
                extra={
                    "model": spec.name,
                    "weight_bytes": load.nbytes,
                    "weight_cache_bytes": self.cache.max_bytes,
                    "weight": human_bytes(load.nbytes),
                    "weight_cache": human_bytes(self.cache.max_bytes),
                },
            )
        seconds = spec.weight_load_seconds(load.nbytes, self.load_bandwidth) * self.time_scale
        if seconds > 0:
            await trio.sleep(seconds)
        self.counters.loads += 1
        self.counters.load_seconds += seconds
