"""Registration with the head server: the port a server process really bound."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from nemo_gym.serving.protocol import (
    ENV_NODE_ID,
    ENV_NODE_IP,
    REGISTRATION_SECRET_HEADER,
    auth_headers,
    registration_secret,
)
from nemo_gym.serving.transport import NotConnected, RetryPolicy, TransportFailure, send_with_retries


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

    async def attempt(_seconds_left: float, _number: int) -> _Answer:
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{head_url}/register", json=body, headers=headers) as resp:
                    return _Answer(resp.status, await resp.text())
        except aiohttp.ClientConnectionError as exc:
            raise NotConnected(exc) from exc

    # The head server may still be starting: connection failures are retried by the one retry
    # loop (about 20 tries over ~15 s), the last one raised as it is.
    policy = RetryPolicy(connect_retries=19, first_backoff_s=0.05, max_delay_s=1.0)
    try:
        answer = await send_with_retries(attempt, policy, math.inf)
    except TransportFailure as exc:
        raise exc.__cause__ or exc from None
    if answer.status != 200:
        raise RuntimeError(
            f"head server at {head_url} refused registration of {name!r}: {answer.status} {answer.text}"
        )


@dataclass
class _Answer:
    """The head server's answer to a registration."""

    status: int
    text: str
