"""The vocabulary every part of rsgw shares: pure but for three small shells.

Imports nothing of rsgw but the generated protobuf code. Everything else may import it.

- `_errors` `RsgwError` and its subclasses, each with the gRPC status it maps to.
- `_status` gRPC status codes and their names.
- `_methods` every gRPC method rsgw serves or calls: one registry of paths.
- `_body` a message body: contiguous bytes, or its pieces.
- `_values` value checks and the strict YAML reader every file format shares.
- `_limits` what one client connection may cost a server, and the HTTP/2 flood guard.
- `_uploads` the budget of unfinished request bytes.
- `_auth` roles, the method table, bearer tokens and mTLS identities.
- `_usage` command lines that say which option was meant (`StrictParser`).
- `_trace_context` W3C `traceparent` / `tracestate`: read, checked and handed on.
- `_sampling` which calls are traced: OpenTelemetry's standard samplers, decided before any span.
- `_call` (shell) the call context a handler sees, whichever door the call came through.
- `_peer` (shell) who is at the other end of a connection.
- `_shm_access` (shell) which shared memory objects a client may have mapped.
"""
