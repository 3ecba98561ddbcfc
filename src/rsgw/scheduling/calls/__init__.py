"""The path of one call, decided: which replica, in what order, admitted or not, by when.

Pure. Imports `rsgw.base` and `rsgw.scheduling.knobs`. `rsgw.gateway.calls` is their
shell.

- `_wire` partial decoding of a ModelInferRequest: what routing needs, nothing more.
- `_routing` the routing table and round-robin replica choice.
- `_schedulers` the replica choosers, one per scheduling mode.
- `_outstanding` least_outstanding: the replica carrying the least work.
- `_fill` lpt_packing's request path: which replica takes the next request.
- `_plan` one call's route through the replicas, and what each failure means.
- `_budget` the retry budget failover spends.
- `_ledger` the gateway's books: every call it holds, counted once.
- `_forecast` deadline-aware admission: will a call finish in time?
- `_shares` priority bands and fair shares per tenant at a full worker.
- `_quotas` per-tenant quotas (rate, concurrency), and tenant names as labels.
- `_sequences` sequence affinity for stateful models.
- `_meta` routing metadata: batch locators, max batch, measured costs.
- `_reported` work counters for workers without ReactantServer's control plane.
- `_merge` one answer from many workers' answers.
"""
