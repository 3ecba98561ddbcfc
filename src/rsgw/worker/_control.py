"""The worker's model control: rsgw's ControlService and Triton's explicit model control.

ControlService is how the gateway's lpt_packing steers a worker (where weights
live, fair weights, compaction); RepositoryModelLoad / Unload are Triton's, for
operators and clients that manage models themselves. Every handler validates
here and hands the device a command it runs between batches (`_device.py`), so no
batch loses its weights mid-run.

Unload takes a model away until it is loaded again: RepositoryIndex lists it
UNAVAILABLE ("unloaded"), ModelReady is false, every other call naming it is
UNAVAILABLE in Triton's words, and requests already queued for it fail. Load
brings it back as the worker started with it. Both are idempotent, as Triton's
are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import FailedPrecondition, GrpcError, InvalidRequest, NotFound
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.grpc._typed import typed_unary
from rsgw.worker._triton import config_override
from rsgw.worker.device._weights import Residency, ResidencyMode

if TYPE_CHECKING:
    from collections.abc import Callable

    from rsgw.base._call import CallContext, UnaryHandler
    from rsgw.worker.device._device import Device
    from rsgw.worker.models._specs import ModelSpec

#: The targets SetModelResidency accepts (RESIDENCY_UNSPECIFIED is not one).
_RESIDENCIES = frozenset(int(r) for r in Residency)


class ModelControl:
    """The control handlers of one worker named `name`, over its device.

    `on_unloaded` is told of each model unloaded (its live sequences go with it).
    """

    def __init__(
        self, name: str, device: Device, on_unloaded: Callable[[str], None] | None = None
    ) -> None:
        self.name = name
        self.device = device
        self.catalogue = device.catalogue
        self._on_unloaded = on_unloaded

    def handlers(self) -> dict[Method, UnaryHandler]:
        return {
            Method.MODEL_CONTROL_STATUS: typed_unary(cpb.ModelControlStatusRequest, self.status),
            Method.SET_MODEL_RESIDENCY: typed_unary(
                cpb.SetModelResidencyRequest, self.set_residency
            ),
            Method.SET_MODEL_POLICY: typed_unary(cpb.SetModelPolicyRequest, self.set_policy),
            Method.COMPACT_MEMORY: typed_unary(cpb.CompactMemoryRequest, self.compact_memory),
            Method.REPOSITORY_MODEL_LOAD: typed_unary(pb.RepositoryModelLoadRequest, self.load),
            Method.REPOSITORY_MODEL_UNLOAD: typed_unary(
                pb.RepositoryModelUnloadRequest, self.unload
            ),
        }

    async def status(
        self, _: cpb.ModelControlStatusRequest, __: CallContext
    ) -> cpb.ModelControlStatusResponse:
        device = self.device
        response = cpb.ModelControlStatusResponse(
            residency_mode=device.residency_mode.value,
            discipline=device.discipline.value,
            weight_cache_max_bytes=device.memory.cache.max_bytes,
        )
        for spec in self.catalogue.routable:
            if spec.name in device.memory.unloaded:
                continue
            counters = device.counters[spec.name]
            residence = device.memory.residence(spec.name)
            # A meta is one unit with no batch axis of its own (docs/original.md §8.2).
            batched = not spec.is_meta
            response.models.add(
                name=spec.name,
                residency=residence.residency.name,
                device_resident=residence.device_resident,
                host_resident=residence.host_resident,
                weight_nbytes=residence.weight_nbytes,
                weight=device.weight(spec.name),
                queue_depth=device.queue_depth(spec.name),
                total_compute_seconds=counters.total_compute_seconds,
                requests_served=counters.requests_served,
                dispatch_count=counters.dispatch_count,
                max_batch_size=spec.max_batch_size if batched else 0,
                batch_input_name=spec.batch_input if batched else "",
                batch_axis=spec.batch_axis if batched else 0,
                rows_served=counters.rows_served,
            )
        return response

    async def set_residency(
        self, request: cpb.SetModelResidencyRequest, _: CallContext
    ) -> cpb.SetModelResidencyResponse:
        if self.device.residency_mode is not ResidencyMode.EXTERNALLY_MANAGED:
            raise FailedPrecondition(
                f"worker {self.name} manages its own weights "
                "(--residency-mode self_managed); SetModelResidency needs externally_managed"
            )
        spec = self.device.model(request.name)
        if request.target not in _RESIDENCIES:
            raise InvalidRequest(
                f"SetModelResidency target must be UNPINNED, PINNED_SYSTEM or PINNED_DEVICE, "
                f"got {_residency_name(request.target)}"
            )
        residency = await self.device.set_residency(spec.name, Residency(request.target))
        return cpb.SetModelResidencyResponse(residency=residency.name)

    async def set_policy(
        self, request: cpb.SetModelPolicyRequest, _: CallContext
    ) -> cpb.SetModelPolicyResponse:
        spec = self.device.model(request.name)
        if request.has_weight:
            self.device.set_weight(spec.name, request.weight)
        return cpb.SetModelPolicyResponse()

    async def compact_memory(
        self, request: cpb.CompactMemoryRequest, _: CallContext
    ) -> cpb.CompactMemoryResponse:
        reloaded, resident = await self.device.compact(request.reload_models)
        return cpb.CompactMemoryResponse(reloaded_models=reloaded, resident_bytes_after=resident)

    async def load(
        self, request: pb.RepositoryModelLoadRequest, _: CallContext
    ) -> pb.RepositoryModelLoadResponse:
        """Load a catalogue model, as configured there or with a `config` override.

        Triton also takes model files (`file:<path>` parameters); a simulated worker
        has only its catalogue, so those fail the way Triton fails a repository it
        cannot poll (INTERNAL), saying why.
        """
        spec = self._known(request.model_name, "load")
        parameters = request.parameters
        files = sorted(key for key in parameters if key.startswith("file:"))
        if files:
            raise GrpcError(
                StatusCode.INTERNAL,
                f"failed to load '{spec.name}', failed to poll from model repository: this "
                f"worker serves models from its catalogue and takes no model files "
                f"(got {files[0][:64]!r})",
            )
        unknown = sorted(key for key in parameters if key != "config")
        if unknown:
            raise InvalidRequest(f"failed to load '{spec.name}': unknown parameter {unknown[0]!r}")
        override = None
        if "config" in parameters:
            override = config_override(spec, parameters["config"].string_param)
        await self.device.load(spec.name, override)
        return pb.RepositoryModelLoadResponse()

    async def unload(
        self, request: pb.RepositoryModelUnloadRequest, _: CallContext
    ) -> pb.RepositoryModelUnloadResponse:
        spec = self._known(request.model_name, "unload")
        await self.device.unload(spec.name)
        if self._on_unloaded is not None:
            self._on_unloaded(spec.name)
        return pb.RepositoryModelUnloadResponse()

    def _known(self, name: str, action: str) -> ModelSpec:
        spec = self.catalogue.route(name)
        if spec is None:
            raise NotFound(f"failed to {action} '{name}', no such model in the repository")
        return spec


def _residency_name(value: int) -> str:
    try:
        return str(cpb.Residency.Name(value))
    except ValueError:  # an enum value this proto does not know
        return str(value)
