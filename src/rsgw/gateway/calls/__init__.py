"""The path of one call, for whichever door serves it: one handler table.

Imports `fleet/` and `observe/` (and what is below the gateway); never `placement/`:
under lpt_packing the call path is given the placement's `holders` as a function.
The pure cores are `rsgw.scheduling.calls`'s.

- `_service` the handler table over the parts below.
- `_infer` ModelInfer's pass-through: admit, resolve, schedule, forward, fail over.
- `_streaming` ModelStreamInfer, routed per message.
- `_models` the RPCs about the server and its models, merged over the fleet.
- `_shm_calls` the shared-memory RPCs: register everywhere, or nowhere.
- `_fleet_calls` model control, the IPC namespace probe, compaction.
- `_broadcast` fan-outs: which workers are asked, and the rules that make one answer.
- `_resolve` which workers may take a call for a model, or why none may.
- `_admission` the inbound cap, its queue, and refusals at arrival.
- `_tenancy` each call's tenant, priority band and quota, and the tenants' counts.
- `_guard` authentication, authorisation and the audit log around every handler.
"""
