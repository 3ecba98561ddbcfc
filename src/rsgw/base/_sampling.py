"""Which calls are traced: OpenTelemetry's standard samplers, decided before any span.

Pure: no clock, no random numbers of its own, no OpenTelemetry.

The SDK decides sampling inside `start_span`, so an unsampled call still pays for
making a span that records nothing, and a ModelInfer makes two (its own, and one per
attempt at a worker): at a 1% sampling rate that was most of what tracing cost a call
(docs/benchmarks.md). The gateway therefore decides first, with the rules the
specification gives the samplers `OTEL_TRACES_SAMPLER` names, and asks the SDK for
spans only for the calls it samples (the SDK's own sampler then always samples):

- `always_on` / `always_off`: every call, or none;
- `traceidratio`: a trace is sampled when the low 64 bits of its id are below
  `ratio x 2**64` (the SDK's `TraceIdRatioBased`), so every service sampling at one
  ratio keeps the same traces;
- `parentbased_*`: a call whose caller sent a valid context follows the caller's
  sampled flag; one without is decided by the named root sampler.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsgw.base._trace_context import TraceParent

#: The bits of a trace id the ratio sampler reads.
_LOW_64 = (1 << 64) - 1
_PARENT_BASED = "parentbased_"


@dataclass(frozen=True, slots=True)
class Sampling:
    """A sampler, by its `OTEL_TRACES_SAMPLER` name and argument."""

    parent_based: bool
    #: "always_on", "always_off" or "traceidratio": how a call without a parent goes.
    root: str
    #: The ratio sampler's bound on a trace id's low 64 bits.
    bound: int = 0

    @classmethod
    def named(cls, sampler: str, ratio: float = 1.0) -> Sampling:
        """The sampler a configuration names (`rsgw.config._tracing.SAMPLERS`)."""
        parent_based = sampler.startswith(_PARENT_BASED)
        root = sampler.removeprefix(_PARENT_BASED)
        if root not in ("always_on", "always_off", "traceidratio"):
            raise ValueError(f"unknown sampler {sampler!r}")
        return cls(parent_based, root, round(min(max(ratio, 0.0), 1.0) * (_LOW_64 + 1)))

    def sampled(self, parent: TraceParent | None, trace_id: int) -> bool:
        """Whether a call of trace `trace_id` (its caller's `parent`, if any) is traced."""
        if parent is not None and self.parent_based:
            return parent.sampled
        if self.root == "always_on":
            return True
        if self.root == "always_off":
            return False
        return (trace_id & _LOW_64) < self.bound
