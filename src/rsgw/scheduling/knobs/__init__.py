"""What an operator sets: the `scheduling:` block, its knobs and their changes at run time.

Pure. Imports `rsgw.base`.

- `_knobs` the knobs' enums, checks, and the table that names them.
- `_settings` `SchedulingConfig`: the `scheduling:` block every mode reads.
- `_policy` what SetSchedulingPolicy and SetModelPlacement decide.
"""
