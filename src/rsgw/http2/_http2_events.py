"""HTTP/2's vocabulary for `rsgw.http2._http2`: error and setting codes, errors, events.

The events carry h2's names and fields (h2 is the oracle the connection is tested
against, tests/grpc/test_http2.py), as slotted classes: one is made per frame on the
hot path, and h2's dataclasses cost several times as much to build.
"""

from __future__ import annotations

import enum

Header = tuple[bytes, bytes]


class ErrorCodes(enum.IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class SettingCodes(enum.IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6
    ENABLE_CONNECT_PROTOCOL = 0x8


# -- errors ----------------------------------------------------------------------------


class ProtocolError(Exception):
    """The peer broke HTTP/2 (raised by `receive_data`), or a send is not allowed."""

    error_code = ErrorCodes.PROTOCOL_ERROR

    def __init__(self, message: str, error_code: int | None = None) -> None:
        super().__init__(message)
        if error_code is not None:
            self.error_code = ErrorCodes(error_code)


class StreamClosedError(ProtocolError):
    """A send on a stream that is not open for sending."""

    error_code = ErrorCodes.STREAM_CLOSED


class TooManyStreamsError(ProtocolError):
    """Opening this stream would pass the peer's (or our) concurrent stream limit."""


class FlowControlError(ProtocolError):
    error_code = ErrorCodes.FLOW_CONTROL_ERROR


# -- events: h2's names and fields ------------------------------------------------------


class Event:
    __slots__ = ()

    def __repr__(self) -> str:
        names: tuple[str, ...] = ()
        for cls in type(self).__mro__:
            names += getattr(cls, "__slots__", ())
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__name__}({fields})"


class _HeadersEvent(Event):
    __slots__ = ("headers", "stream_ended", "stream_id")

    def __init__(self, stream_id: int, headers: list[Header]) -> None:
        self.stream_id = stream_id
        self.headers = headers
        self.stream_ended: StreamEnded | None = None


class RequestReceived(_HeadersEvent):
    __slots__ = ()


class ResponseReceived(_HeadersEvent):
    __slots__ = ()


class TrailersReceived(_HeadersEvent):
    __slots__ = ()


class InformationalResponseReceived(_HeadersEvent):
    __slots__ = ()


class DataReceived(Event):
    __slots__ = ("data", "flow_controlled_length", "stream_ended", "stream_id")

    def __init__(
        self, stream_id: int, data: bytes | memoryview, flow_controlled_length: int
    ) -> None:
        self.stream_id = stream_id
        self.data = data
        self.flow_controlled_length = flow_controlled_length
        self.stream_ended: StreamEnded | None = None


class StreamEnded(Event):
    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class StreamReset(Event):
    __slots__ = ("error_code", "remote_reset", "stream_id")

    def __init__(self, stream_id: int, error_code: int, remote_reset: bool = True) -> None:
        self.stream_id = stream_id
        self.error_code = error_code
        self.remote_reset = remote_reset


class WindowUpdated(Event):
    __slots__ = ("delta", "stream_id")

    def __init__(self, stream_id: int, delta: int) -> None:
        self.stream_id = stream_id
        self.delta = delta


class RemoteSettingsChanged(Event):
    __slots__ = ("changed_settings",)

    def __init__(self, changed_settings: dict[int, tuple[int | None, int]]) -> None:
        #: setting code -> (its value before, its value now)
        self.changed_settings = changed_settings


class SettingsAcknowledged(Event):
    __slots__ = ()


class PingReceived(Event):
    __slots__ = ("ping_data",)

    def __init__(self, ping_data: bytes) -> None:
        self.ping_data = ping_data


class PingAckReceived(PingReceived):
    __slots__ = ()


class PriorityUpdated(Event):
    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class ConnectionTerminated(Event):
    __slots__ = ("additional_data", "error_code", "last_stream_id")

    def __init__(self, error_code: int, last_stream_id: int, additional_data: bytes) -> None:
        self.error_code = error_code
        self.last_stream_id = last_stream_id
        self.additional_data = additional_data
