"""rsgw's own gRPC layer: a sans-IO core and thin Trio shells on h2.

Why not purerpc: see docs/decisions.md. The core (`_framing`, `_metadata`,
`_status`) is pure; `_server` is the listener shell.
"""
