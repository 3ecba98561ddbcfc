#!/usr/bin/env python3
"""Long fuzzing runs of what reads hostile bytes first: HTTP/2 frames, HPACK, the headers,
the partial decoder.

The same properties run in CI as hypothesis tests (tests/scheduling/test_wire.py,
tests/grpc/test_metadata.py, tests/grpc/test_http2.py, tests/grpc/test_hpack.py), a few
hundred examples each. For hours or days, run
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
- `frames`: any bytes after the client preface, fed to a server's HTTP/2 connection in
  two pieces, give events or `ProtocolError` (with its GOAWAY queued), nothing else.
- `hpack`: any header block through rsgw's HPACK decoder gives headers or `HpackError`,
  and where the hpack library decodes the block, the same headers.
"""

from __future__ import annotations

import sys

import atheris
import hpack

with atheris.instrument_imports():
    from google.protobuf.message import DecodeError as ProtobufDecodeError

    from rsgw._proto import grpc_predict_v2_pb2 as pb
    from rsgw.base._errors import DecodeError, GrpcError
    from rsgw.grpc.protocol._metadata import parse_request_headers
    from rsgw.http2 import _http2 as http2
    from rsgw.http2._hpack import HeaderDecoder, HpackError
    from rsgw.http2._http2_state import PREFACE
    from rsgw.scheduling.calls._wire import head_length, peek_batch_size, peek_header, peek_routing


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


def frames(data: bytes) -> None:
    conn = http2.Http2Connection(client_side=False, window_bytes=1 << 20)
    conn.initiate_connection()
    cut = data[0] if data else 0
    stream = PREFACE + data[1:]
    try:
        conn.receive_data(stream[: len(PREFACE) + cut])
        conn.receive_data(stream[len(PREFACE) + cut :])
    except http2.ProtocolError:
        assert conn.data_to_send(), "a protocol error queues GOAWAY"


def hpack_block(data: bytes) -> None:
    try:
        ours: list[tuple[bytes, bytes]] | None = HeaderDecoder().decode(data)
    except HpackError:
        ours = None
    try:
        theirs = [tuple(h) for h in hpack.Decoder().decode(data, raw=True)]
    except Exception:  # hpack's HPACKError family, and what it lets slip
        return
    if ours is not None:
        assert ours == theirs, (ours, theirs)


TARGETS = {"decoder": decoder, "headers": headers, "frames": frames, "hpack": hpack_block}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        print(f"usage: tools/fuzz.py {{{','.join(TARGETS)}}} [libFuzzer flags]", file=sys.stderr)
        sys.exit(2)
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
