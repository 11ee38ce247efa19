"""How a ServerClient picks the replica of a named server on each call, against a real loopback
head server and real servers: a name the head server listed is reused for RESOLVE_TTL_S (no
lookup per call), asked again after it, and a rollout's call goes where base_url sends it."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from nemo_gym.serving import server_client
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing.raw_http import read_request

pytestmark = pytest.mark.timeout(60)


async def _http_server(answer_for: object) -> tuple[asyncio.Server, str, list[str]]:
    """A server answering every request with ``answer_for(path)`` as JSON; the paths it got."""
    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, _ = await read_request(reader)
                path = head.split(b" ", 2)[1].decode()
                seen.append(path)
                body = orjson.dumps(answer_for(path))  # type: ignore[operator]
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen


def _instance(name: str, url: str) -> dict[str, object]:
    port = int(url.rsplit(":", 1)[1])
    return {"name": name, "url": url, "host": "127.0.0.1", "port": port, "pid": 0, "server_type": "x"}


async def test_a_resolved_name_is_reused_within_its_ttl_and_asked_again_after() -> None:
    servers = [await _http_server(lambda path, who=who: {"who": who}) for who in ("a", "b", "c")]
    urls = [url for _, url, _ in servers]
    listed = {"svc": [urls[0]]}
    head, head_url, lookups = await _http_server(
        lambda path: [_instance(name, url) for name, named in listed.items() for url in named]
    )
    client = ServerClient(head_url)
    try:
        assert (await client.post_json("svc", "/x", {}))["who"] == "a"
        listed["svc"] = [urls[1]]  # the server moved: within the TTL the client does not know yet
        assert (await client.post_json("svc", "/x", {}))["who"] == "a"
        assert lookups == ["/server_instances"]  # one lookup for both calls
        client._resolved_at -= server_client.RESOLVE_TTL_S  # the TTL passed
        assert (await client.post_json("svc", "/x", {}))["who"] == "b"
        assert len(lookups) == 2
        # Two replicas: a rollout's calls go where base_url sends its id, every time.
        listed["svc"] = [urls[1], urls[2]]
        client._resolved_at -= server_client.RESOLVE_TTL_S
        rollout = client.rollout("r-1")
        expected = await client.base_url("svc", affinity="r-1")
        who = {expected: "b" if expected == urls[1] else "c"}[expected]
        for _ in range(3):
            assert (await rollout.post_json("svc", "/x", {}))["who"] == who
        assert servers[1 if who == "b" else 2][2][-1] == "/ng-rollout/r-1/x"
    finally:
        await client.close()
        for server, _, _ in [*servers, (head, head_url, lookups)]:
            server.close()
            await server.wait_closed()
