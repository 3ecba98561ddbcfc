"""The KServe V2 REST front door: Triton's HTTP API answered by the gateway's gRPC handlers.

A REST inference call becomes the gRPC ModelInferRequest a worker takes, and the
worker's ModelInferResponse becomes the JSON (and binary tensors) Triton's HTTP
endpoint would have written. Imports `rsgw.base`, `rsgw.runtime` and
`rsgw.grpc.protocol` (compression); the gateway builds it with its handlers.

- `_listener` rsgw's own HTTP/1.1 server on trio.
- `_connections` what the listener does with a connection besides reading requests.
- `_http1` request heads read strictly (RFC 9112), responses written.
- `_chunked` a chunked request body, decoded strictly as it arrives.
- `_door` answers the REST API with the gateway's handlers.
- `_routes` the API, endpoint by endpoint, as the gRPC calls the gateway answers.
- `_codec` a REST inference request as the gRPC ModelInfer call.
- `_reply` a ModelInferResponse as Triton's REST inference reply.
- `_tensors` tensor data between REST lists, raw bytes and gRPC contents.
- `_json` protobuf messages as Triton's REST API writes them in JSON, and back.
- `_json_data` large JSON tensor data, without a Python object per element.
- `_rest_errors` Triton's `{"error": ...}` bodies, and each gRPC status's HTTP status.
"""
