"""`rsgw simulate`'s engine: the gateway's cores and the worker's cost model in virtual time.

The scenarios are bench/fleet's own files; the runs are short (20 s + 15 s virtual), so
each takes about a second of real time.
"""

from __future__ import annotations

import pytest
import yaml

from rsgw.simulate import _engine, _offered
from rsgw.simulate import _scenario as sc
from rsgw.simulate._device import SimCall, SimDevice
from rsgw.simulate._results import RunResult
from rsgw.worker.device._batching import Discipline
from rsgw.worker.models._catalogue import parse_catalogue
from tests.simulate.cli import SCENARIOS

#: bench/fleet's warm-up (lpt_packing repacks in its first seconds), a shorter window.
SHORT = sc.RunSettings(warmup_s=20.0, measure_s=15.0)


@pytest.fixture(scope="module")
def memory_bound() -> tuple[sc.Scenario, _offered.Load]:
    scenario = sc.load_scenario(SCENARIOS / "memory_bound.yaml")
    return scenario, _offered.derive_load(scenario)


def simulate(
    case: tuple[sc.Scenario, _offered.Load], mode: str, fraction: float = 0.7, **kwargs: object
) -> RunResult:
    scenario, load = case
    return _engine.run(scenario, mode, fraction, 1, 1001, load, SHORT, **kwargs)  # type: ignore[arg-type]


def test_a_run_is_deterministic_for_its_seed(
    memory_bound: tuple[sc.Scenario, _offered.Load],
) -> None:
    first = simulate(memory_bound, "lpt_packing").to_json()
    assert simulate(memory_bound, "lpt_packing").to_json() == first
    assert first["sent"] > 0 and first["offered_rps"] > 0


def test_memory_bound_ranks_the_modes_as_measured(
    memory_bound: tuple[sc.Scenario, _offered.Load],
) -> None:
    """bench/fleet measured lpt_packing answering ~99% within the SLO with no eviction,
    the other modes thrashing weights and answering ~3%; the simulation agrees."""
    rr = simulate(memory_bound, "round_robin")
    lo = simulate(memory_bound, "least_outstanding")
    lpt = simulate(memory_bound, "lpt_packing")
    assert lpt.goodput_rps > 10 * max(rr.goodput_rps, lo.goodput_rps, 1.0)
    assert lpt.goodput_rps > 0.9 * lpt.offered_rps
    assert rr.evicts > 20 and lo.evicts > 20
    assert lpt.first_repack_s is not None and lpt.placement
    assert all(len(models) == 3 for models in lpt.placement.values())


def test_a_small_admission_cap_sheds_with_the_gateways_status(
    memory_bound: tuple[sc.Scenario, _offered.Load],
) -> None:
    capped = simulate(memory_bound, "lpt_packing", 1.0, admission_cap=2)
    assert capped.errors.get("RESOURCE_EXHAUSTED", 0) > 0
    assert capped.shed_fraction > 0


def device(yaml_text: str, budget: int, time_scale: float = 1.0) -> SimDevice:
    catalogue = parse_catalogue(yaml.safe_load(yaml_text), source="test")
    specs = {m.name: m for m in catalogue.models}
    return SimDevice("w0", specs, Discipline.FIFO, budget, time_scale)


MODELS = """
models:
""" + "".join(
    f"""
  - name: {name}
    max_batch_size: 4
    launch_ms: 10
    item_ms: 1
    load_ms: 100
    weight_bytes: 600
    inputs: [{{name: INPUT0, datatype: FP32, shape: [-1, 4]}}]
    outputs: [{{name: OUTPUT0, datatype: FP32, shape: [-1, 4]}}]
"""
    for name in ("a", "b")
)


def test_a_batch_costs_launch_plus_rows_and_a_load_first_then_lru_evicts() -> None:
    """The worker's cost model, times the time scale: 100 ms load, then 10 + 1 x 3 ms."""
    gpu = device(MODELS, budget=1000, time_scale=2.0)
    calls = [SimCall(i, "a", 0.0, 99.0) for i in range(3)]
    for call in calls:
        gpu.enqueue(call, 0.0)
    started, expired = gpu.start(0.0)
    assert started is not None and not expired
    assert started.rows == 3 and started.ends == pytest.approx(2 * (0.100 + 0.013))
    assert gpu.start(0.0) == (None, [])  # busy: nothing new starts
    done = gpu.finish()
    assert done.calls == tuple(calls)
    assert gpu.counters["loads"] == 1 and gpu.counters["compute_s"] == pytest.approx(0.026)
    gpu.enqueue(SimCall(3, "b", 1.0, 99.0), 1.0)  # b does not fit beside a: a is evicted
    started, _ = gpu.start(1.0)
    assert started is not None and gpu.counters["evicts"] == 1


def test_a_call_given_up_while_queued_never_runs() -> None:
    gpu = device(MODELS, budget=0)
    running = SimCall(0, "a", 0.0, 99.0)
    gpu.enqueue(running, 0.0)
    gpu.start(0.0)
    waiting = SimCall(1, "a", 0.0, 99.0)
    gpu.enqueue(waiting, 0.0)
    gpu.withdraw(waiting)
    gpu.finish()
    assert gpu.start(0.02) == (None, [])
    assert gpu.counters["requests"] == 1 and gpu.counters["loads"] == 0  # budget 0: resident


def test_resized_scenarios_keep_popularity_and_weight_fraction() -> None:
    scenario = sc.load_scenario(SCENARIOS / "memory_bound.yaml")
    big = scenario.resized(64, 1000)
    assert big.workers == 64 and big.count == 1000 and len(big.shares) == 1000
    assert big.weight_bytes * big.count == pytest.approx(
        scenario.weight_fraction * 64 * scenario.budget_bytes, rel=1e-6
    )
    assert big.shares[0] > big.shares[1] > big.shares[-1]
    shifting = sc.load_scenario(SCENARIOS / "shifting.yaml").resized(8, 40)
    assert len(shifting.phases[0].shares) == 40
    assert shifting.phases[0].shares[-1] > shifting.phases[0].shares[0]  # still reversed
    with pytest.raises(sc.ScenarioError, match="--models needs a zipf popularity"):
        sc.load_scenario(SCENARIOS / "hot_replicas.yaml").resized(4, 20)


def test_a_long_chain_of_sheds_does_not_recurse(
    memory_bound: tuple[sc.Scenario, _offered.Load],
) -> None:
    """Every ended call admits a waiting one, which lpt_packing may shed at once, which
    admits the next: under a deep overload that chain is thousands long, so the engine
    loops (it recursed, and a 64-GPU run died of RecursionError)."""
    import inspect
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 40)
    try:
        run = simulate(memory_bound, "lpt_packing", 3.0, admission_cap=1)
    finally:
        sys.setrecursionlimit(limit)
    assert run.shed_fraction > 0.3
