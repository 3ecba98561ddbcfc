"""lpt_packing's placement: which workers host each model, and when that changes.

Pure. Imports `rsgw.base`, `rsgw.scheduling.knobs` and `rsgw.scheduling.calls`.
`rsgw.gateway.placement` is their shell; `rsgw.coordination` and the simulator use them.

- `_lpt` lpt_packing's scheduler: placement first, fill quantum within it.
- `_packer` the packer state machine: when to repack, and what a repack decides.
- `_assignment` which workers host each model's replicas.
- `_greedy` the greedy pass: heaviest model first, onto the least pressed workers.
- `_refine` a better packing than the greedy one, by a bounded search.
- `_replicas` how many replicas each model gets beyond what the operator set.
- `_placement` one model's placement: its workers and their weights.
- `_reports` what the packer takes in and hands out.
- `_repository_moves` placing by loading and unloading: what to load, route, drain, unload.
- `_residency` which models stay in GPU memory, and where a cold one is loaded.
- `_budget_fit` a repack's placement cut to the workers' budgets, by value.
- `_demand` each model's demand for residency: its calls, counted with a decay.
- `_copies` what each budgeted worker holds of the handed models: the bookkeeping.
"""
