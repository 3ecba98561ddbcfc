"""The gateway's sampling decision is the OpenTelemetry SDK's (`rsgw.base._sampling`).

The SDK's own samplers are the oracle: for every sampler name, ratio, caller context
(or none) and trace id, `Sampling.sampled` answers what the SDK's `should_sample`
decides, so a gateway that decides before asking the SDK for spans traces exactly
the calls the SDK would have.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import sampling
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from rsgw.base._sampling import Sampling
from rsgw.base._trace_context import TraceParent
from rsgw.config._tracing import SAMPLERS

ids = st.integers(1, (1 << 128) - 1)
span_ids = st.integers(1, (1 << 64) - 1)
ratios = st.one_of(st.sampled_from([0.0, 0.01, 0.5, 1.0]), st.floats(0.0, 1.0))
parents = st.one_of(st.none(), st.builds(TraceParent, ids, span_ids, st.sampled_from([0, 1])))


def sdk_sampler(name: str, ratio: float) -> sampling.Sampler:
    ratio_based = sampling.TraceIdRatioBased(ratio)
    return {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "traceidratio": ratio_based,
        "parentbased_always_on": sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": sampling.ParentBased(ratio_based),
    }[name]


@given(st.sampled_from(SAMPLERS), ratios, parents, ids)
def test_the_decision_is_the_sdks(
    name: str, ratio: float, parent: TraceParent | None, root_id: int
) -> None:
    trace_id = root_id if parent is None else parent.trace_id
    context = None
    if parent is not None:
        remote = SpanContext(
            parent.trace_id, parent.span_id, is_remote=True, trace_flags=TraceFlags(parent.flags)
        )
        context = trace.set_span_in_context(NonRecordingSpan(remote))
    sdk = sdk_sampler(name, ratio).should_sample(context, trace_id, "ModelInfer")
    assert Sampling.named(name, ratio).sampled(parent, trace_id) == (
        sdk.decision is sampling.Decision.RECORD_AND_SAMPLE
    )


def test_an_unknown_sampler_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown sampler 'parentbased_sometimes'"):
        Sampling.named("parentbased_sometimes")
