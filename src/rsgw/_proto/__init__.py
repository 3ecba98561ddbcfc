"""Generated protobuf modules, built into a private descriptor pool.

`tritonclient.grpc` registers package `inference` in protobuf's default pool; a
second definition there fails at import. Our modules use `_pool.POOL` instead, so
one process can import both (see tools/regen_protos.py, which writes them).

Never edit the `*_pb2.py`/`.pyi` files: change `proto/` and run
`python tools/regen_protos.py`; `tests/test_proto.py` fails while they are stale.
"""
