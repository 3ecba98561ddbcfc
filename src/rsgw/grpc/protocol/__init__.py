"""gRPC over HTTP/2 without I/O: bytes in, call events out, bytes to send.

Pure. Imports `rsgw.base` and `rsgw.http2`; the shells of `rsgw.grpc` (and the REST
door, the gateway and the worker, for framing and compression) import it.

- `_connection` `GrpcConnection`: one connection, both sides' common part.
- `_server_connection` the server's end.
- `_client_connection` the client's end.
- `_calls` the life of one call: its two halves, their states, its events.
- `_flow` outbound DATA under HTTP/2 flow control.
- `_framing` the 5-byte length prefix, reassembly, size limits.
- `_metadata` headers and trailers, `grpc-timeout`.
- `_compression` gzip and deflate, and how a compressed message is carried.
"""
