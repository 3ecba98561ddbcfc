"""HTTP/2 for gRPC: the connection every rsgw client and server runs, configured once.

Sans-IO: `rsgw.grpc.protocol._connection` drives the connection this module builds, and the
Trio shells move its bytes. The connection is rsgw's own (`rsgw.http2._http2`), not
h2's; docs/decisions.md says why.
"""

from __future__ import annotations

from rsgw.http2._http2 import Http2Connection
from rsgw.http2._http2_state import INITIAL_WINDOW

#: HTTP/2 flow-control windows, stream and connection (the original's 32 MiB).
DEFAULT_WINDOW_BYTES = 32 * 1024 * 1024
#: Largest DATA frame we accept; big messages then cost few frames and events.
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024


def new_h2_connection(
    *,
    client_side: bool,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    max_concurrent_streams: int | None = None,
    max_header_list_bytes: int | None = None,
    connection_window_bytes: int | None = None,
) -> Http2Connection:
    """A connection configured for gRPC and already initiated.

    Our settings (windows, frame size, stream limit) go out in the first frame, and
    the connection window is opened to `connection_window_bytes` (default: the
    stream window's size).
    """
    conn = Http2Connection(
        client_side=client_side,
        window_bytes=window_bytes,
        max_frame_bytes=max_frame_bytes,
        max_concurrent_streams=max_concurrent_streams,
        max_header_list_bytes=max_header_list_bytes,
    )
    conn.initiate_connection()
    connection_window = window_bytes if connection_window_bytes is None else connection_window_bytes
    if connection_window > INITIAL_WINDOW:
        conn.increment_flow_control_window(connection_window - INITIAL_WINDOW)
    return conn
