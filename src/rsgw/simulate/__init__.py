"""The what-if simulator (`rsgw simulate`): a fleet in virtual time through the
gateway's own scheduling cores.

`_scenario` (scenarios as data, their arrivals) and `_offered` (the load they
offer) or `_trace` (recorded arrivals) say what comes in; `_engine` runs it through
the production schedulers and admission against `_device` (one worker's queues,
weight cache and costs) or, for a whole day, `_day` with `_fluid` (a round's calls
in closed form); `_capacity` finds a scenario's capacity; `_results` turns a run
into figures and tables; `_cli` is the command line.
"""
