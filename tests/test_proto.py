"""Tests for the generated protobuf modules and their private descriptor pool.

What we guard here:

* The committed `_pb2.py`/`.pyi` files are exactly what `tools/regen_protos.py`
  produces from `proto/` (so nobody edits them by hand or forgets to regenerate).
* The schema is the wire's: every service, method, message, field and enum value of
  WIRE.md exactly; everything else we declare is Triton's (the Triton-only RPCs and
  the model configuration messages), and every `inference` message, enum and method
  agrees with tritonclient's own descriptors field for field.
* rsgw and tritonclient can be imported into one process in either order, under both
  protobuf runtimes, because rsgw's files live in `rsgw._proto._pool.POOL`.
* Bytes written by one side's classes parse with the other's.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2 as triton_config_pb2
from tritonclient.grpc import service_pb2 as triton_pb2

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as ctl_pb
from rsgw._proto._pool import POOL

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import ModuleType

    from google.protobuf.descriptor import Descriptor, EnumDescriptor, FileDescriptor

REPO = Path(__file__).resolve().parent.parent
PACKAGE_DIR = REPO / "src" / "rsgw" / "_proto"
# WIRE.md lives in the shared spec folder next to the repository (also in CI); the
# test that reads it is skipped where it is absent. The tables below are its copy.
WIRE_MD = REPO.parent / "shared" / "spec" / "WIRE.md"

# WIRE.md's tables, one row per line with the cells joined by spaces: services
# ("Service Rpc Request Response"), fields ("Message number name type") and enum
# values ("enum Name number VALUE").
WIRE_ROWS = """
# inference
GRPCInferenceService ServerLive ServerLiveRequest ServerLiveResponse
GRPCInferenceService ServerReady ServerReadyRequest ServerReadyResponse
GRPCInferenceService ModelReady ModelReadyRequest ModelReadyResponse
GRPCInferenceService ServerMetadata ServerMetadataRequest ServerMetadataResponse
GRPCInferenceService ModelMetadata ModelMetadataRequest ModelMetadataResponse
GRPCInferenceService ModelInfer ModelInferRequest ModelInferResponse
GRPCInferenceService RepositoryIndex RepositoryIndexRequest RepositoryIndexResponse
GRPCInferenceService SystemSharedMemoryStatus SystemSharedMemoryStatusRequest SystemSharedMemoryStatusResponse
GRPCInferenceService SystemSharedMemoryRegister SystemSharedMemoryRegisterRequest SystemSharedMemoryRegisterResponse
GRPCInferenceService SystemSharedMemoryUnregister SystemSharedMemoryUnregisterRequest SystemSharedMemoryUnregisterResponse
GRPCInferenceService IsSameIPCNamespace IsSameIPCNamespaceRequest IsSameIPCNamespaceResponse
ServerLiveResponse 1 live bool
ServerReadyResponse 1 ready bool
ModelReadyRequest 1 name string
ModelReadyRequest 2 version string
ModelReadyResponse 1 ready bool
ServerMetadataResponse 1 name string
ServerMetadataResponse 2 version string
ServerMetadataResponse 3 extensions repeated string
ModelMetadataRequest 1 name string
ModelMetadataRequest 2 version string
ModelMetadataResponse.TensorMetadata 1 name string
ModelMetadataResponse.TensorMetadata 2 datatype string
ModelMetadataResponse.TensorMetadata 3 shape repeated int64
ModelMetadataResponse 1 name string
ModelMetadataResponse 2 versions repeated string
ModelMetadataResponse 3 platform string
ModelMetadataResponse 4 inputs repeated TensorMetadata
ModelMetadataResponse 5 outputs repeated TensorMetadata
ModelInferRequest.InferInputTensor 1 name string
ModelInferRequest.InferInputTensor 2 datatype string
ModelInferRequest.InferInputTensor 3 shape repeated int64
ModelInferRequest.InferInputTensor 4 parameters map<string, InferParameter>
ModelInferRequest.InferInputTensor 5 contents InferTensorContents
ModelInferRequest.InferRequestedOutputTensor 1 name string
ModelInferRequest.InferRequestedOutputTensor 2 parameters map<string, InferParameter>
ModelInferRequest 1 model_name string
ModelInferRequest 2 model_version string
ModelInferRequest 3 id string
ModelInferRequest 4 parameters map<string, InferParameter>
ModelInferRequest 5 inputs repeated InferInputTensor
ModelInferRequest 6 outputs repeated InferRequestedOutputTensor
ModelInferRequest 7 raw_input_contents repeated bytes
ModelInferResponse.InferOutputTensor 1 name string
ModelInferResponse.InferOutputTensor 2 datatype string
ModelInferResponse.InferOutputTensor 3 shape repeated int64
ModelInferResponse.InferOutputTensor 4 parameters map<string, InferParameter>
ModelInferResponse.InferOutputTensor 5 contents InferTensorContents
ModelInferResponse 1 model_name string
ModelInferResponse 2 model_version string
ModelInferResponse 3 id string
ModelInferResponse 4 parameters map<string, InferParameter>
ModelInferResponse 5 outputs repeated InferOutputTensor
ModelInferResponse 6 raw_output_contents repeated bytes
InferParameter 1 bool_param bool (oneof parameter_choice)
InferParameter 2 int64_param int64 (oneof parameter_choice)
InferParameter 3 string_param string (oneof parameter_choice)
InferTensorContents 1 bool_contents repeated bool
InferTensorContents 2 int_contents repeated int32
InferTensorContents 3 int64_contents repeated int64
InferTensorContents 4 uint_contents repeated uint32
InferTensorContents 5 uint64_contents repeated uint64
InferTensorContents 6 fp32_contents repeated float
InferTensorContents 7 fp64_contents repeated double
InferTensorContents 8 bytes_contents repeated bytes
SystemSharedMemoryStatusRequest 1 name string
SystemSharedMemoryStatusResponse.RegionStatus 1 name string
SystemSharedMemoryStatusResponse.RegionStatus 2 key string
SystemSharedMemoryStatusResponse.RegionStatus 3 offset uint64
SystemSharedMemoryStatusResponse.RegionStatus 4 byte_size uint64
SystemSharedMemoryStatusResponse 1 regions map<string, RegionStatus>
SystemSharedMemoryRegisterRequest 1 name string
SystemSharedMemoryRegisterRequest 2 key string
SystemSharedMemoryRegisterRequest 3 offset uint64
SystemSharedMemoryRegisterRequest 4 byte_size uint64
SystemSharedMemoryUnregisterRequest 1 name string
IsSameIPCNamespaceRequest 1 name string
IsSameIPCNamespaceResponse 1 same bool
RepositoryIndexRequest 1 repository_name string
RepositoryIndexRequest 2 ready bool
RepositoryIndexResponse.ModelIndex 1 name string
RepositoryIndexResponse.ModelIndex 2 version string
RepositoryIndexResponse.ModelIndex 3 state string
RepositoryIndexResponse.ModelIndex 4 reason string
RepositoryIndexResponse 1 models repeated ModelIndex
# reactant_control
ControlService ModelControlStatus ModelControlStatusRequest ModelControlStatusResponse
ControlService SetModelResidency SetModelResidencyRequest SetModelResidencyResponse
ControlService SetModelPolicy SetModelPolicyRequest SetModelPolicyResponse
ControlService CompactMemory CompactMemoryRequest CompactMemoryResponse
GatewayControlService GetSchedulingStatus GetSchedulingStatusRequest GetSchedulingStatusResponse
GatewayControlService SetSchedulingPolicy SetSchedulingPolicyRequest SetSchedulingPolicyResponse
GatewayControlService SetModelPlacement SetModelPlacementRequest SetModelPlacementResponse
GatewayControlService Repack RepackRequest RepackResponse
enum Residency 0 RESIDENCY_UNSPECIFIED
enum Residency 1 UNPINNED
enum Residency 2 PINNED_SYSTEM
enum Residency 3 PINNED_DEVICE
ModelStatus 1 name string
ModelStatus 2 residency Residency
ModelStatus 3 device_resident bool
ModelStatus 4 host_resident bool
ModelStatus 5 weight_nbytes int64
ModelStatus 6 weight double
ModelStatus 7 queue_depth int64
ModelStatus 8 total_compute_seconds double
ModelStatus 9 requests_served uint64
ModelStatus 10 dispatch_count uint64
ModelStatus 11 max_batch_size int64
ModelStatus 12 batch_input_name string
ModelStatus 13 batch_axis int64
ModelStatus 14 rows_served uint64
ModelControlStatusResponse 1 residency_mode string
ModelControlStatusResponse 2 discipline string
ModelControlStatusResponse 3 models repeated ModelStatus
ModelControlStatusResponse 4 weight_cache_max_bytes uint64
SetModelResidencyRequest 1 name string
SetModelResidencyRequest 2 target Residency
SetModelResidencyResponse 1 residency Residency
SetModelPolicyRequest 1 name string
SetModelPolicyRequest 2 has_weight bool
SetModelPolicyRequest 3 weight double
CompactMemoryRequest 1 reload_models repeated string
CompactMemoryResponse 1 reloaded_models int64
CompactMemoryResponse 2 resident_bytes_after uint64
SchedulingPolicy 1 rebalance_compute_seconds double
SchedulingPolicy 2 first_rebalance_compute_seconds double
SchedulingPolicy 3 hysteresis double
SchedulingPolicy 4 ema_halflife_compute_seconds double
SchedulingPolicy 5 default_replicas int64
SchedulingPolicy 6 routing_policy string
SchedulingPolicy 7 routing_fill_factor double
SchedulingPolicy 8 routing_fill_mode string
SchedulingPolicy 9 compaction_mode string
SchedulingPolicy 10 compaction_interval int64
SchedulingPolicy 11 forbid_memory_oversubscription bool
SchedulingPolicy 12 generation uint64
SchedulingPolicy 13 work_basis string
RepackStatus 1 last_repack_unix_seconds double
RepackStatus 2 last_repack_wall_elapsed_seconds double
RepackStatus 3 last_repack_compute_seconds double
RepackStatus 4 last_trigger string
RepackStatus 5 last_models_placed int64
RepackStatus 6 last_models_moved int64
RepackStatus 7 repack_count uint64
RepackStatus 8 compute_accumulated_seconds double
RepackStatus 9 active_threshold_seconds double
RepackStatus 10 first_tick_repack_done bool
RepackStatus 11 last_tick_unix_seconds double
RepackStatus 12 repacks_since_compaction int64
RepackStatus 13 operator_repacks_requested uint64
RepackStatus 14 operator_repacks_completed uint64
ReplicaPlacement 1 worker string
ReplicaPlacement 2 weight double
ReplicaPlacement 3 outstanding int64
ReplicaPlacement 4 routed_total int64
ModelSchedulingStatus 1 name string
ModelSchedulingStatus 2 configured_replicas int64
ModelSchedulingStatus 3 effective_replicas int64
ModelSchedulingStatus 4 replicas repeated ReplicaPlacement
ModelSchedulingStatus 5 utilization double
ModelSchedulingStatus 6 arrival_rate double
ModelSchedulingStatus 7 cost_seconds double
ModelSchedulingStatus 8 max_batch int64
ModelSchedulingStatus 9 fill_mode string
ModelSchedulingStatus 10 fill_quantum int64
ModelSchedulingStatus 11 weight_nbytes int64
ModelSchedulingStatus 12 placed bool
ModelSchedulingStatus 13 drifted bool
WorkerSchedulingStatus 1 worker string
WorkerSchedulingStatus 2 ready bool
WorkerSchedulingStatus 3 models_placed int64
WorkerSchedulingStatus 4 inflight_compute double
WorkerSchedulingStatus 5 assigned_weight_bytes int64
WorkerSchedulingStatus 6 weight_budget_bytes int64
WorkerSchedulingStatus 7 oversubscribed bool
GetSchedulingStatusResponse 1 mode string
GetSchedulingStatusResponse 2 policy SchedulingPolicy
GetSchedulingStatusResponse 3 repack RepackStatus
GetSchedulingStatusResponse 4 models repeated ModelSchedulingStatus
GetSchedulingStatusResponse 5 workers repeated WorkerSchedulingStatus
GetSchedulingStatusResponse 6 warnings repeated string
SetSchedulingPolicyRequest 1 update_mask repeated string
SetSchedulingPolicyRequest 2 policy SchedulingPolicy
SetSchedulingPolicyResponse 1 applied SchedulingPolicy
SetSchedulingPolicyResponse 2 warnings repeated string
SetSchedulingPolicyResponse 3 persisted bool
SetModelPlacementRequest 1 name string
SetModelPlacementRequest 2 replicas int64
SetModelPlacementRequest 3 fill_mode string
SetModelPlacementRequest 4 fill_factor double
SetModelPlacementRequest 5 allow_unknown_model bool
SetModelPlacementResponse 1 name string
SetModelPlacementResponse 2 configured_replicas int64
SetModelPlacementResponse 3 effective_replicas int64
SetModelPlacementResponse 4 fill_mode string
SetModelPlacementResponse 5 fill_quantum int64
SetModelPlacementResponse 6 warnings repeated string
SetModelPlacementResponse 7 persisted bool
RepackRequest 1 wait_seconds double
RepackResponse 1 sequence uint64
RepackResponse 2 completed_sequence uint64
RepackResponse 3 completed bool
RepackResponse 4 waited_seconds double
RepackResponse 5 repack RepackStatus
RepackResponse 6 warnings repeated string
"""  # noqa: E501  (rows are kept whole, as in WIRE.md)

# WIRE.md's list of messages without fields.
EMPTY_MESSAGES = frozenset(
    {
        "inference.ServerLiveRequest",
        "inference.ServerReadyRequest",
        "inference.ServerMetadataRequest",
        "inference.SystemSharedMemoryRegisterResponse",
        "inference.SystemSharedMemoryUnregisterResponse",
        "reactant_control.ModelControlStatusRequest",
        "reactant_control.SetModelPolicyResponse",
        "reactant_control.GetSchedulingStatusRequest",
    }
)

# Fields beyond WIRE.md that rsgw declares because Triton has them (checked against
# tritonclient below): Triton's two further parameter kinds.
TRITON_FIELDS = frozenset(
    {("inference.InferParameter", "double_param"), ("inference.InferParameter", "uint64_param")}
)

_SCALAR_NAMES = {
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_DOUBLE: "double",
}


class Wire(NamedTuple):
    """WIRE.md as data, keyed by full protobuf names."""

    methods: dict[str, tuple[str, str]]  # "pkg.Service.Rpc" -> (request, response)
    fields: dict[str, dict[int, tuple[str, str]]]  # "pkg.Msg" -> {number: (name, type)}
    enums: dict[str, dict[int, str]]  # "pkg.Enum" -> {number: value name}


def parse_wire_rows(text: str) -> Wire:
    """Parse WIRE_ROWS (or WIRE.md converted by `wire_md_rows`) into a `Wire`."""
    wire = Wire({}, {}, {})
    package = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# "):
            package = line[2:].strip()
            continue
        tokens = line.split()
        if tokens[0] == "enum":
            wire.enums.setdefault(f"{package}.{tokens[1]}", {})[int(tokens[2])] = tokens[3]
        elif tokens[1].isdigit():
            table = wire.fields.setdefault(f"{package}.{tokens[0]}", {})
            table[int(tokens[1])] = (tokens[2], " ".join(tokens[3:]))
        else:
            service, rpc, request, response = tokens
            wire.methods[f"{package}.{service}.{rpc}"] = (
                f"{package}.{request}",
                f"{package}.{response}",
            )
    return wire


def wire_md_rows(markdown: str) -> tuple[str, set[str]]:
    """Turn WIRE.md's tables into WIRE_ROWS' format; also return its empty messages."""
    out: list[str] = []
    empty: set[str] = set()
    for line in markdown.splitlines():
        if line.startswith("## "):
            out.append("# " + line.split("package `")[1].rstrip("`"))
        elif line.startswith("| ") and not line.startswith(("| service ", "| message ")):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            out.append(" ".join(cell for cell in cells if cell))
        elif line.startswith("Empty messages"):
            names = line.split(":", 1)[1].strip().rstrip(".")
            empty = {name.strip() for name in names.split(",")}
    return "\n".join(out), empty


WIRE = parse_wire_rows(WIRE_ROWS)

# rsgw's own additions to WIRE.md, made by issues (an issue wins over WIRE.md): the
# membership RPCs and the members in the status of issue 24, what each member
# implements (issue 36), how a coordinated gateway stands (issue 39), which
# models are resident and what each worker's budget holds (issue 49), and the tenants'
# policies and use (issue 52).
RSGW_ROWS = """
# reactant_control
GatewayControlService AddWorker AddWorkerRequest AddWorkerResponse
GatewayControlService RemoveWorker RemoveWorkerRequest RemoveWorkerResponse
AddWorkerRequest 1 address string
AddWorkerRequest 2 name string
AddWorkerRequest 3 metrics string
AddWorkerResponse 1 worker string
AddWorkerResponse 2 workers int64
RemoveWorkerRequest 1 worker string
RemoveWorkerRequest 2 drain_seconds double
RemoveWorkerResponse 1 worker string
RemoveWorkerResponse 2 calls_cut_short int64
RemoveWorkerResponse 3 drained_seconds double
RemoveWorkerResponse 4 workers int64
GetSchedulingStatusResponse 7 members repeated Member
Member 1 worker string
Member 2 address string
Member 3 public_name string
Member 4 source string
Member 5 ready bool
Member 6 inflight int64
Member 7 capabilities repeated string
Member 8 counters string
GetSchedulingStatusResponse 8 coordination Coordination
Coordination 1 state string
Coordination 2 member string
Coordination 3 placer string
Coordination 4 epoch int64
Coordination 5 members repeated string
Coordination 6 last_error string
Coordination 7 seconds_since_contact double
Coordination 8 etcd_endpoints repeated string
ModelSchedulingStatus 14 residency string
WorkerSchedulingStatus 8 resident_weight_bytes int64
GatewayControlService SetTenantPolicy SetTenantPolicyRequest SetTenantPolicyResponse
GetSchedulingStatusResponse 9 tenancy TenancyStatus
TenantPolicy 1 weight double
TenantPolicy 2 priority int64
TenantPolicy 3 rate double
TenantPolicy 4 burst double
TenantPolicy 5 max_concurrent int64
TenantStatus 1 tenant string
TenantStatus 2 listed bool
TenantStatus 3 policy TenantPolicy
TenantStatus 4 inflight int64
TenantStatus 5 admitted uint64
TenantStatus 6 refused uint64
TenantStatus 7 over_quota uint64
TenantStatus 8 share double
TenancyStatus 1 header string
TenancyStatus 2 priority_levels int64
TenancyStatus 3 default_priority int64
TenancyStatus 4 max_tenant_series int64
TenancyStatus 5 default TenantPolicy
TenancyStatus 6 tenants repeated TenantStatus
SetTenantPolicyRequest 1 tenant string
SetTenantPolicyRequest 2 update_mask repeated string
SetTenantPolicyRequest 3 policy TenantPolicy
SetTenantPolicyResponse 1 tenant string
SetTenantPolicyResponse 2 applied TenantPolicy
SetTenantPolicyResponse 3 warnings repeated string
SetTenantPolicyResponse 4 persisted bool
"""

#: What the protos must declare: WIRE.md and rsgw's additions.
SCHEMA = parse_wire_rows(WIRE_ROWS + RSGW_ROWS)
FILES: tuple[FileDescriptor, ...] = (pb.DESCRIPTOR, ctl_pb.DESCRIPTOR)
#: tritonclient's descriptors: its service file and its model configuration file.
TRITON_POOLS = triton_pb2.DESCRIPTOR.pool
TRITON_SERVICE = triton_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def walk_messages(file: FileDescriptor) -> Iterator[Descriptor]:
    """Every message of `file`, nested ones included, map entries included."""

    def walk(message: Descriptor) -> Iterator[Descriptor]:
        yield message
        for nested in message.nested_types:
            yield from walk(nested)

    for top in file.message_types_by_name.values():
        yield from walk(top)


def is_map_entry(message: Descriptor) -> bool:
    return bool(message.GetOptions().map_entry)


def type_name(field: FieldDescriptor, scope: Descriptor) -> str:
    """A field's type as WIRE.md writes it; `scope` is the message holding the field."""
    target: Descriptor | EnumDescriptor
    if field.message_type is not None:
        target = field.message_type
    elif field.enum_type is not None:
        target = field.enum_type
    else:
        return _SCALAR_NAMES[field.type]
    # WIRE.md names top-level types and types nested in the same message by their
    # short name; anything else would need the qualified name.
    if target.containing_type is None or target.containing_type is scope:
        return str(target.name)
    return str(target.full_name).removeprefix(target.file.package + ".")


