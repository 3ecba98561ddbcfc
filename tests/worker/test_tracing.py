"""The simulated worker's own spans, exported over OTLP/HTTP to a receiver in the test.

An in-process worker (memory streams, the real clock: spans carry wall-clock times),
its real exporter, and `tests.otlp`'s receiver decoding what it is sent: a ModelInfer
with a `traceparent` is a SERVER span under the caller's, holding its queue wait and
its batch, and the batch its weights load and compute; two calls batched together
show it on both; a call without a context is a root span and an unsampled one none;
a collector that is away costs spans, counted, never calls; with tracing off the
worker does not even import OpenTelemetry. Behind a traced gateway the worker's span
nests under the gateway's attempt span, all in the caller's trace; and the workers of
`rsgw node` each name themselves (`service.instance.id`) in the environment they share.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient

from rsgw._cli import WORKER_SERVICE_NAME, worker_config
from rsgw._flags import build_parser
from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import ConfigError
from rsgw.base._methods import Method
from rsgw.config._tracing import TracingConfig, tracing_from_env
from rsgw.worker._worker import WorkerConfig
from tests.gateway.fleet import open_fleet
from tests.helpers import (
    catalogue_from_yaml,
    in_thread,
    infer_request,
    simple_inputs,
    wait_until_async,
)
from tests.node.test_supervisor import running_node
from tests.otlp import ReceivedSpan, Receiver, otlp_receiver
from tests.worker.client import WorkerClient, open_memory_worker

CALLER_SPAN = 0x00F067AA0BA902B7
SERVER = 2  # OTLP's SpanKind number
LOAD_SECONDS = 0.030
MIB = 1 << 20


def _add_sub(name: str, extra: str = "") -> str:
    """An `add_sub` model of [-1, 4] INT32 tensors, as a catalogue YAML entry."""
    tensors = "[{name: %s0, datatype: INT32, shape: [-1, 4]}, {name: %s1, datatype: INT32, shape: [-1, 4]}]"  # noqa: E501
    return textwrap.dedent(
        f"""\
          - name: {name}
            inputs: {tensors % ("INPUT", "INPUT")}
            outputs: {tensors % ("OUTPUT", "OUTPUT")}
            max_batch_size: 8
            launch_ms: 5
            item_ms: 1
            weight_bytes: {MIB}
            compute: add_sub
        """
    ) + "".join(f"  {line}\n" for line in extra.splitlines())


CATALOGUE = catalogue_from_yaml(
    "models:\n"
    + _add_sub("one")
    # Holds its calls until two are there (a delay no test waits out).
    + _add_sub("pair", "max_queue_delay_microseconds: 60000000\npreferred_batch_size: [2]")
    + _add_sub("cold", f"load_ms: {LOAD_SECONDS * 1000}"),
    with_builtin=False,
)


def _tracing(endpoint: str, **variables: str) -> TracingConfig:
    """A worker's tracing as `rsgw worker` reads it, exporting within 50 ms."""
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_BSP_EXPORT_TIMEOUT": "2000",
        **variables,
    }
    return tracing_from_env(env, WORKER_SERVICE_NAME)


def _config(endpoint: str) -> WorkerConfig:
    return WorkerConfig(
        name="traced0",
        gpu="3",
        port=0,
        metrics_port=-1,
        catalogue=CATALOGUE,
        weight_cache_bytes=64 * MIB,
        pinned=frozenset({"one", "pair"}),  # only `cold` loads its weights on a call
        tracing=_tracing(endpoint),
    )


def _traceparent(trace_id: int, sampled: bool = True) -> bytes:
    return b"00-%032x-%016x-%02x" % (trace_id, CALLER_SPAN, int(sampled))


def _request(model: str, seed: int = 0) -> pb.ModelInferRequest:
    a = np.full((1, 4), seed, dtype=np.int32)
    return infer_request(model, {"INPUT0": a, "INPUT1": a})


async def _infer(client: WorkerClient, model: str, traceparent: bytes | None) -> None:
    """One ModelInfer, with `traceparent` in its metadata when given."""
    metadata = () if traceparent is None else ((b"traceparent", traceparent),)
    body = _request(model).SerializeToString()
    deadline = trio.current_time() + 10
    await client.channel.unary(Method.MODEL_INFER.wire, body, deadline=deadline, metadata=metadata)


def _trace(receiver: Receiver, trace_id: int, count: int) -> list[ReceivedSpan]:
    """The trace's spans once `count` of them have come."""
    spans = receiver.wait_for(lambda got: sum(s.trace_id == trace_id for s in got) >= count)
    return [s for s in spans if s.trace_id == trace_id]


