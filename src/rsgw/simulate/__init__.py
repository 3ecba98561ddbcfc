"""The what-if simulator (`rsgw simulate`): a fleet in virtual time through the
gateway's own scheduling cores.

Imports `rsgw.base`, `rsgw.runtime`, `rsgw.config`, the scheduling cores and the
worker's device and models (the same costs and queues the simulated worker runs).

- `_scenario` scenarios as data, and their arrivals.
- `_offered` the load a scenario offers.
- `_trace` recorded arrivals.
- `_engine` a run through the production schedulers and admission.
- `_device` one worker's queues, weight cache and costs.
- `_day` a whole day, round by round.
- `_fluid` a round's calls in closed form.
- `_capacity` a scenario's capacity.
- `_results` a run as figures and tables.
- `_cli` the command line.
"""
