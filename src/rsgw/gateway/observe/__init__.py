"""What the gateway says about itself: its metrics, access log, spans and log settings.

The lowest room: imports `rsgw.base`, `rsgw.runtime`, the gRPC layer, the scheduling
cores and `rsgw.coordination` (for their types), no other room.

- `_metrics` `GatewayMetrics`: the registry and the hot-path helpers that write to it.
- `_collectors` the series read at scrape time, over live state.
- `_access` the sampled access log.
- `_propagation` what of a caller's metadata goes on to the worker (request id, trace).
- `_tracing` the gateway's own spans (OpenTelemetry, imported only when configured).
- `_log_settings` Triton's LogSettings and TraceSetting, answered for the gateway.
"""
