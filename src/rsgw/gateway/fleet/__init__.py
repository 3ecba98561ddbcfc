"""The workers the gateway watches: their channels, probes, models and stalls.

Imports `observe/` (and what is below the gateway); never `calls/` or `placement/`.
The pure cores are `rsgw.scheduling.fleet`'s.

- `_pool` one client channel per worker, their labels, the SHM register gate.
- `_prober` each round: readiness, capabilities, discovery.
- `_probe_call` one bounded probe call: a reply, a failure, or a hang.
- `_capability_probe` what each worker implements: one harmless call per capability.
- `_model_discovery` which workers serve which models, and the routing-table swap.
- `_meta_poll` every ready worker's work counters, each round.
- `_dns_targets` `dns:///NAME:PORT` endpoints, followed over time.
- `_regions` shared memory regions, replayed to a worker that comes back.
- `_watchdog` the stall watch's shell: ejects a worker that stops answering.
"""