def describe(field: FieldDescriptor) -> str:
    """Render a field's type, label, map-ness and oneof in WIRE.md's notation."""
    scope = field.containing_type
    assert scope is not None
    entry = field.message_type
    if entry is not None and is_map_entry(entry):
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return f"map<{type_name(key, scope)}, {type_name(value, scope)}>"
    text = type_name(field, scope)
    if field.is_repeated:
        text = "repeated " + text
    if field.containing_oneof is not None:
        text += f" (oneof {field.containing_oneof.name})"
    return text


def load_regen() -> ModuleType:
    """Import tools/regen_protos.py, which is a script, not part of the package."""
    spec = importlib.util.spec_from_file_location(
        "regen_protos", REPO / "tools" / "regen_protos.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- Generated files are current --------------------------------------------------------


def test_committed_generated_files_are_current(tmp_path: Path) -> None:
    regen = load_regen()
    fresh = regen.generate(tmp_path)
    assert sorted(p.name for p in fresh) == sorted(
        f"{stem}_pb2.{suffix}"
        for stem in (
            "grpc_predict_v2",
            "reactant_control_v1",
            "grpc_health_v1",
            "grpc_reflection_v1",
            "grpc_reflection_v1alpha",
            "etcd_v3",
        )
        for suffix in ("py", "pyi")
    )
    stale = [
        p.name
        for p in fresh
        if not (PACKAGE_DIR / p.name).is_file()
        or (PACKAGE_DIR / p.name).read_bytes() != p.read_bytes()
    ]
    assert not stale, f"stale generated files {stale}: run python tools/regen_protos.py"
    # And no stray generated modules (such as _pb2_grpc stubs) in the package.
    assert regen.find_unexpected(PACKAGE_DIR, {p.name for p in fresh}) == []


def test_check_flag_passes_on_the_committed_tree() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "regen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_check_names_stale_and_unexpected_files(tmp_path: Path) -> None:
    regen = load_regen()
    regen.generate(tmp_path)
    assert regen.find_stale(tmp_path) == []
    (tmp_path / "reactant_control_v1_pb2.py").unlink()
    (tmp_path / "reactant_control_v1_pb2.pyi").write_text("# hand edited\n")
    (tmp_path / "grpc_predict_v2_pb2_grpc.py").write_text("")
    assert [p.name for p in regen.find_stale(tmp_path)] == [
        "reactant_control_v1_pb2.py",  # missing
        "reactant_control_v1_pb2.pyi",  # differs
        "grpc_predict_v2_pb2_grpc.py",  # not ours
    ]


def test_postprocess_refuses_unfamiliar_protoc_output() -> None:
    regen = load_regen()
    with pytest.raises(regen.RegenError, match="expected 1"):
        regen.postprocess_pb2("DESCRIPTOR = object()\n", "x.proto")


# --- Private pool ------------------------------------------------------------------------


def test_generated_files_live_in_the_private_pool_only() -> None:
    assert POOL is not descriptor_pool.Default()  # type: ignore[no-untyped-call]  # stubs 6.x
    for file in FILES:
        assert file.pool is POOL
        # Standalone files: in particular the control proto does not import inference.
        assert list(file.dependencies) == []
        with pytest.raises(KeyError):
            descriptor_pool.Default().FindFileByName(file.name)  # type: ignore[no-untyped-call]
    assert (
        POOL.FindMessageTypeByName("inference.ModelInferRequest")  # type: ignore[no-untyped-call]
        is pb.ModelInferRequest.DESCRIPTOR
    )


_COEXIST_SCRIPT = textwrap.dedent(
    """
    import sys

    from google.protobuf import descriptor_pool
    from google.protobuf.internal import api_implementation

    def import_rsgw():
        from rsgw._proto import grpc_predict_v2_pb2, reactant_control_v1_pb2
        return grpc_predict_v2_pb2, reactant_control_v1_pb2

    def import_tritonclient():
        import tritonclient.grpc
        from tritonclient.grpc import service_pb2
        tritonclient.grpc.InferenceServerClient("127.0.0.1:1")  # usable, not just importable
        return service_pb2

    if sys.argv[1] == "tritonclient-first":
        triton = import_tritonclient()
        pb, ctl = import_rsgw()
    else:
        pb, ctl = import_rsgw()
        triton = import_tritonclient()

    # Each side resolves `inference` in its own pool.
    default = descriptor_pool.Default()
    assert default.FindMessageTypeByName("inference.ModelInferRequest").file.name == (
        triton.DESCRIPTOR.name
    )
    assert pb.ModelInferRequest.DESCRIPTOR.file.pool is not default
    try:
        default.FindMessageTypeByName("reactant_control.ModelStatus")
    except KeyError:
        pass
    else:
        raise AssertionError("rsgw's control file leaked into the default pool")

    ours = pb.ModelInferRequest(model_name="m", id="7", raw_input_contents=[b"\\x00\\x01"])
    ours.parameters["sequence_id"].int64_param = 3
    ours.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    theirs = triton.ModelInferRequest.FromString(ours.SerializeToString())
    assert theirs.parameters["sequence_id"].int64_param == 3
    assert list(theirs.inputs[0].shape) == [1, 2]
    assert pb.ModelInferRequest.FromString(theirs.SerializeToString()) == ours

    status = ctl.ModelControlStatusResponse(discipline="fair")
    status.models.add(name="m", residency=ctl.PINNED_DEVICE)
    assert ctl.ModelControlStatusResponse.FromString(status.SerializeToString()) == status
    print(api_implementation.Type())
    """
)


@pytest.mark.parametrize("implementation", ["default", "python"])
@pytest.mark.parametrize("order", ["tritonclient-first", "rsgw-first"])
def test_coexists_with_tritonclient(order: str, implementation: str) -> None:
    """Import both in one process; a shared pool would fail with a duplicate symbol.

    The pure-Python runtime is included because it is the one where protobuf's stock
    builder would have registered our classes in the default pool after all.
    """
    env = dict(os.environ)
    env.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)
    if implementation != "default":
        env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = implementation
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", _COEXIST_SCRIPT, order],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    if implementation != "default":
        assert result.stdout.strip() == implementation


