"""The Cookie line a rollout's calls carry, on the wire of a real loopback server: the cookies each
server set for this rollout (in the order they were set, a changed value replacing the old),
none for another rollout or another server, over the hop client and over aiohttp alike."""

from __future__ import annotations

import asyncio

import pytest

from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing.raw_http import read_request

pytestmark = pytest.mark.timeout(60)


async def _recording_server(set_cookies: dict[str, list[bytes]]) -> tuple[asyncio.Server, str, list[bytes]]:
    """Answers ``{}``; a request whose path ends in a key of ``set_cookies`` gets those Set-Cookie
    lines. The request heads it got, in order."""
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, _ = await read_request(reader)
                heads.append(head)
                path = head.split(b" ", 2)[1].decode()
                extra = b"".join(
                    b"set-cookie: " + value + b"\r\n"
                    for suffix, values in set_cookies.items()
                    if path.endswith(suffix)
                    for value in values
                )
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n" + extra + b"\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", heads


def _cookie_lines(head: bytes) -> list[bytes]:
    return [line for line in head.split(b"\r\n") if line.lower().startswith(b"cookie:")]


@pytest.mark.parametrize("hop_client", [True, False])
async def test_a_rollout_sends_the_cookies_its_servers_set(hop_client: bool) -> None:
    cookies = {"/seed": [b"session_id=s1; Path=/", b"other=o1"], "/again": [b"session_id=s2"]}
    one, url_one, heads_one = await _recording_server(cookies)
    two, url_two, heads_two = await _recording_server(cookies)
    client = ServerClient(static_urls={"one": url_one, "two": url_two})
    client._use_hop_client = hop_client
    try:
        rollout, other = client.rollout("r1"), client.rollout("r2")
        await rollout.post("one", "/seed", {"a": 1})
        for _ in range(2):
            await rollout.post("one", "/tool", {"a": 1})
        await other.post("one", "/tool", {})
        await rollout.post("two", "/tool", {})
        await rollout.post("one", "/again", None)
        await rollout.post("one", "/tool", {"a": 2})
        lines = [_cookie_lines(head) for head in heads_one]
        assert lines == [
            [],
            [b"Cookie: session_id=s1; other=o1"],
            [b"Cookie: session_id=s1; other=o1"],
            [],  # another rollout
            [b"Cookie: session_id=s1; other=o1"],
            [b"Cookie: session_id=s2; other=o1"],  # the new value, in the jar's order
        ]
        assert [_cookie_lines(head) for head in heads_two] == [[]]  # another server
    finally:
        await client.close()
        for server in (one, two):
            server.close()
            await server.wait_closed()
