"""An in-memory network for shell tests: rsgw's `Network` seam over trio memory streams.

Servers listen and channels connect by `host:port` exactly as over TCP, but every
byte moves through `trio.testing.memory_stream_pair`, so a test runs in one Trio
run with no socket and can use the autojump clock: timeouts of seconds take no
wall time. The failures a real network has are scripted here:
- nobody listening: `connect` raises ConnectionRefusedError, as TCP does;
- a peer that dies: cancel its server (its streams close, the other end reads EOF);
- a peer that hangs (a SIGSTOPped worker): `freeze(target)` stops every byte to
  and from it until `thaw(target)`; `stall_clients(target)` stops its clients
  reading what it sends (a consumer that stops reading).
It also counts the bytes clients send to each target (`sent_to`), so a test can
see what went over the wire (a request forwarded compressed, say).
"""

from __future__ import annotations

import errno
import itertools
import math

import trio
import trio.testing

from rsgw.base._errors import ListenError

#: The key under which the client ends of a target's connections are frozen.
_CLIENTS = "clients of "
#: Where automatically chosen ports start (port 0 picks the next one).
FIRST_PORT = 40000


class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    """The server side of a memory address: accepts what `MemoryNetwork.connect` sends."""

    def __init__(self, network: MemoryNetwork, address: str) -> None:
        self._network = network
        self.address = address
        self._send, self._receive = trio.open_memory_channel[trio.abc.Stream](math.inf)
        self.closed = False

    async def accept(self) -> trio.abc.Stream:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError) as exc:
            raise trio.ClosedResourceError("listener closed") from exc

    async def aclose(self) -> None:
        self.closed = True
        self._network.forget(self)
        # Connections nobody accepted are reset, as TCP resets a closed listener's backlog.
        while True:
            try:
                stream = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            assert isinstance(stream, _Gated)
            stream.close_now()
        await self._receive.aclose()
        await trio.lowlevel.checkpoint()

    def offer(self, stream: trio.abc.Stream) -> None:
        self._send.send_nowait(stream)


class _Gated(trio.abc.Stream):
    """A stream that moves no byte while its key is frozen (`send_key` None: sends always)."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        network: MemoryNetwork,
        receive_key: str,
        send_key: str | None,
        counted_as: str | None = None,
    ) -> None:
        self._stream = stream
        self._network = network
        self._receive_key = receive_key
        self._send_key = send_key
        self._counted_as = counted_as

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._send_key is not None:
            await self._network.wait_thawed(self._send_key)
        if self._counted_as is not None:
            sent = self._network.sent_to
            sent[self._counted_as] = sent.get(self._counted_as, 0) + len(data)
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._stream.receive_some(max_bytes)
        await self._network.wait_thawed(self._receive_key)
        return data

    async def send_eof(self) -> None:
        await self._stream.send_eof()  # type: ignore[attr-defined]  # StapledStream has it

    async def aclose(self) -> None:
        await self._stream.aclose()

    def close_now(self) -> None:
        """Close both directions without a checkpoint (the peer reads EOF)."""
        stream = self._stream
        assert isinstance(stream, trio.StapledStream)
        stream.send_stream.close()
        stream.receive_stream.close()


class MemoryNetwork:
    """Listeners and connections by address, all in memory; see the module docstring."""

    def __init__(self) -> None:
        self._listeners: dict[str, MemoryListener] = {}
        self._ports = itertools.count(FIRST_PORT)
        self._frozen: dict[str, trio.Event] = {}
        #: Connections made so far, by target.
        self.connects: dict[str, int] = {}
        #: Bytes clients sent to each target so far.
        self.sent_to: dict[str, int] = {}

    def listen(self, host: str, port: int) -> tuple[trio.abc.Listener[trio.abc.Stream], int]:
        if port == 0:
            port = next(self._ports)
        address = f"{host}:{port}"
        if address in self._listeners:
            raise ListenError(f"cannot listen on {address}: address already in use")
        listener = self._listeners[address] = MemoryListener(self, address)
        return listener, port

    async def connect(self, target: str) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        listener = self._listeners.get(target)
        if listener is None or listener.closed:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        self.connects[target] = self.connects.get(target, 0) + 1
        client, server = trio.testing.memory_stream_pair()
        listener.offer(_Gated(server, self, target, target))
        return _Gated(client, self, _CLIENTS + target, None, counted_as=target)

    def forget(self, listener: MemoryListener) -> None:
        if self._listeners.get(listener.address) is listener:
            del self._listeners[listener.address]

    def freeze(self, target: str) -> None:
        """The peer at `target` stops: nothing it sends or receives moves (SIGSTOP)."""
        self._frozen.setdefault(target, trio.Event())

    def thaw(self, target: str) -> None:
        """The peer at `target` runs again (SIGCONT): what waited moves on."""
        event = self._frozen.pop(target, None)
        if event is not None:
            event.set()

    def stall_clients(self, target: str) -> None:
        """The clients of `target` stop reading what it sends (a stuck consumer)."""
        self.freeze(_CLIENTS + target)

    def resume_clients(self, target: str) -> None:
        self.thaw(_CLIENTS + target)

    async def wait_thawed(self, target: str) -> None:
        while (event := self._frozen.get(target)) is not None:
            await event.wait()
