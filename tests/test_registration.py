"""A server's registration with the head server: retried while the head is not up yet, refused loudly."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from nemo_gym.serving.registration import register_with_head


async def _head(status: int, seen: list[dict], sock: socket.socket, delay_s: float) -> web.AppRunner:
    async def register(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.Response(status=status, text="ok" if status == 200 else "bad secret")

    app = web.Application()
    app.router.add_post("/register", register)
    runner = web.AppRunner(app)
    await runner.setup()
    await asyncio.sleep(delay_s)  # until then, connecting is refused: the port is bound, not listening
    sock.listen()
    await web.SockSite(runner, sock).start()
    return runner


async def _register_with(status: int, delay_s: float) -> list[dict]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    seen: list[dict] = []
    head = asyncio.create_task(_head(status, seen, sock, delay_s))
    try:
        await register_with_head(url, "env", "resources_servers", "127.0.0.1", 4321)
    finally:
        await (await head).cleanup()
        sock.close()
    return seen


def test_registration_waits_for_a_head_server_still_starting() -> None:
    seen = asyncio.run(_register_with(200, delay_s=0.5))
    assert [(s["name"], s["server_type"], s["port"]) for s in seen] == [("env", "resources_servers", 4321)]


def test_a_refused_registration_names_the_server_and_the_answer() -> None:
    with pytest.raises(RuntimeError, match=r"refused registration of 'env': 403 bad secret"):
        asyncio.run(_register_with(403, delay_s=0.0))
