"""What each worker implements of the KServe V2 / Triton API, as data routing reads.

Pure. Workers differ: Triton implements the whole Triton API, rsgw's worker that
and ReactantServer's ControlService, MLServer neither shared memory nor model
configuration nor statistics, KServe's ModelServer not even RepositoryIndex or
streaming. Every worker answers the core the gateway needs of all of them
(readiness, metadata, ModelInfer); the rest is a `Capability`, one per optional part,
that a worker has or lacks.

The gateway learns them by asking (`rsgw.gateway.fleet._capability_probe`: one harmless
call per capability when a worker connects, again after it reconnects) and keeps
them in a `CapabilityTable`, swapped whole like the routing table. Resolution and
fan-outs read it: a call goes only to workers that implement its method, and a
method no worker implements is answered UNIMPLEMENTED in the worker's own words.

What an answer says (`learned_from`): a reply, or any status but UNIMPLEMENTED,
means the method is there (the worker ran it and said something about the
request); UNIMPLEMENTED means it is not; no answer (unreachable, a deadline, a
shed) teaches nothing, and what was known stays. A capability never learned counts
as present: the call goes, and the worker answers what it answers.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from rsgw.base._methods import Method
from rsgw.base._status import StatusCode


class Capability(enum.Enum):
    """An optional part of the API: the methods it covers are in `NEEDS`."""

    REPOSITORY_INDEX = "repository_index"
    STREAMING = "streaming"
    MODEL_CONFIG = "model_config"
    STATISTICS = "statistics"
    MODEL_CONTROL = "model_control"
    SYSTEM_SHARED_MEMORY = "system_shared_memory"
    CUDA_SHARED_MEMORY = "cuda_shared_memory"
    IPC_NAMESPACE = "ipc_namespace"
    CONTROL_PLANE = "control_plane"

    def __str__(self) -> str:
        return self.value


#: The capability each optional method needs; a method not listed is one every
#: worker answers (ServerLive/Ready/Metadata, ModelReady/Metadata, ModelInfer).
NEEDS: Mapping[Method, Capability] = MappingProxyType(
    {
        Method.REPOSITORY_INDEX: Capability.REPOSITORY_INDEX,
        Method.MODEL_STREAM_INFER: Capability.STREAMING,
        Method.MODEL_CONFIG: Capability.MODEL_CONFIG,
        Method.MODEL_STATISTICS: Capability.STATISTICS,
        Method.REPOSITORY_MODEL_LOAD: Capability.MODEL_CONTROL,
        Method.REPOSITORY_MODEL_UNLOAD: Capability.MODEL_CONTROL,
        Method.SHM_STATUS: Capability.SYSTEM_SHARED_MEMORY,
        Method.SHM_REGISTER: Capability.SYSTEM_SHARED_MEMORY,
        Method.SHM_UNREGISTER: Capability.SYSTEM_SHARED_MEMORY,
        Method.CUDA_SHM_STATUS: Capability.CUDA_SHARED_MEMORY,
        Method.CUDA_SHM_REGISTER: Capability.CUDA_SHARED_MEMORY,
        Method.CUDA_SHM_UNREGISTER: Capability.CUDA_SHARED_MEMORY,
        Method.IPC_NAMESPACE: Capability.IPC_NAMESPACE,
        Method.MODEL_CONTROL_STATUS: Capability.CONTROL_PLANE,
        Method.SET_MODEL_RESIDENCY: Capability.CONTROL_PLANE,
        Method.SET_MODEL_POLICY: Capability.CONTROL_PLANE,
        Method.COMPACT_MEMORY: Capability.CONTROL_PLANE,
    }
)

#: Answers that say nothing about the method: the call did not reach it, or the
#: worker refused the call before looking at it.
_SILENT = frozenset(
    {
        StatusCode.UNAVAILABLE,
        StatusCode.DEADLINE_EXCEEDED,
        StatusCode.CANCELLED,
        StatusCode.RESOURCE_EXHAUSTED,
        StatusCode.UNAUTHENTICATED,
        StatusCode.PERMISSION_DENIED,
    }
)


def learned_from(code: StatusCode | None) -> bool | None:
    """What one answer says of the method it answered: True (implemented), False
    (UNIMPLEMENTED), None (nothing: see the module docstring). `code` is None for
    no answer at all (the worker could not be reached)."""
    if code is None or code in _SILENT:
        return None
    return code is not StatusCode.UNIMPLEMENTED


@dataclass(frozen=True, slots=True)
class WorkerCapabilities:
    """What one worker was found to implement, and not to."""

    #: The capabilities it answered.
    has: frozenset[Capability] = frozenset()
    #: The ones it answered UNIMPLEMENTED, with what it said.
    lacks: Mapping[Capability, str] = field(default_factory=lambda: MappingProxyType({}))

    def implements(self, capability: Capability) -> bool:
        """Whether a call that needs `capability` may go to this worker (never
        learned counts as yes)."""
        return capability not in self.lacks

    def learn(
        self, capability: Capability, implemented: bool | None, said: str = ""
    ) -> WorkerCapabilities:
        """This worker's knowledge after one more answer (`learned_from`'s verdict)."""
        if implemented is None:
            return self
        if implemented:
            if capability in self.has and capability not in self.lacks:
                return self
            lacks = {c: m for c, m in self.lacks.items() if c is not capability}
            return WorkerCapabilities(self.has | {capability}, MappingProxyType(lacks))
        if self.lacks.get(capability) == said and capability not in self.has:
            return self
        return WorkerCapabilities(
            self.has - {capability}, MappingProxyType({**self.lacks, capability: said})
        )

    def names(self) -> tuple[str, ...]:
        """The capabilities it has, by name, in `Capability` order (for status)."""
        return tuple(str(c) for c in Capability if c in self.has and c not in self.lacks)


_UNKNOWN = WorkerCapabilities()


@dataclass(frozen=True, slots=True)
class CapabilityTable:
    """Every worker's capabilities; replaced, never changed (swapped by reference)."""

    workers: Mapping[str, WorkerCapabilities] = field(default_factory=lambda: MappingProxyType({}))

    def of(self, url: str) -> WorkerCapabilities:
        return self.workers.get(url, _UNKNOWN)

    def can(self, url: str, method: Method) -> bool:
        """Whether `url` may be sent `method`."""
        capability = NEEDS.get(method)
        return capability is None or self.of(url).implements(capability)

    def able(self, urls: Iterable[str], method: Method) -> tuple[str, ...]:
        """Those of `urls` that may be sent `method`, in their order."""
        capability = NEEDS.get(method)
        if capability is None:
            return tuple(urls)
        return tuple(url for url in urls if self.of(url).implements(capability))

    def loadable(self, urls: Iterable[str]) -> tuple[str, ...]:
        """Those of `urls` lpt_packing places by loading and unloading models: no
        ReactantServer control plane, but a repository index and model control."""
        return tuple(
            url
            for url in urls
            if not self.of(url).implements(Capability.CONTROL_PLANE)
            and self.of(url).implements(Capability.REPOSITORY_INDEX)
            and self.of(url).implements(Capability.MODEL_CONTROL)
        )

    def refusal(self, urls: Iterable[str], method: Method) -> str:
        """Why `method` cannot go to `urls`, in the words the first that lacks it said
        of its capability (the message of a call UNIMPLEMENTED at the gateway)."""
        capability = NEEDS.get(method)
        said = ""
        if capability is not None:
            said = next(
                (s for url in urls if (s := self.of(url).lacks.get(capability)) is not None),
                "",
            )
        return f"no worker implements {method.rpc}" + (f" ({said})" if said else "")

    def learn(
        self, url: str, capability: Capability, implemented: bool | None, said: str = ""
    ) -> CapabilityTable:
        """This table after `url` answered once more for `capability`."""
        before = self.of(url)
        after = before.learn(capability, implemented, said)
        if after is before:
            return self
        return CapabilityTable(MappingProxyType({**self.workers, url: after}))

    def learn_all(
        self, url: str, verdicts: Mapping[Capability, tuple[bool | None, str]]
    ) -> CapabilityTable:
        """This table after one probe of `url`: (verdict, what it said) per capability."""
        before = after = self.of(url)
        for capability, (implemented, said) in verdicts.items():
            after = after.learn(capability, implemented, said)
        if after is before:
            return self
        return CapabilityTable(MappingProxyType({**self.workers, url: after}))

    def without(self, url: str) -> CapabilityTable:
        """This table without `url` (it left the pool)."""
        if url not in self.workers:
            return self
        return CapabilityTable(
            MappingProxyType({u: c for u, c in self.workers.items() if u != url})
        )
