"""rsgw's own HTTP/2 for gRPC, sans-IO: frames in, events out, frames to send.

Imports nothing of rsgw; only hpack (its Huffman table) from outside. The gRPC
protocol core (`rsgw.grpc.protocol`) drives it.

- `_http2` `Http2Connection`: parsing the bytes that come in.
- `_http2_state` a connection's state: frame layout, settings, streams, queued bytes.
- `_http2_send` the sending side: headers, data, resets, GOAWAY.
- `_http2_handlers` what each frame received does.
- `_http2_events` the vocabulary: codes, errors, events.
- `_hpack` HPACK: an encoder without a dynamic table, a remembering decoder.
- `_h2` the connection every rsgw client and server runs, configured once.
"""
