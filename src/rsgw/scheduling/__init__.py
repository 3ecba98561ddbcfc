"""Pure scheduling cores: the decisions the gateway shell carries out.

No Trio, no sockets, no clocks of their own: the shell (`rsgw.gateway`) feeds them
snapshots and `now`, and they return decisions. Four rooms, each importing only
`rsgw.base` and the rooms listed before it; the gateway's rooms of the same names are
their shells:

- `knobs/` what an operator sets: the `scheduling:` block and its changes at run time.
- `fleet/` the workers as data: membership, capabilities, lookups, stalls.
- `calls/` the path of one call: decoding, routing, schedulers, admission, failover.
- `placement/` lpt_packing: replicas, packing, reports, residency, repository moves.
"""
