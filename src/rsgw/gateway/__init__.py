"""The gateway: one KServe V2 endpoint routing raw requests to N workers.

The Trio shell around the pure cores of `rsgw.scheduling`. Where to find what:

- Starting and holding it: `_gateway` (`serve_gateway`, the nursery tree, in
  dependency order), `_running` (`RunningGateway`, the status snapshot, reload,
  graceful stop), `_admin_routes` (`/metrics` for the whole node, `/healthz`,
  `/readyz`).
- The data plane, one handler table (`_service`) for whichever door serves it:
  `_infer` (ModelInfer's pass-through, the hot path), `_streaming`
  (ModelStreamInfer), `_models` (health, metadata, config, statistics, the
  repository index), `_shm_calls` (shared memory), `_fleet_calls` (model control,
  IPC namespace, compaction). They share `_resolve` (which replicas may take a call
  for a model), `_admission` (the inbound cap and its queue) and `_fanout` (which
  workers a fan-out asks, and the rules that merge their answers).
- The workers: `_pool` (a channel each, labels, the SHM register gate), `_members`
  (workers joining and leaving), `_discovery` (`dns:///` endpoints), `_prober`
  (readiness, model discovery, the routing-table swap), `_watchdog` (stalled
  connections), `_regions` (shared memory replayed to a worker that comes back).
- Scheduling's shell: `_packing` (lpt_packing's repack loop), `_preconditions`
  (its start-up checks), `_meta_poll` (routing metadata from the workers),
  `_control` and `_scheduling_status` (GatewayControlService).
- Around every call: `_guard` (authentication, roles, audit), `_metrics`, `_access`
  (the sampled access log), `_settings` (LogSettings, TraceSetting).
"""
