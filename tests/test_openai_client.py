"""NeMo Gym's ``NeMoGymAsyncOpenAI`` against a real endpoint on loopback: bounded status retries,
the final error status raised, and connection failures as aiohttp's errors (NeMo Gym's callers
catch those), all through the one retry loop of ``serving/transport.py``."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from nemo_gym.models.openai_client import OpenAIEndpointError
from nemo_gym.openai_utils import NeMoGymAsyncOpenAI
from nemo_gym.testing import running_app


def flaky_endpoint(failures: int, status: int = 503) -> tuple[Starlette, list[str]]:
    """An OpenAI-shaped endpoint that answers ``status`` ``failures`` times, then a completion."""
    seen: list[str] = []

    async def chat(request: Request) -> JSONResponse:
        seen.append(request.headers.get("authorization", ""))
        if len(seen) <= failures:
            return JSONResponse(
                {"error": {"message": f"failure {len(seen)}"}}, status, headers={"retry-after": "0"}
            )
        return JSONResponse({"choices": [{"message": {"role": "assistant", "content": "hi"}}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]), seen


def test_a_retryable_status_is_retried_then_answered() -> None:
    app, seen = flaky_endpoint(failures=2)
    with running_app(app) as url:
        client = NeMoGymAsyncOpenAI(base_url=url + "/v1", api_key="k", max_http_attempts=3)
        body = asyncio.run(client.create_chat_completion(model="m", messages=[]))
    assert body["choices"][0]["message"]["content"] == "hi"
    assert seen == ["Bearer k"] * 3


def test_the_last_error_status_is_raised_after_the_bounded_attempts() -> None:
    app, seen = flaky_endpoint(failures=10)
    with running_app(app) as url:
        client = NeMoGymAsyncOpenAI(base_url=url + "/v1", max_http_attempts=2)
        with pytest.raises(OpenAIEndpointError) as info:
            asyncio.run(client.create_chat_completion(model="m", messages=[]))
    assert info.value.status == 503 and b"failure 2" in info.value.response_content
    assert len(seen) == 2


def test_a_refused_connection_is_aiohttps_connection_error() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    client = NeMoGymAsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", max_connection_retries=1)
    with pytest.raises(aiohttp.ClientConnectionError, match="2 attempts"):
        asyncio.run(client.create_models())
