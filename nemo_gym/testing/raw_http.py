"""Reading HTTP/1.1 requests off a raw asyncio stream: for tests whose loopback peer must write
its answer byte by byte (split heads, odd framing, hostile answers) instead of through a server."""

from __future__ import annotations

import asyncio


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The next request's head (its request line and headers, through the blank line) and its
    body (``Content-Length`` bytes, the header's name in any case; none without one)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)
