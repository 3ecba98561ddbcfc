"""lpt_packing's shell: startup, the repack loop, loads and unloads, coordination.

Imports `fleet/` and `observe/` (and `rsgw.coordination`, and what is below the
gateway); never `calls/`. The pure cores are `rsgw.scheduling.placement`'s.

- `_packing` the repack loop, compaction, the operator handshake.
- `_preconditions` the startup checks: every worker up, batching, one model set.
- `_repack_log` the settings line at start and each repack's line and warnings.
- `_repository_placer` placements carried out by loading and unloading models.
- `_repository_calls` RepositoryModelLoad and Unload, each counted as it answers.
- `_memory_ledger` what each worker holds of the handed models, against its budget.
- `_cold_starts` a handed model loaded nowhere, loaded when a call asks for it.
- `_coordinator` one gateway's part among several: elect, publish, follow.
- `_scheduling_status` what GetSchedulingStatus answers.
- `_latest` a mailbox of capacity one that keeps the newest post.
"""
