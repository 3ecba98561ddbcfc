"""The worker's admin HTTP port: /metrics, /healthz, /readyz.

An in-process worker serves real requests, then httpx (under trio) scrapes its
admin port the way Prometheus and the gateway's prober do. We parse the text
exposition with prometheus_client's own parser rather than grepping lines, so a
formatting slip fails as loudly as a wrong number.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rsgw.worker._worker import RunningWorker, WorkerConfig, open_worker
from rsgw.worker.models._specs import Catalogue
from tests.helpers import (
    check_simple,
    in_thread,
    infer_request,
    model_infer,
    simple_inputs,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

WORKER, GPU = "metrics-w", "5"


@pytest.fixture
async def worker() -> AsyncIterator[RunningWorker]:
    config = WorkerConfig(name=WORKER, gpu=GPU, port=0, metrics_port=0)
    async with open_worker(config) as running:
        yield running


@pytest.fixture
async def admin(worker: RunningWorker) -> AsyncIterator[httpx.AsyncClient]:
    assert worker.metrics_port is not None
    base = f"http://127.0.0.1:{worker.metrics_port}"
    async with httpx.AsyncClient(base_url=base, timeout=10.0) as client:
        yield client


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def _scrape(admin: httpx.AsyncClient) -> tuple[str, Samples]:
    response = await admin.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return response.text, samples


def _labels(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset({"worker": WORKER, "gpu": GPU, **labels}.items())


async def test_health_endpoints(admin: httpx.AsyncClient) -> None:
    healthz = await admin.get("/healthz")
    assert (healthz.status_code, healthz.text) == (200, "ok")
    readyz = await admin.get("/readyz")
    assert (readyz.status_code, readyz.text) == (200, "ok")
    missing = await admin.get("/no/such/path")
    assert missing.status_code == 404


async def test_metrics_count_requests(worker: RunningWorker, admin: httpx.AsyncClient) -> None:
    target = f"127.0.0.1:{worker.grpc_port}"
    _, before = await _scrape(admin)
    assert before[("worker_dispatch_total", _labels(model="simple"))] == 0
    assert before[("worker_rows_served_total", _labels(model="simple"))] == 0

    # One after another, so each is its own dispatch: 1 + 2 + 4 rows.
    for seed, rows in enumerate((1, 2, 4)):
        await in_thread(partial(check_simple, target, seed, rows))
    with pytest.raises(grpc.RpcError) as info:
        request = infer_request("no_such_model", simple_inputs(seed=9))
        await in_thread(partial(model_infer, target, request))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND

    text, after = await _scrape(admin)
    simple = _labels(model="simple")
    assert after[("worker_dispatch_total", simple)] == 3
    assert after[("worker_rows_served_total", simple)] == 7
    assert after[("worker_requests_served_total", simple)] == 3
    assert after[("worker_requests_total", _labels(model="simple", status="OK"))] == 3
    not_found = _labels(model="_unknown_", status="NOT_FOUND")
    assert after[("worker_requests_total", not_found)] == 1
    assert after[("worker_compute_seconds_total", simple)] == pytest.approx(3 * 0.001 + 7 * 0.00005)
    # Untouched models are listed at zero, with the same labels.
    assert after[("worker_dispatch_total", _labels(model="simple_int8"))] == 0
    assert after[("worker_inflight_requests", _labels())] == 0

    # Every series carries the worker and gpu labels.
    for name, labels in after:
        assert ("worker", WORKER) in labels, name
        assert ("gpu", GPU) in labels, name
    assert not [name for name, _ in after if name.endswith("_created")]
    assert "_created" not in text


async def test_readyz_without_models() -> None:
    config = WorkerConfig(name=WORKER, gpu=GPU, port=0, metrics_port=0, catalogue=Catalogue(()))
    async with open_worker(config) as worker:
        base = f"http://127.0.0.1:{worker.metrics_port}"
        async with httpx.AsyncClient(base_url=base, timeout=10.0) as client:
            readyz = await client.get("/readyz")
            healthz = await client.get("/healthz")
    assert readyz.status_code == 503
    assert healthz.status_code == 200
