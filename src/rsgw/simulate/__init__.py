"""The what-if simulator (`rsgw simulate`): a fleet in virtual time through the
gateway's own scheduling cores.

Imports `rsgw.base`, `rsgw.runtime`, `rsgw.config`, the scheduling cores and the
worker's device and models (the same costs and queues the simulated worker runs).

- `_scenario` scenarios as data, and their arrivals.
- `_offered` the load a scenario offers.
- `_trace` recorded arrivals.
- `_engine` a run, event by event.
- `_gateway` the gateway's decisions through the production schedulers and admission.
- `_tenants` tenants and priorities through the gateway's own admission core (issue 52),
  and their figures.
- `_cold` the cold path (issue 49: loads on demand), `_placer` placements carried out
  by load and unload, `_ledger` the workers' memory against their budgets.
- `_device` one worker's queues, weight cache, model control and costs.
- `_day` a whole day, round by round.
- `_fluid` a round's calls in closed form.
- `_capacity` a scenario's capacity.
- `_results` a run as figures and tables.
- `_cli` the command line.
"""
