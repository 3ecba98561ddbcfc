"""The KServe V2 REST front door: Triton's HTTP API answered by the gateway's gRPC handlers.

A REST inference call becomes the gRPC ModelInferRequest a worker takes, and the
worker's ModelInferResponse becomes the JSON (and binary tensors) Triton's HTTP
endpoint would have written; `_codec` is that pure inference codec, with the
tensor conversions in `_tensors`.
"""
