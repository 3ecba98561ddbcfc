"""rsgw's own gRPC layer: a sans-IO core and thin Trio shells.

Why not purerpc: see docs/decisions.md. The core does no I/O: HTTP/2 (`_http2` parses
what comes in, `_http2_handlers` does what each frame says, `_http2_send` sends,
`_http2_state` holds the streams and settings), the calls over it (`_connection`,
`_server_connection`, `_client_connection`), and `_framing`, `_metadata`. The shells:
`_server` is the listener, `_serving` one connection it serves and `_handling` the
handlers run for its calls; `_client` is a channel and `_channel_connection` one of
its connections; `_transport` moves the bytes of both.
"""
