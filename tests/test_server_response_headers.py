"""A ServerResponse read through the hop client holds what aiohttp's path reads from the same
answer (status, body, cookies, header lines, ``header()``), its header lines parsed only when a
caller asks for them; against a real loopback server writing answers in our servers' strict form
and in forms only httptools' parser reads."""

from __future__ import annotations

import asyncio

import pytest

from nemo_gym.serving.server_client import ServerClient, ServerResponse
from nemo_gym.testing.raw_http import read_request

pytestmark = pytest.mark.timeout(60)

STRICT = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nX-Twice: first\r\n"
    b"set-cookie: session_id=abc; HttpOnly; Path=/\r\ncontent-length: 11\r\nx-twice: second\r\n\r\n"
    b'{"ok":true}'
)
CHUNKED = (
    b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nX-Kept: kept\r\n"
    b"Set-Cookie: other=1\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
)
NO_COOKIE = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-conversation: kept\r\n\r\n{}"


async def _serve(answer: bytes) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, _ = await read_request(reader)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _both(answer: bytes) -> tuple[ServerResponse, ServerResponse]:
    server, url = await _serve(answer)
    hop = ServerClient(static_urls={"peer": url})
    plain = ServerClient(static_urls={"peer": url})
    plain._use_hop_client = False  # aiohttp's path: its own parser, the reference
    try:
        assert hop._hop_target(url) is not None and plain._hop_target(url) is None
        return await hop.post("peer", "/x", {"a": 1}), await plain.post("peer", "/x", {"a": 1})
    finally:
        await hop.close()
        await plain.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("answer", [STRICT, CHUNKED, NO_COOKIE])
async def test_a_hop_answer_holds_what_aiohttp_reads(answer: bytes) -> None:
    ours, reference = await _both(answer)
    assert ours._raw_headers is None  # not parsed until asked for
    assert (ours.status, ours.body, ours.cookies, ours.base_url) == (
        reference.status,
        reference.body,
        reference.cookies,
        reference.base_url,
    )
    assert list(ours.raw_headers) == list(reference.raw_headers)
    for name in ("X-Twice", "x-twice", "X-KEPT", "x-conversation", "content-type", "absent"):
        assert ours.header(name) == reference.header(name)
    assert ours == ServerResponse(
        reference.status, reference.body, reference.cookies, reference.base_url, list(reference.raw_headers)
    )


async def test_the_last_repeated_header_wins_and_lines_can_be_replaced() -> None:
    ours, _ = await _both(STRICT)
    assert ours.header("x-twice") == "second" and ours.cookies == {"session_id": "abc"}
    ours.raw_headers = [(b"x-twice", b"third")]
    assert ours.header("X-Twice") == "third" and ours.raw_headers == [(b"x-twice", b"third")]
    assert "raw_headers=[(b'x-twice', b'third')]" in repr(ours)
