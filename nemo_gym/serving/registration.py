"""Registration with the head server: the port a server process really bound."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from nemo_gym.serving.protocol import (
    ENV_NODE_ID,
    ENV_NODE_IP,
    REGISTRATION_SECRET_HEADER,
    auth_headers,
    registration_secret,
)


async def register_with_head(head_url: str, name: str, server_type: str, host: str, port: int) -> None:
    """Tell the head server which port this process really bound."""
    import aiohttp

    body: dict[str, Any] = {
        "name": name,
        "server_type": server_type,
        "host": host,
        "port": port,
        "pid": os.getpid(),
    }
    for key, env in (("node_id", ENV_NODE_ID), ("node_ip", ENV_NODE_IP)):
        if os.environ.get(env):
            body[key] = os.environ[env]
    headers = auth_headers()
    secret = registration_secret()
    if secret:
        headers[REGISTRATION_SECRET_HEADER] = secret
    delay = 0.05
    for attempt in range(20):
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{head_url}/register", json=body, headers=headers) as resp:
                    if resp.status == 200:
                        return
                    text = await resp.text()
                    raise RuntimeError(
                        f"head server at {head_url} refused registration of {name!r}: {resp.status} {text}"
                    )
        except aiohttp.ClientConnectionError:
            if attempt == 19:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
