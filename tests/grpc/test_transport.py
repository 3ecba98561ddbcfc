"""The transport's gather write, over a real (non-blocking) socket pair."""

from __future__ import annotations

import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw.grpc._transport import IOV_MAX, _write_gathered


def _drain(sock: socket.socket) -> bytes:
    out = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return bytes(out)
        out += chunk


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=70_000), min_size=1, max_size=2 * IOV_MAX + 5))
def test_every_byte_arrives_once_in_order(sizes: list[int]) -> None:
    """Write until the socket is full, read, write the rest: the bytes come out as
    they went in, whatever the pieces' sizes and the kernel's partial writes."""
    pieces: list[bytes | memoryview] = []
    for index, size in enumerate(sizes):
        piece = bytes([index % 251]) * size
        pieces.append(memoryview(piece) if index % 2 else piece)
    expected = b"".join(pieces)
    left, right = socket.socketpair()
    with left, right:
        left.setblocking(False)
        right.setblocking(False)
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        received = bytearray()
        rest = pieces
        while rest:
            rest = _write_gathered(left.fileno(), rest)
            received += _drain(right)
        received += _drain(right)
    assert bytes(received) == expected


def test_a_full_socket_leaves_everything() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.setblocking(False)
        while True:
            try:
                left.send(b"x" * 65536)
            except BlockingIOError:
                break
        pieces: list[bytes | memoryview] = [b"a", b"b"]
        assert _write_gathered(left.fileno(), pieces) == pieces
