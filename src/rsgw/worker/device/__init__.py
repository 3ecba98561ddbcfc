"""The simulated GPU: its queues, batching, costs and weight memory.

Pure but for `_device` and `_memory` (time passes on a device). Imports `rsgw.base`
and `rsgw.worker.models`; the simulator reuses its pure parts.

- `_device` the dispatch loop: one coalesced batch at a time.
- `_batching` the request queues: which model runs next, and which requests.
- `_fair` fair sharing of the device between models.
- `_costs` what a dispatch costs: the learned per-batch-size cost.
- `_counters` what the device counts per model.
- `_weights` which models' weights are on the device: pins and an LRU.
- `_memory` the weight memory: the pure cache plus the time loads take.
"""