def _named(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    named = {s.name: s for s in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


async def test_a_traced_call_nests_its_queue_wait_batch_load_and_compute() -> None:
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    with otlp_receiver() as receiver:
        async with open_memory_worker(_config(receiver.url)) as client:
            await _infer(client, "cold", _traceparent(trace_id))
            spans = _named(await in_thread(lambda: _trace(receiver, trace_id, 5)))
    server = spans["ModelInfer"]
    assert server.kind == SERVER and server.parent_id == CALLER_SPAN
    assert server.service == "rsgw-worker"
    assert server.resource["service.instance.id"] == "traced0"
    attributes = server.attributes
    assert attributes["rsgw.model"] == "cold" and attributes["rsgw.worker"] == "traced0"
    assert attributes["rsgw.gpu"] == "3" and attributes["rsgw.batch.size"] == 1
    assert attributes["rpc.grpc.status_code"] == 0
    wait, batch = spans["queue wait"], spans["batch"]
    assert wait.parent_id == batch.parent_id == server.span_id
    assert wait.end_ns == batch.start_ns  # the wait ends as its batch starts
    assert batch.attributes == {
        "rsgw.batch.size": 1,
        "rsgw.batch.rows": 1,
        "rsgw.batch.others": 0,
    }
    load, compute = spans["weights load"], spans["compute"]
    assert load.parent_id == compute.parent_id == batch.span_id
    assert (batch.start_ns, load.end_ns, compute.end_ns) == (
        load.start_ns,
        compute.start_ns,
        batch.end_ns,
    )
    assert load.end_ns - load.start_ns >= LOAD_SECONDS * 1e9 * 0.99
    assert compute.end_ns - compute.start_ns >= 0.006 * 1e9 * 0.99  # launch + one row


async def test_two_calls_batched_together_show_the_batch_on_both() -> None:
    traces = (0xA1, 0xB2)
    with otlp_receiver() as receiver:
        async with open_memory_worker(_config(receiver.url)) as client:
            async with trio.open_nursery() as nursery:
                for trace_id in traces:
                    nursery.start_soon(_infer, client, "pair", _traceparent(trace_id))
            both = [await in_thread(partial(_trace, receiver, t, 4)) for t in traces]
    batches = []
    for spans in map(_named, both):
        assert set(spans) == {"ModelInfer", "queue wait", "batch", "compute"}
        assert spans["ModelInfer"].attributes["rsgw.batch.size"] == 2
        assert spans["batch"].attributes["rsgw.batch.others"] == 1
        assert spans["batch"].attributes["rsgw.batch.rows"] == 2
        batches.append(spans["batch"])
    # One batch, seen from each call (each call's moments are moved to wall time apart).
    assert abs(batches[0].start_ns - batches[1].start_ns) < 1_000_000
    assert abs(batches[0].end_ns - batches[1].end_ns) < 1_000_000


async def test_each_request_of_a_stream_is_a_span_under_the_streams_caller() -> None:
    trace_id = 0xF5
    metadata = ((b"traceparent", _traceparent(trace_id)),)
    with otlp_receiver() as receiver:
        async with (
            open_memory_worker(_config(receiver.url)) as client,
            client.channel.stream(Method.MODEL_STREAM_INFER.wire, metadata=metadata) as stream,
        ):
            for model in ("pair", "pair", "nope"):
                await stream.send(_request(model).SerializeToString())
            stream.end()
            replies = [pb.ModelStreamInferResponse.FromString(r) async for r in stream]
            assert [r.error_message for r in replies].count("") == 2
            spans = await in_thread(lambda: _trace(receiver, trace_id, 9))
    servers = [s for s in spans if s.name == "ModelStreamInfer"]
    assert len(servers) == 3 and all(s.parent_id == CALLER_SPAN for s in servers)
    (refused,) = [s for s in servers if s.status_code]
    assert refused.attributes["rpc.grpc.status_code"] == 5  # NOT_FOUND, before any queue
    assert "nope" in refused.status_message and "rsgw.batch.size" not in refused.attributes
    batches = [s for s in spans if s.name == "batch"]
    assert [b.attributes["rsgw.batch.size"] for b in batches] == [2, 2]


async def test_no_context_is_a_root_span_and_an_unsampled_caller_none() -> None:
    unsampled = 0xC3
    with otlp_receiver() as receiver:
        async with open_memory_worker(_config(receiver.url)) as client:
            await _infer(client, "one", _traceparent(unsampled, sampled=False))
            await _infer(client, "one", None)
            # Spans leave in the order they ended: the root's come after any the
            # unsampled call would have made.
            spans = await in_thread(
                lambda: receiver.wait_for(
                    lambda got: (
                        sum(s.name != "ModelInfer" for s in got) >= 3
                        and any(s.name == "ModelInfer" for s in got)
                    )
                )
            )
    assert not [s for s in spans if s.trace_id == unsampled]
    (root,) = [s for s in spans if s.name == "ModelInfer"]
    assert root.parent_id == 0
    assert {s.trace_id for s in spans} == {root.trace_id}


async def test_a_collector_that_is_away_costs_spans_not_calls() -> None:
    with otlp_receiver() as receiver:
        closed = receiver.url  # the receiver stops here: nothing listens there
    async with open_memory_worker(_config(closed)) as client:
        for _ in range(3):
            await _infer(client, "one", None)
        registry = client.worker.service.metrics.registry
        labels = {"worker": "traced0", "gpu": "3", "reason": "export_failed"}

        def lost() -> float:
            return registry.get_sample_value("worker_trace_spans_dropped_total", labels) or 0.0

        await wait_until_async(lambda: lost() >= 4, 20, what="spans counted lost")


#: A worker with tracing off, on TCP, taking one call that carries a traceparent; it
#: prints the OpenTelemetry modules it loaded.
_UNTRACED_WORKER = """
import sys, trio
from rsgw._cli import worker_config
from rsgw._flags import build_parser
from rsgw.base._methods import Method
from rsgw.grpc._client import Channel
from rsgw.worker._worker import open_worker

async def main() -> None:
    args = build_parser().parse_args(["worker", "--port", "0", "--metrics-port", "-1"])
    async with open_worker(worker_config(args)) as worker, trio.open_nursery() as nursery:
        channel = Channel(f"127.0.0.1:{worker.grpc_port}", nursery)
        await channel.unary(
            Method.MODEL_INFER.wire,
            bytes.fromhex(sys.argv[1]),
            metadata=((b"traceparent", sys.argv[2].encode()),),
        )
        await channel.aclose()
        nursery.cancel_scope.cancel()
    print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))

trio.run(main)
"""


def test_tracing_off_exports_nothing_and_imports_no_opentelemetry() -> None:
    body = infer_request("simple", simple_inputs(0)).SerializeToString()
    with otlp_receiver() as receiver:
        # An endpoint, but the SDK switched off: OpenTelemetry's own word wins.
        env = os.environ | {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_SDK_DISABLED": "true",
        }
        done = subprocess.run(
            [sys.executable, "-c", _UNTRACED_WORKER, body.hex(), _traceparent(0xD4).decode()],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[]"
        assert receiver.requests == 0


def test_rsgw_worker_reads_opentelemetrys_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    def config() -> WorkerConfig:
        return worker_config(build_parser().parse_args(["worker"]))

    for var in [v for v in os.environ if v.startswith("OTEL_")]:
        monkeypatch.delenv(var)
    assert config().tracing == TracingConfig(service_name="rsgw-worker")  # off
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    tracing = config().tracing
    assert tracing is not None and tracing.endpoint == "http://collector:4318/v1/traces"
    assert tracing.service_name == "rsgw-worker"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gpu-fleet")
    assert config().tracing == TracingConfig(
        endpoint="http://collector:4318/v1/traces", service_name="gpu-fleet"
    )
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "sometimes")
    with pytest.raises(ConfigError, match=r"OTEL_TRACES_SAMPLER must be .* got .sometimes."):
        config()


async def test_behind_a_traced_gateway_the_worker_nests_under_the_attempt() -> None:
    trace_id = 0x5CE0E4736A3CE929D4BF92F3577B34DA
    with otlp_receiver() as receiver:
        gateway_tracing = TracingConfig(
            endpoint=receiver.url, schedule_delay_millis=50, export_timeout_millis=2000
        )
        async with open_fleet(
            1, tracing=gateway_tracing, worker_overrides={"tracing": _tracing(receiver.url)}
        ) as fleet:
            client = grpcclient.InferenceServerClient(fleet.target)
            headers = {"traceparent": _traceparent(trace_id).decode()}
            try:
                await in_thread(lambda: client.infer("simple", _inputs(), headers=headers))
            finally:
                client.close()
            # The gateway's server and attempt spans, the worker's server, queue wait,
            # batch and compute.
            spans = await in_thread(lambda: _trace(receiver, trace_id, 6))
    by_service: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        by_service.setdefault(span.service, []).append(span)
    gateway, worker = _named(by_service["rsgw"]), _named(by_service["rsgw-worker"])
    assert gateway["ModelInfer"].parent_id == CALLER_SPAN
    assert gateway["attempt"].parent_id == gateway["ModelInfer"].span_id
    assert worker["ModelInfer"].parent_id == gateway["attempt"].span_id
    assert worker["ModelInfer"].resource["service.instance.id"] == "worker0"
    assert worker["batch"].parent_id == worker["ModelInfer"].span_id


def _inputs() -> list[Any]:
    inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
    for tensor, value in zip(inputs, simple_inputs(0).values(), strict=True):
        tensor.set_data_from_numpy(value)
    return inputs


def test_a_nodes_workers_share_the_environment_and_name_themselves(tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            # What every child inherits; each worker's own name wins over it.
            "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=node-a,deployment.environment=t",
        }
        with running_node(tmp_path, "--gpus", "2", env=env) as node:
            workers = node.serving["workers"]
            for index, (_, ports) in enumerate(sorted(workers.items())):
                client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
                headers = {"traceparent": _traceparent(0xE0 + index).decode()}
                try:
                    client.infer("simple", _inputs(), headers=headers)
                finally:
                    client.close()
            seen = {
                index: _trace(receiver, 0xE0 + index, 4)[0].resource
                for index in range(len(workers))
            }
    for index, name in enumerate(sorted(workers)):
        assert seen[index]["service.instance.id"] == name, json.dumps(seen, default=str)
        assert seen[index]["service.name"] == "rsgw-worker"
        assert seen[index]["deployment.environment"] == "t"
