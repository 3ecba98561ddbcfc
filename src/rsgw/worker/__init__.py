"""The simulated GPU worker: a KServe V2 server whose device is a cost model.

Two rooms and the server at the top. `models/` imports only `rsgw.base`; `device/`
imports `models/`; the server imports both, `rsgw.grpc`, `rsgw.runtime` and the
scheduling cores it shares with the gateway (the wire decoder, capabilities).

- `models/` what a model is and computes: specs, the catalogue, tensors.
- `device/` the simulated GPU: queues, batching, costs, weights in memory.
- `_worker` `serve_worker`: the worker's gRPC and admin ports.
- `_service` the KServe V2 data plane and the ControlService.
- `_requests` a ModelInferRequest as the worker reads it, and its response.
- `_control` model control: rsgw's ControlService and Triton's explicit control.
- `_stateful` stateful models: the sequence batcher's shell half.
- `_sequences` which sequences are live (pure).
- `_shm` the system shared-memory registry.
- `_triton` the catalogue and counters as Triton reports them (pure).
- `_metrics` the worker's Prometheus series.
- `_tracing` the worker's own spans (OpenTelemetry, imported only when configured).
"""
