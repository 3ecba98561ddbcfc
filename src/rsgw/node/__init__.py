"""The node supervisor (`rsgw node`): one process per worker, and the gateway in front.

Imports `rsgw.base`, `rsgw.runtime`, `rsgw.config`, `rsgw.grpc` (the health probe's
channel) and `rsgw.worker.models` (the catalogue a node file names).

- `_node` the node file: which workers, on which GPUs and ports (pure).
- `_supervision` the supervisor's decisions: backoff, addresses, the gateway's
  environment, argv (pure).
- `_supervisor` `serve_node`: starts, relays, restarts and stops the children.
- `_children` one supervised child process (rsgw's, or a server of its own).
- `_servers` what serves each GPU: the `server:` block, presets, placeholders, the
  node's failure lines (pure).
- `_plan` each child's command line and environment, and `--dry-run`'s text (pure).
- `_gpus` which GPUs this node sees.
- `_probe` `probe_worker_ready`: a worker's ServerReady, as a health check.
"""
