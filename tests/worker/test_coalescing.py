"""The simulated device coalesces concurrent requests into batches (issue acceptance 4).

An in-process worker with a model whose launch cost (200 ms) dwarfs its
per-row cost, so while one batch executes the next requests queue up and leave
together. We check the outcome through ModelControlStatus, as the gateway reads
it, and check every response's numbers, so coalescing can never mix up whose
outputs are whose. All 64 requests go out at once on one channel, each from its
own task, so all are on the wire before the first answer.

Runs on memory streams with the autojump clock (`tests.worker.client`): the
device's compute takes its exact simulated time on the Trio clock and no wall
time, so the timings below are exact, not lower bounds.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import ConfigError
from rsgw.worker._triton import model_config
from rsgw.worker._worker import WorkerConfig
from tests.helpers import catalogue_from_yaml, infer_request, output_array
from tests.worker.client import WorkerClient, open_memory_worker

LAUNCH_SECONDS = 0.2
ITEM_SECONDS = 0.001
MAX_BATCH = 16


def _add_sub(name: str, max_batch: int, launch_ms: float, item_ms: float, extra: str = "") -> str:
    """One `add_sub` model of [-1, 4] INT32 tensors, as a catalogue YAML entry."""

    def tensors(stem: str) -> str:
        return ", ".join(f"{{name: {stem}{i}, datatype: INT32, shape: [-1, 4]}}" for i in (0, 1))

    return (
        f"  - name: {name}\n    inputs: [{tensors('INPUT')}]\n"
        f"    outputs: [{tensors('OUTPUT')}]\n"
        f"    max_batch_size: {max_batch}\n    launch_ms: {launch_ms}\n    item_ms: {item_ms}\n"
        f"    compute: add_sub\n{extra}"
    )


CATALOGUE = catalogue_from_yaml(
    "models:\n"
    + _add_sub("batched", MAX_BATCH, LAUNCH_SECONDS * 1000, ITEM_SECONDS * 1000)
    + _add_sub("scaled", 8, 20, 5)
    + _add_sub("delayed", 8, 20, 1, "    max_queue_delay_microseconds: 50000\n")
    + _add_sub(
        "preferred",
        8,
        20,
        1,
        "    max_queue_delay_microseconds: 50000\n    preferred_batch_size: [2]\n",
    ),
    with_builtin=False,
)


def _config(*, time_scale: float = 1.0) -> WorkerConfig:
    return WorkerConfig(port=0, metrics_port=-1, catalogue=CATALOGUE, time_scale=time_scale)


def _request(model: str, index: int, rows: int = 1) -> pb.ModelInferRequest:
    """Request `index`: INPUT0 is all `index`, so its answer is recognisably its own."""
    a = np.full((rows, 4), index, dtype=np.int32)
    b = np.arange(rows * 4, dtype=np.int32).reshape(rows, 4)
    return infer_request(model, {"INPUT0": a, "INPUT1": b}, request_id=str(index))


def _check_answer(response: pb.ModelInferResponse, index: int, rows: int = 1) -> None:
    a = np.full((rows, 4), index, dtype=np.int32)
    b = np.arange(rows * 4, dtype=np.int32).reshape(rows, 4)
    assert response.id == str(index)
    np.testing.assert_array_equal(output_array(response, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(response, "OUTPUT1"), a - b)


async def _infer_concurrently(
    client: WorkerClient, requests: list[pb.ModelInferRequest]
) -> list[pb.ModelInferResponse]:
    """Start every call before waiting for any (one task per call, one channel)."""
    responses: list[pb.ModelInferResponse | None] = [None] * len(requests)

    async def infer(i: int) -> None:
        responses[i] = await client.infer(requests[i], time_limit=30)

    async with trio.open_nursery() as nursery:
        for i in range(len(requests)):
            nursery.start_soon(infer, i)
    assert all(r is not None for r in responses)
    return [r for r in responses if r is not None]


async def test_concurrent_requests_coalesce(autojump_clock: MockClock) -> None:
    async with open_memory_worker(_config()) as client:
        requests = [_request("batched", i) for i in range(64)]

        started = trio.current_time()
        responses = await _infer_concurrently(client, requests)
        elapsed = trio.current_time() - started

        for i, response in enumerate(responses):
            _check_answer(response, i)
        status = await client.model_status("batched")
        assert status.requests_served == 64
        assert status.rows_served == 64
        # At least ceil(64 / 16) = 4 batches. At most 5: the first dispatch may
        # leave with only the first arrivals, and the others queue behind it
        # for 200 ms, which is ample for them to arrive, and leave in four.
        assert 4 <= status.dispatch_count <= 5
        assert status.max_batch_size == MAX_BATCH
        assert status.queue_depth == 0
        assert status.total_compute_seconds == pytest.approx(
            status.dispatch_count * LAUNCH_SECONDS + 64 * ITEM_SECONDS
        )
        # Every request arrived at once, so the device ran its batches back to
        # back: the last answer came exactly when its compute ended.
        assert elapsed == pytest.approx(status.total_compute_seconds)

        # A pre-batched request: 8 rows, one request, one dispatch.
        before = status
        started = trio.current_time()
        response = await client.infer(_request("batched", 99, rows=8))
        elapsed = trio.current_time() - started
        _check_answer(response, 99, rows=8)
        after = await client.model_status("batched")
        assert after.rows_served == before.rows_served + 8
        assert after.requests_served == before.requests_served + 1
        assert after.dispatch_count == before.dispatch_count + 1
        assert after.total_compute_seconds - before.total_compute_seconds == pytest.approx(
            LAUNCH_SECONDS + 8 * ITEM_SECONDS
        )
        assert elapsed == pytest.approx(LAUNCH_SECONDS + 8 * ITEM_SECONDS)


async def _compute_seconds(time_scale: float, rows: int) -> tuple[float, float]:
    """Run one `rows`-row request on a fresh worker; its compute seconds and Trio time."""
    async with open_memory_worker(_config(time_scale=time_scale)) as client:
        started = trio.current_time()
        response = await client.infer(_request("scaled", 3, rows))
        elapsed = trio.current_time() - started
        _check_answer(response, 3, rows)
        status = await client.model_status("scaled")
    assert status.dispatch_count == 1
    return status.total_compute_seconds, elapsed


async def test_time_scale_multiplies_compute_time(autojump_clock: MockClock) -> None:
    rows = 4
    unscaled = 0.020 + 0.005 * rows  # launch_ms 20, item_ms 5
    once, once_elapsed = await _compute_seconds(1.0, rows)
    twice, twice_elapsed = await _compute_seconds(2.0, rows)
    assert once == pytest.approx(unscaled)
    assert twice == pytest.approx(2 * once)
    # The device really is busy that long: the call returns exactly when it is done.
    assert once_elapsed == pytest.approx(unscaled)
    assert twice_elapsed == pytest.approx(2 * unscaled)


async def _staggered(client: WorkerClient, model: str, gap: float) -> list[float]:
    """Two calls `gap` seconds apart; when each answered, from the first send."""
    started = trio.current_time()
    answered: list[float] = [0.0, 0.0]

    async def infer(i: int) -> None:
        await trio.sleep(i * gap)
        _check_answer(await client.infer(_request(model, i)), i)
        answered[i] = trio.current_time() - started

    async with trio.open_nursery() as nursery:
        for i in range(2):
            nursery.start_soon(infer, i)
    return answered


async def test_max_queue_delay_holds_a_batch_until_it_fills_or_times_out(
    autojump_clock: MockClock,
) -> None:
    async with open_memory_worker(_config()) as client:
        # Held 50 ms from the first arrival: both leave together, in one dispatch.
        answered = await _staggered(client, "delayed", gap=0.010)
        assert answered == pytest.approx([0.050 + 0.022, 0.050 + 0.022])
        status = await client.model_status("delayed")
        assert (status.dispatch_count, status.rows_served) == (1, 2)
        # A preferred size leaves as soon as it is formed: at the second arrival.
        answered = await _staggered(client, "preferred", gap=0.010)
        assert answered == pytest.approx([0.010 + 0.022, 0.010 + 0.022])
        # Without a delay the first request leaves alone (eager, today's default).
        answered = await _staggered(client, "scaled", gap=0.010)
        assert answered[0] == pytest.approx(0.025)
        assert (await client.model_status("scaled")).dispatch_count == 2


def test_model_config_reports_the_dynamic_batcher() -> None:
    preferred, eager = CATALOGUE.get("preferred"), CATALOGUE.get("scaled")
    assert preferred is not None and eager is not None
    config = model_config(preferred, "0")
    assert list(config.dynamic_batching.preferred_batch_size) == [2]
    assert config.dynamic_batching.max_queue_delay_microseconds == 50000
    assert model_config(eager, "0").dynamic_batching.max_queue_delay_microseconds == 0


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ("preferred_batch_size: [9]", "entries must be integers in 1..max_batch_size (8)"),
        ("preferred_batch_size: [2]", "needs max_queue_delay_microseconds > 0"),
        ("preferred_batch_size: 2\n    max_queue_delay_microseconds: 5", "must be a list"),
        ("max_queue_delay_microseconds: -1", "max_queue_delay_microseconds must be an integer"),
    ],
)
def test_bad_dynamic_batching_names_the_key(extra: str, fragment: str) -> None:
    text = (
        "models:\n  - name: m\n    inputs: [{name: INPUT0, datatype: FP32, shape: [-1, 4]}]\n"
        "    outputs: [{name: OUTPUT0, datatype: FP32, shape: [-1, 4]}]\n"
        f"    max_batch_size: 8\n    {extra}\n"
    )
    with pytest.raises(ConfigError) as caught:
        catalogue_from_yaml(text, with_builtin=False)
    assert "models[0]." in str(caught.value) and fragment in str(caught.value)