def test_messages_pickle() -> None:
    """Classes carry their real module name (protoc would write the bare file name)."""
    import pickle

    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x")
    assert pickle.loads(pickle.dumps(request)) == request
    assert pb.ModelInferRequest.InferInputTensor.__module__ == "rsgw._proto.grpc_predict_v2_pb2"


# --- Schema is SCHEMA.md -------------------------------------------------------------------


def test_messages_and_fields_match_wire() -> None:
    declared = {
        str(message.full_name): message
        for file in FILES
        for message in walk_messages(file)
        if not is_map_entry(message)
    }
    wire = set(SCHEMA.fields) | EMPTY_MESSAGES
    assert wire <= set(declared)
    for name in wire:
        fields = {
            f.number: (str(f.name), describe(f))
            for f in declared[name].fields
            if (name, str(f.name)) not in TRITON_FIELDS
        }
        assert fields == SCHEMA.fields.get(name, {}), name
    # Everything else is Triton's (and matches tritonclient: see the tests below).
    beyond = {name for name in set(declared) - wire if name.startswith("inference.")}
    assert beyond == set(declared) - wire
    assert {name for name in beyond if triton_message(name) is None} == set()


def test_enums_match_wire() -> None:
    declared = {str(e.full_name): e for file in FILES for e in file.enum_types_by_name.values()}
    nested = {str(e.full_name) for file in FILES for m in walk_messages(file) for e in m.enum_types}
    assert set(SCHEMA.enums) <= set(declared)
    for name, values in SCHEMA.enums.items():
        assert {v.number: str(v.name) for v in declared[name].values} == values
    # Every other enum, top-level or nested, is Triton's model configuration's.
    for name in (set(declared) - set(SCHEMA.enums)) | nested:
        assert name.startswith("inference."), name
        theirs = TRITON_POOLS.FindEnumTypeByName(name)
        ours = POOL.FindEnumTypeByName(name)  # type: ignore[no-untyped-call]  # stubs 6.x
        assert {v.number: v.name for v in ours.values} == {
            v.number: v.name for v in theirs.values
        }, name


