"""Client-side instructions per internal hop, for valgrind's callgrind (load-independent).

Posts the first example_single_tool_call row ``N`` times (after 20 warm-up posts) through one
rollout of ``ServerClient`` to an echo server at ``URL``; ``--bare``: a bare aiohttp session
instead; ``--hop``: the bare lean hop client (``nemo_gym.serving.hop_client``). ``ServerClient``
sends plain-HTTP hops through the hop client unless ``NEMO_GYM_HOP_CLIENT=aiohttp``.
Run it under callgrind for two values of ``N`` and divide the difference of the "Collected"
instruction counts by the difference of ``N``: start-up and imports cancel out, and the count
does not depend on what else the machine is doing.

    python scripts/callgrind_client_hop.py --serve 18777 &      # a bare starlette/uvicorn echo
    valgrind --tool=callgrind --callgrind-out-file=/tmp/a python scripts/callgrind_client_hop.py http://127.0.0.1:18777 50
    valgrind --tool=callgrind --callgrind-out-file=/tmp/b python scripts/callgrind_client_hop.py http://127.0.0.1:18777 250
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ROW = orjson.loads(
    (ROOT / "resources_servers/example_single_tool_call/data/example.jsonl").open("rb").readline()
)


def serve(port: int) -> None:
    """A bare echo server (the floor's server side)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")

    app = Starlette(routes=[Route("/{path:path}", echo, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


async def hops(url: str, n: int, bare: bool, hop: bool = False) -> None:
    """``20 + n`` posts of the example row to ``url``."""
    if hop:
        from urllib.parse import urlsplit

        from nemo_gym.serving import hop_client

        parts = urlsplit(url)
        pool = hop_client.HopPool(64)
        headers = hop_client.encode_headers([("Content-Type", "application/json")])
        for _ in range(20 + n):
            resp = await hop_client.request(
                pool,
                "POST",
                parts.hostname or "127.0.0.1",
                parts.port or 80,
                "/verify",
                headers,
                orjson.dumps(ROW),
                deadline=pool.loop.time() + 60,
            )
            orjson.loads(resp.body)
        pool.close()
        return
    if bare:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            for _ in range(20 + n):
                headers = {"Content-Type": "application/json"}
                async with session.post(url + "/verify", data=orjson.dumps(ROW), headers=headers) as resp:
                    orjson.loads(await resp.read())
        return
    from nemo_gym.serving.server_client import ServerClient

    rollout = ServerClient(static_urls={"echo": url}).rollout()
    for _ in range(20 + n):
        await rollout.post("echo", "/verify", json=ROW)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
    else:
        asyncio.run(hops(sys.argv[1], int(sys.argv[2]), "--bare" in sys.argv[3:], "--hop" in sys.argv[3:]))
