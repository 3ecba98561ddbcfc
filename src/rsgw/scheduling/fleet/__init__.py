"""The workers as data: who they are, what they implement, whether they answer.

Pure. Imports `rsgw.base`. `rsgw.gateway.fleet` is their shell.

- `_membership` an immutable membership over its sources, and the changes between two.
- `_capabilities` what each worker implements of the API, as data routing reads.
- `_lookups` which models to look for on workers that cannot list theirs.
- `_stalls` the stall watch behind outlier ejection.
"""
