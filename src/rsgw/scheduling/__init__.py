"""Pure scheduling cores: the routing table and the replica choosers.

No Trio, no sockets, no clocks of their own: the gateway shell feeds them
snapshots and `now`, and they return decisions.
"""
