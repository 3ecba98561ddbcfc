"""ModelControlStatus as the gateway reads it, from `rsgw worker` subprocesses.

Issue 3, acceptance 4 and 5: the batch locator of each built-in GPU-shaped model
in wire order (axis last, axis first, none on the first input), the meta as one
unit (max batch 0, no locator, its sub-models' weights summed, one row per
request), the worker-level fields following the flags, and counters that only
grow within a process and start from zero in a new one. Then the admission cap:
past `--max-concurrent-requests` calls in flight, the next fails at once.
"""

from __future__ import annotations

import textwrap
import time
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.worker._catalogue import builtin_catalogue
from tests.helpers import (
    MODEL_INFER,
    infer_request,
    model_control_status,
    wait_until,
)
from tests.worker.control import scrape

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.helpers import WorkerProcess

Client: TypeAlias = Any  # tritonclient ships no type information
MIB = 1 << 20


def _infer(client: Client, model: str, inputs: dict[str, np.ndarray[Any, Any]]) -> Any:
    tensors = []
    for name, value in inputs.items():
        datatype = {np.float32: "FP32", np.int64: "INT64"}[value.dtype.type]
        tensor = grpcclient.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return client.infer(model, tensors)


def _statuses(target: str) -> dict[str, cpb.ModelStatus]:
    return {m.name: m for m in model_control_status(target).models}


def test_batch_locators_metas_and_counters_across_a_restart(
    worker_process_factory: Callable[..., WorkerProcess],
) -> None:
    flags = ("--discipline", "edf", "--weight-cache-bytes", "512MiB", "--time-scale", "0.5")
    worker = worker_process_factory(*flags)
    response = model_control_status(worker.target)
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

    with grpcclient.InferenceServerClient(worker.target) as client:
        image = np.zeros((3, 64, 64, 2), np.float32)
        logits = _infer(client, "image_classifier", {"IMAGE": image}).as_numpy("LOGITS")
        assert logits.shape == (1000, 2)
        scores = _infer(
            client,
            "reranker",
            {"query": np.zeros(64, np.int64), "passages": np.zeros((5, 64), np.int64)},
        ).as_numpy("SCORES")
        assert scores.shape == (5,)
        before = _statuses(worker.target)
        for _ in range(3):
            result = _infer(client, "search_pipeline", {"query_ids": np.zeros((4, 32), np.int64)})
            assert result.as_numpy("TOP_SCORES").shape == (4, 10)
        with pytest.raises(InferenceServerException, match="unknown model: search_scorer"):
            client.get_model_metadata("search_scorer")
        assert not client.is_model_ready("search_scorer")
    after = _statuses(worker.target)

    assert (after["image_classifier"].rows_served, after["reranker"].rows_served) == (2, 5)
    pipe = after["search_pipeline"]
    assert (pipe.requests_served, pipe.rows_served, pipe.dispatch_count) == (3, 3, 3)
    # Its compute is its sub-calls' device time: (2 + 0.3 x 4) + (1.5 + 0.2 x 4) ms per
    # request at time scale 0.5, since each ran alone.
    assert pipe.total_compute_seconds == pytest.approx(3 * 0.5 * (3.2 + 2.3) / 1000)
    assert pipe.device_resident  # loaded on demand, and the budget holds both
    for name, entry in after.items():
        old = before[name]
        assert entry.dispatch_count >= old.dispatch_count, name
        assert entry.requests_served >= old.requests_served, name
        assert entry.rows_served >= old.rows_served, name
        assert entry.total_compute_seconds >= old.total_compute_seconds, name
    assert after["search_pipeline"].dispatch_count > before["search_pipeline"].dispatch_count

    # A new process starts from zero.
    worker.stop()
    restarted = worker_process_factory(*flags)
    for entry in model_control_status(restarted.target).models:
        assert (entry.dispatch_count, entry.requests_served, entry.rows_served) == (0, 0, 0)
        assert entry.total_compute_seconds == 0
        assert not entry.device_resident


def test_admission_cap_sheds_at_once(
    worker_process_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
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
    worker = worker_process_factory("--models", str(catalogue), "--max-concurrent-requests", "2")
    assert worker.metrics_port is not None
    port = worker.metrics_port
    body = infer_request("slow", {"x": np.zeros((1, 2), np.int32)}).SerializeToString()
    with grpc.insecure_channel(worker.target) as channel:
        method = channel.unary_unary(MODEL_INFER)
        held = [method.future(body, timeout=30) for _ in range(2)]
        wait_until(
            lambda: scrape(port)["worker_inflight_requests"] == 2,
            timeout=10,
            what="two calls in flight",
        )
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            method(body, timeout=30)
        elapsed = time.monotonic() - started
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit of 2 concurrent requests" in info.value.details()
        # At once: long before either held call (1.5 s of device time each) could end.
        assert elapsed < 0.5
        assert not any(f.done() for f in held)
        assert scrape(port)["worker_requests_shed_total"] == 1
        for future in held:
            future.cancel()


def test_bad_worker_flags(worker_process_factory: Callable[..., WorkerProcess]) -> None:
    with pytest.raises(AssertionError, match="cannot pin 'nope'"):
        worker_process_factory("--pin", "nope")
