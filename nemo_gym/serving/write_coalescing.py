"""One write per answer: a response's head goes out together with its body.

uvicorn writes an answer's status line and headers, then its body, as two separate writes. On a
socket with Nagle off (every server here) that is two syscalls and two TCP segments per answer,
and the caller pays for both: two wake-ups, two reads, two parser feeds. For the small answers of
internal hops (a tool result, a model turn) those fixed costs are most of what a hop costs.

:func:`coalescing_protocol` subclasses uvicorn's HTTP protocol so that its transport holds a
response head back until the next write (the body, sent in the same step by every answer that
has one ready) and sends both with one vectored write. A head whose body does not follow in the
same event-loop step (an event stream waiting for its first event, a 100 Continue) goes out on
its own on the loop's next iteration, so nothing waits on a body that is not coming.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescingTransport:
    """A transport wrapper that joins a response head with the write that follows it."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.writelines((held, data))
            return
        if isinstance(data, bytes) and data.startswith(b"HTTP/") and data.endswith(b"\r\n\r\n"):
            self._held = data  # a response head: its body is usually the very next write
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        self.flush()
        self._transport.writelines(chunks)

    def flush(self) -> None:
        """Send a held response head now."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + (len(self._held) if self._held else 0)

    def __getattr__(self, name: str) -> Any:
        # Everything else (is_closing, pause_reading, get_extra_info, abort, ...) is the transport's.
        return getattr(self._transport, name)


def coalescing_protocol(base: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's HTTP protocol ``base`` whose answers leave in one write each."""

    class CoalescingProtocol(base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: Any) -> None:
            loop = getattr(self, "loop", None) or asyncio.get_running_loop()
            super().connection_made(CoalescingTransport(transport, loop))

    CoalescingProtocol.__name__ = f"Coalescing{base.__name__}"
    return CoalescingProtocol