def test_services_match_wire() -> None:
    methods = {
        str(method.full_name): method
        for file in FILES
        for service in file.services_by_name.values()
        for method in service.methods
    }
    assert set(SCHEMA.methods) <= set(methods)
    for name, method in methods.items():
        assert POOL.FindMethodByName(name) is method  # type: ignore[no-untyped-call]  # stubs 6.x
        if name in SCHEMA.methods:
            assert (method.input_type.full_name, method.output_type.full_name) == SCHEMA.methods[
                name
            ]
            assert not method.client_streaming
            assert not method.server_streaming
            continue
        # A Triton-only method: the same types and streaming as tritonclient's.
        theirs = TRITON_SERVICE.methods_by_name[method.name]
        assert name.startswith("inference.GRPCInferenceService."), name
        assert (method.input_type.full_name, method.output_type.full_name) == (
            theirs.input_type.full_name,
            theirs.output_type.full_name,
        )
        assert (method.client_streaming, method.server_streaming) == (
            theirs.client_streaming,
            theirs.server_streaming,
        )
    # We serve every RPC of Triton's service (and IsSameIPCNamespace besides).
    ours = {m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    assert ours - {m.name for m in TRITON_SERVICE.methods} == {"IsSameIPCNamespace"}
    assert {m.name for m in TRITON_SERVICE.methods} <= ours
    # Every message a method names is declared (the tables are consistent).
    for request, response in SCHEMA.methods.values():
        assert {request, response} <= set(SCHEMA.fields) | EMPTY_MESSAGES


@pytest.mark.skipif(not WIRE_MD.is_file(), reason="shared/spec/WIRE.md not beside the repo")
def test_wire_rows_are_a_faithful_copy_of_wire_md() -> None:
    rows, empty = wire_md_rows(WIRE_MD.read_text(encoding="utf-8"))
    assert parse_wire_rows(rows) == WIRE
    assert empty == {name.split(".", 1)[1] for name in EMPTY_MESSAGES}


# --- Agreement with tritonclient -----------------------------------------------------------


def triton_message(name: str) -> Descriptor | None:
    try:
        message: Descriptor = TRITON_POOLS.FindMessageTypeByName(name)
    except KeyError:
        return None
    return message


def test_inference_messages_match_tritonclient() -> None:
    compared: list[str] = []
    missing: list[str] = []
    for message in walk_messages(pb.DESCRIPTOR):
        name = str(message.full_name)
        theirs = triton_message(name)
        if theirs is None:
            missing.append(name)
            continue
        assert theirs.file.name in {triton_pb2.DESCRIPTOR.name, triton_config_pb2.DESCRIPTOR.name}
        compared.append(name)
        assert is_map_entry(message) == is_map_entry(theirs), name

        def signature(field: FieldDescriptor) -> tuple[object, ...]:
            return (
                str(field.name),
                field.type,
                field.is_repeated,
                field.is_required,
                field.message_type.full_name if field.message_type else None,
                field.enum_type.full_name if field.enum_type else None,
                field.containing_oneof.name if field.containing_oneof else None,
            )

        ours_by_number = {f.number: signature(f) for f in message.fields}
        theirs_by_number = {f.number: signature(f) for f in theirs.fields}
        assert ours_by_number == theirs_by_number, name
    assert sorted(missing) == [
        "inference.IsSameIPCNamespaceRequest",
        "inference.IsSameIPCNamespaceResponse",
    ]
    # Every message of tritonclient's two files is ours too, map entries included.
    theirs_all = {
        str(m.full_name)
        for module in (triton_pb2, triton_config_pb2)
        for m in walk_messages(module.DESCRIPTOR)
    }
    assert theirs_all == set(compared)
    assert "inference.ModelInferRequest.InferInputTensor.ParametersEntry" in compared
    assert "inference.ModelConfig" in compared


def build_request(module: ModuleType) -> Any:
    """A ModelInferRequest using every field, built with `module`'s classes."""
    request = module.ModelInferRequest(model_name="resnet", model_version="2", id="req-1")
    request.parameters["sequence_id"].int64_param = 42
    request.parameters["sequence_start"].bool_param = True
    request.parameters["priority_label"].string_param = "high"
    image = request.inputs.add(name="image", datatype="FP32", shape=[2, 3])
    image.parameters["shared_memory_region"].string_param = "region0"
    label = request.inputs.add(name="label", datatype="BYTES", shape=[1])
    label.contents.bytes_contents.append(b"cat")
    label.contents.int64_contents.extend([-1, 2**40])
    label.contents.fp32_contents.append(0.5)
    output = request.outputs.add(name="probs")
    output.parameters["classification"].int64_param = 3
    request.raw_input_contents.append(bytes(range(24)))
    return request


def build_response(module: ModuleType) -> Any:
    response = module.ModelInferResponse(model_name="resnet", model_version="2", id="req-1")
    response.parameters["triton_final_response"].bool_param = True
    probs = response.outputs.add(name="probs", datatype="UINT64", shape=[1, 2])
    probs.contents.uint64_contents.extend([2**63, 1])
    probs.contents.fp64_contents.append(-0.25)
    probs.parameters["binary_data_size"].int64_param = 16
    response.raw_output_contents.append(b"\x00" * 16)
    return response


@pytest.mark.parametrize("build", [build_request, build_response])
@pytest.mark.parametrize("direction", ["tritonclient->rsgw", "rsgw->tritonclient"])
def test_bytes_cross_between_tritonclient_and_rsgw(
    direction: str, build: Callable[[ModuleType], Any]
) -> None:
    source, target = (triton_pb2, pb) if direction == "tritonclient->rsgw" else (pb, triton_pb2)
    wire = build(source).SerializeToString(deterministic=True)
    parsed = type(build(target)).FromString(wire)
    assert parsed == build(target)
    assert parsed.SerializeToString(deterministic=True) == wire


def test_triton_parameter_kinds_cross_both_ways() -> None:
    """Triton's double/uint64 parameters (sequence ids may come as uint64) are ours too."""
    request = triton_pb2.ModelInferRequest(model_name="m")
    request.parameters["temperature"].double_param = 0.7
    request.inputs.add(name="x").parameters["seed"].uint64_param = 2**64 - 1
    wire = request.SerializeToString(deterministic=True)
    ours = pb.ModelInferRequest.FromString(wire)
    assert ours.parameters["temperature"].double_param == 0.7
    assert ours.inputs[0].parameters["seed"].uint64_param == 2**64 - 1
    assert ours.SerializeToString(deterministic=True) == wire
