"""rsgw's own gRPC layer: a sans-IO core (`protocol/`) and thin Trio shells (here).

Why not purerpc: see docs/decisions.md. Imports `rsgw.base`, `rsgw.runtime` and
`rsgw.http2`; the core in `protocol/` imports no shell.

- `protocol/` the calls over HTTP/2 without I/O: framing, metadata, compression, flow.
- `_server` the listener; `_serving` one connection it serves; `_handling` the
  handlers run for its calls; `_intake` whether it may read more requests now.
- `_client` a channel; `_channel_connection` one of its connections.
- `_transport` moves the bytes of both, one connection on one Trio stream.
- `_streams` streaming calls as handlers and callers see them.
- `_typed` protobuf in, protobuf out, over the raw-bytes handlers.
- `_metering` a handled call's status and latency, observed once.
- `_standard` health checking and reflection, added to every listener.
"""
