"""Every gRPC method rsgw serves or calls: one registry of paths.

Pure. A path is spelled once, here; servers register handlers by `Method` (their
handler tables are keyed by it) and clients call `Method.X.wire`. The `rpc` name is
what the metrics call a method (`gateway_requests_total{rpc="ModelInfer"}`). The
services and names are those of proto/ (KServe V2 `inference`, ReactantServer's
`reactant_control`).
"""

from __future__ import annotations

import enum

INFERENCE = "inference.GRPCInferenceService"
CONTROL = "reactant_control.ControlService"
GATEWAY_CONTROL = "reactant_control.GatewayControlService"


class Method(enum.Enum):
    """A gRPC method: its service, its name, and its path in both spellings."""

    # KServe V2 data plane (and Triton's extensions), as workers and the gateway serve it.
    SERVER_LIVE = (INFERENCE, "ServerLive")
    SERVER_READY = (INFERENCE, "ServerReady")
    MODEL_READY = (INFERENCE, "ModelReady")
    SERVER_METADATA = (INFERENCE, "ServerMetadata")
    MODEL_METADATA = (INFERENCE, "ModelMetadata")
    REPOSITORY_INDEX = (INFERENCE, "RepositoryIndex")
    MODEL_INFER = (INFERENCE, "ModelInfer")
    MODEL_STREAM_INFER = (INFERENCE, "ModelStreamInfer")
    MODEL_CONFIG = (INFERENCE, "ModelConfig")
    MODEL_STATISTICS = (INFERENCE, "ModelStatistics")
    REPOSITORY_MODEL_LOAD = (INFERENCE, "RepositoryModelLoad")
    REPOSITORY_MODEL_UNLOAD = (INFERENCE, "RepositoryModelUnload")
    SHM_STATUS = (INFERENCE, "SystemSharedMemoryStatus")
    SHM_REGISTER = (INFERENCE, "SystemSharedMemoryRegister")
    SHM_UNREGISTER = (INFERENCE, "SystemSharedMemoryUnregister")
    CUDA_SHM_STATUS = (INFERENCE, "CudaSharedMemoryStatus")
    CUDA_SHM_REGISTER = (INFERENCE, "CudaSharedMemoryRegister")
    CUDA_SHM_UNREGISTER = (INFERENCE, "CudaSharedMemoryUnregister")
    TRACE_SETTING = (INFERENCE, "TraceSetting")
    LOG_SETTINGS = (INFERENCE, "LogSettings")
    IPC_NAMESPACE = (INFERENCE, "IsSameIPCNamespace")
    # ReactantServer's worker control plane.
    MODEL_CONTROL_STATUS = (CONTROL, "ModelControlStatus")
    SET_MODEL_RESIDENCY = (CONTROL, "SetModelResidency")
    SET_MODEL_POLICY = (CONTROL, "SetModelPolicy")
    COMPACT_MEMORY = (CONTROL, "CompactMemory")
    # The gateway's own control plane.
    GET_SCHEDULING_STATUS = (GATEWAY_CONTROL, "GetSchedulingStatus")
    SET_SCHEDULING_POLICY = (GATEWAY_CONTROL, "SetSchedulingPolicy")
    SET_MODEL_PLACEMENT = (GATEWAY_CONTROL, "SetModelPlacement")
    REPACK = (GATEWAY_CONTROL, "Repack")
    ADD_WORKER = (GATEWAY_CONTROL, "AddWorker")
    REMOVE_WORKER = (GATEWAY_CONTROL, "RemoveWorker")
    SET_TENANT_POLICY = (GATEWAY_CONTROL, "SetTenantPolicy")

    def __init__(self, service: str, rpc: str) -> None:
        self.service = service
        self.rpc = rpc
        #: `/package.Service/Method`, as handler tables and HTTP/2 `:path` spell it.
        self.path = f"/{service}/{rpc}"
        self.wire = self.path.encode()


#: Every method by its wire path (the listener's refusals are counted by name).
METHODS_BY_PATH: dict[bytes, Method] = {method.wire: method for method in Method}
