"""ModelControlStatus as the gateway reads it, from workers configured by `rsgw worker` flags.

Issue 3, acceptance 4 and 5: the batch locator of each built-in GPU-shaped model
in wire order (axis last, axis first, none on the first input), the meta as one
unit (max batch 0, no locator, its sub-models' weights summed, one row per
request), the worker-level fields following the flags, and counters that only
grow within a worker and start from zero in a new one. Then the admission cap:
past `--max-concurrent-requests` calls in flight, the next fails at once.

Runs on memory streams with the autojump clock (`tests.worker.client`). Each
worker serves the config the CLI's own code builds from the flags
(`cli_worker_config`), in-process instead of in a subprocess, so "at once" is
exact on the Trio clock and a 1.5 s batch costs no wall time.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import ConfigError, GrpcError
from rsgw.base._status import StatusCode
from rsgw.worker.device._memory import DEFAULT_LOAD_BANDWIDTH
from rsgw.worker.models._catalogue import builtin_catalogue
from tests.helpers import infer_request, output_array, wait_until_async
from tests.worker.client import cli_worker_config, grpc_error, open_memory_worker, scrape

MIB = 1 << 20
#: Where every worker here listens: any gRPC port, no admin HTTP server.
MEMORY_FLAGS = ("--port", "0", "--metrics-port", "-1")


async def test_batch_locators_metas_and_counters_across_a_restart(
    autojump_clock: MockClock,
) -> None:
    flags = ("--discipline", "edf", "--weight-cache-bytes", "512MiB", "--time-scale", "0.5")
    config = cli_worker_config(*MEMORY_FLAGS, *flags)
    async with open_memory_worker(config) as client:
        response = await client.control_status()
        assert (response.residency_mode, response.discipline) == ("self_managed", "edf")
        assert response.weight_cache_max_bytes == 512 * MIB
        status = {m.name: m for m in response.models}
        assert sorted(status) == [m.name for m in builtin_catalogue().routable]
        assert "search_embedder" not in status and "search_scorer" not in status
        locators = {
            name: (m.max_batch_size, m.batch_input_name, m.batch_axis) for name, m in status.items()
        }
        assert locators["image_classifier"] == (32, "IMAGE", 4)  # last in the wire shape
        assert locators["text_encoder"] == (16, "input_ids", 1)  # first
        assert locators["reranker"] == (64, "passages", 1)  # the first input has none
        assert locators["search_pipeline"] == (0, "", 0)  # a meta: one unit, no locator
        pipe = status["search_pipeline"]
        assert pipe.weight_nbytes == (64 + 32) * MIB
        assert (pipe.residency, pipe.device_resident, pipe.host_resident) == (
            cpb.PINNED_SYSTEM,
            False,
            True,
        )

        image = np.zeros((3, 64, 64, 2), np.float32)
        answer = await client.infer(infer_request("image_classifier", {"IMAGE": image}))
        assert output_array(answer, "LOGITS").shape == (1000, 2)
        passages = {"query": np.zeros(64, np.int64), "passages": np.zeros((5, 64), np.int64)}
        answer = await client.infer(infer_request("reranker", passages))
        assert output_array(answer, "SCORES").shape == (5,)
        before = await client.statuses()
        # Its compute is its sub-calls' device time: (2 + 0.3 x 4) + (1.5 + 0.2 x 4) ms
        # per request at time scale 0.5, since each ran alone.
        per_request = 0.5 * (3.2 + 2.3) / 1000
        elapsed: list[float] = []
        for _ in range(3):
            query = {"query_ids": np.zeros((4, 32), np.int64)}
            started = trio.current_time()
            answer = await client.infer(infer_request("search_pipeline", query))
            elapsed.append(trio.current_time() - started)
            assert output_array(answer, "TOP_SCORES").shape == (4, 10)
        # The first call also loaded the sub-models' 96 MiB (at 8 GiB/s, time scale
        # 0.5); the others only ran.
        load = 0.5 * pipe.weight_nbytes / DEFAULT_LOAD_BANDWIDTH
        assert elapsed == pytest.approx([load + per_request, per_request, per_request])
        code, message = await grpc_error(client.model_metadata("search_scorer"))
        assert (code, message) == (
            StatusCode.NOT_FOUND,
            "Request for unknown model: 'search_scorer' is not found",
        )
        assert not await client.model_ready("search_scorer")
        after = await client.statuses()

    assert (after["image_classifier"].rows_served, after["reranker"].rows_served) == (2, 5)
    pipe = after["search_pipeline"]
    assert (pipe.requests_served, pipe.rows_served, pipe.dispatch_count) == (3, 3, 3)
    assert pipe.total_compute_seconds == pytest.approx(3 * per_request)
    assert pipe.device_resident  # loaded on demand, and the budget holds both
    for name, entry in after.items():
        old = before[name]
        assert entry.dispatch_count >= old.dispatch_count, name
        assert entry.requests_served >= old.requests_served, name
        assert entry.rows_served >= old.rows_served, name
        assert entry.total_compute_seconds >= old.total_compute_seconds, name
    assert after["search_pipeline"].dispatch_count > before["search_pipeline"].dispatch_count

    # A new worker with the same flags starts from zero.
    async with open_memory_worker(cli_worker_config(*MEMORY_FLAGS, *flags)) as restarted:
        for entry in (await restarted.control_status()).models:
            assert (entry.dispatch_count, entry.requests_served, entry.rows_served) == (0, 0, 0)
            assert entry.total_compute_seconds == 0
            assert not entry.device_resident


async def test_admission_cap_sheds_at_once(tmp_path: Path, autojump_clock: MockClock) -> None:
    catalogue = tmp_path / "slow.yaml"
    catalogue.write_text(
        textwrap.dedent(
            """\
            models:
              - name: slow
                inputs: [{name: x, datatype: INT32, shape: [-1, 2]}]
                outputs: [{name: y, datatype: INT32, shape: [-1, 2]}]
                max_batch_size: 0
                launch_ms: 1500
            """
        )
    )
    flags = ("--models", str(catalogue), "--max-concurrent-requests", "2")
    config = cli_worker_config(*MEMORY_FLAGS, *flags)
    request = infer_request("slow", {"x": np.zeros((1, 2), np.int32)})
    async with open_memory_worker(config) as client:
        worker = client.worker
        ended: list[bool] = []

        async def hold() -> None:
            try:
                await client.infer(request, time_limit=30)
            finally:
                ended.append(True)

        async with trio.open_nursery() as held:
            for _ in range(2):
                held.start_soon(hold)
            await wait_until_async(
                lambda: scrape(worker)["worker_inflight_requests"] == 2,
                seconds=10,
                what="two calls in flight",
            )
            started = trio.current_time()
            with pytest.raises(GrpcError) as info:
                await client.infer(request, time_limit=30)
            elapsed = trio.current_time() - started
            assert info.value.code == StatusCode.RESOURCE_EXHAUSTED
            assert info.value.message == "worker worker0 is at its limit of 2 concurrent requests"
            # At once: no simulated time passed, long before either held call
            # (1.5 s of device time each) could end.
            assert elapsed == 0
            assert not ended
            assert scrape(worker)["worker_requests_shed_total"] == 1
            held.cancel_scope.cancel()


async def test_bad_worker_flags(autojump_clock: MockClock) -> None:
    config = cli_worker_config(*MEMORY_FLAGS, "--pin", "nope")
    with pytest.RaisesGroup(
        pytest.RaisesExc(
            ConfigError, match=r"^cannot pin 'nope': the catalogue has no such model$"
        ),
        flatten_subgroups=True,
    ):
        async with open_memory_worker(config):
            pass
