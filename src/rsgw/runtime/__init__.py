"""What a running rsgw process stands on: sockets, TLS, logs, metrics, the admin server.

A shell package. Imports `rsgw.base` (and `rsgw._version`); the gRPC layer, the REST
door, the gateway, the worker and the node import it.

- `_net` binding listening sockets with one readable error; the network seam (`Network`).
- `_tls` TLS contexts for listeners and channels, reloading, peer identities.
- `_admin` the admin HTTP server (`/metrics`, `/healthz`, `/readyz`) on hypercorn.
- `_exposition` rendering a Prometheus registry the way rsgw serves it.
- `_openmetrics` the OpenMetrics answer: workers' text turned into OpenMetrics, merged.
- `_hot_series` counter and histogram families whose children are plain numbers.
- `_logging` log formatting for the command line: JSON lines or text.
- `_log_budget` how many lines of one kind a process may log.
- `_spans` how a process's spans leave it (OpenTelemetry, imported only when tracing).
- `_process` what a long-running process asks of the OS for itself (file limits, memory).
"""
