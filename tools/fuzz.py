#!/usr/bin/env python3
"""Long fuzzing runs of what reads hostile bytes first: the partial decoder and the header path.

The same properties run in CI as hypothesis tests (tests/scheduling/test_wire.py,
tests/grpc/test_metadata.py), a few hundred examples each. For hours or days, run
them under atheris (coverage-guided, libFuzzer), which is not a test dependency:

    pip install atheris
    python tools/fuzz.py decoder -max_total_time=3600
    python tools/fuzz.py headers -runs=10000000

Everything after the target name goes to libFuzzer (`-help=1` lists its flags). A
failure prints the input and exits non-zero; libFuzzer writes it as `crash-<sha1>`,
which `python tools/fuzz.py decoder crash-<sha1>` replays.

- `decoder`: any bytes through `peek_routing`, `peek_header`, `peek_batch_size` and
  `head_length` give a value or `DecodeError`, nothing else, and where protobuf
  parses the bytes the answers are protobuf's.
- `headers`: any header block through `parse_request_headers` gives a request head
  or a `GrpcError` with a short, printable message.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from google.protobuf.message import DecodeError as ProtobufDecodeError

    from rsgw._errors import DecodeError, GrpcError
    from rsgw._proto import grpc_predict_v2_pb2 as pb
    from rsgw.grpc._metadata import parse_request_headers
    from rsgw.scheduling._wire import head_length, peek_batch_size, peek_header, peek_routing


def decoder(data: bytes) -> None:
    try:
        parsed: pb.ModelInferRequest | None = pb.ModelInferRequest.FromString(data)
    except (ProtobufDecodeError, RuntimeError):
        parsed = None
    try:
        model, _ = peek_routing(data)
        header = peek_header(data)
        extent = peek_batch_size(data, "a", 1)
        head_length(data, True)
    except DecodeError:
        return
    if parsed is not None:
        assert model == parsed.model_name == header[0], (model, parsed.model_name)
        assert header[1] == parsed.id
        expected = next((t.shape[0] if t.shape else 0 for t in parsed.inputs if t.name == "a"), 0)
        assert extent == expected, (extent, expected)


def headers(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    block = [
        (provider.ConsumeBytes(provider.ConsumeIntInRange(0, 24)), provider.ConsumeBytes(48))
        for _ in range(provider.ConsumeIntInRange(0, 12))
    ]
    try:
        parse_request_headers(block)
    except GrpcError as exc:
        assert len(exc.message) <= 600
        exc.message.encode("utf-8")


TARGETS = {"decoder": decoder, "headers": headers}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        print(f"usage: tools/fuzz.py {{{','.join(TARGETS)}}} [libFuzzer flags]", file=sys.stderr)
        sys.exit(2)
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
