"""The private descriptor pool that rsgw's generated protobuf modules build into.

`tritonclient.grpc` (and any other stock KServe client) adds a file defining package
`inference` to protobuf's process-wide default pool. A second file defining the same
full names there fails at import with a "duplicate symbol" error, whichever module
comes second. We could rename our package, but then our descriptors would no longer
carry the wire's full names (`inference.ModelInferRequest`), which matter to
reflection and to anything that prints or looks up type names.

So `tools/regen_protos.py` post-processes the generated `*_pb2.py` modules next to
this one in two places:

* `descriptor_pool.Default().AddSerializedFile(...)` becomes
  `POOL.AddSerializedFile(...)`, so our files live in `POOL` alone.
* `builder.BuildTopDescriptorsAndMessages(...)` becomes `build_messages(...)`. The
  stock builder also registers every class in the default symbol database; with the
  pure-Python protobuf runtime (`PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`) that
  adds our descriptors to the default pool after all and fails with "Conflict
  register" next to tritonclient. (The default upb runtime ignores that step, which
  is why the problem hides there.)

Message classes built this way serialize to exactly the same bytes as tritonclient's,
so the two interoperate on the wire while never sharing a symbol table.

Anything that resolves types by name for rsgw's messages (for example
`google.protobuf.json_format` with `Any`, or a reflection service) must be handed
`POOL` explicitly; the default pool and symbol database do not know our files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pool, message, reflection
from google.protobuf.internal import enum_type_wrapper

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor, FileDescriptor

# One pool for all of rsgw's generated files, so that a future file importing
# another of ours (say, a control proto reusing an inference message) resolves its
# dependency here rather than in the default pool.
POOL = descriptor_pool.DescriptorPool()

# What the stock builder calls to make a message class (upb's or pure Python's
# metaclass, whichever runtime is active). Typed `Any` because types-protobuf leaves
# its constructor untyped.
_MESSAGE_METACLASS: Any = reflection.GeneratedProtocolMessageType


def build_messages(file_des: FileDescriptor, module_name: str, module: dict[str, Any]) -> None:
    """Create a generated module's enums, service descriptors and message classes.

    This is `google.protobuf.internal.builder.BuildTopDescriptorsAndMessages` (protobuf
    6.33) minus its registration in the default symbol database; see the module
    docstring for why that registration breaks coexistence. It sets the same globals
    the stock builder does, so the rest of protoc's module works unchanged. Classes
    get the module's real dotted name, which also lets messages be pickled.

    Args:
      file_des: The file descriptor, already added to `POOL`.
      module_name: The generated module's `__name__`, for the classes' `__module__`.
      module: The generated module's `globals()`, filled in place.

    Raises:
      ValueError: if the file declares extensions, which proto3 files here never do
        and which this builder does not handle.
    """
    if file_des.extensions_by_name:
        raise ValueError(f"{file_des.name}: extensions are not supported by rsgw's builder")

    def build_message(msg_des: Descriptor, prefix: str) -> type[message.Message]:
        namespace: dict[str, Any] = {
            name: build_message(nested, f"{prefix}{msg_des.name}.")
            for name, nested in msg_des.nested_types_by_name.items()
        }
        namespace["DESCRIPTOR"] = msg_des
        namespace["__module__"] = module_name
        namespace["__qualname__"] = prefix + msg_des.name
        cls: type[message.Message] = _MESSAGE_METACLASS(msg_des.name, (message.Message,), namespace)
        return cls

    for name, enum_des in file_des.enum_types_by_name.items():
        module["_" + name.upper()] = enum_des
        module[name] = enum_type_wrapper.EnumTypeWrapper(enum_des)
        for value in enum_des.values:
            module[value.name] = value.number
    for name, service_des in file_des.services_by_name.items():
        module["_" + name.upper()] = service_des
    for name, msg_des in file_des.message_types_by_name.items():
        module[name] = build_message(msg_des, "")
