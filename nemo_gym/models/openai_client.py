"""``NeMoGymAsyncOpenAI``: NeMo Gym's small aiohttp client for OpenAI-compatible endpoints.

Used by NeMo Gym environments and adapters to call a judge or policy endpoint directly.
Unlike NeMo Gym's, retries are always bounded (``max_http_attempts`` tries for the statuses in
:data:`RETRY_ERROR_CODES`, with backoff and jitter; connection failures likewise), and every
call has a deadline: an endpoint that keeps failing becomes an error, never a hang.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

MAX_NUM_TRIES = 3
RATE_LIMIT_ERROR_CODES = [429, 502, 503, 504, 520]
RETRY_ERROR_CODES = RATE_LIMIT_ERROR_CODES + [404, 408, 500]
DEFAULT_TIMEOUT_S = 1800.0


class OpenAIEndpointError(Exception):
    """An OpenAI-compatible endpoint answered with an error status (``.status``, ``.response_content``)."""

    def __init__(self, url: str, status: int, content: bytes) -> None:
        super().__init__(f"{url}: HTTP {status}: {content[:2000].decode(errors='replace')}")
        self.status = status
        self.response_content = content


class NeMoGymAsyncOpenAI(BaseModel):
    """Calls an OpenAI-compatible endpoint: ``create_response``, ``create_chat_completion``, ...

    Each method takes the request's fields as keyword arguments and returns the parsed JSON.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    base_url: str
    api_key: str = ""
    internal: bool = False
    max_connection_retries: int | None = None
    max_http_attempts: int = Field(default=MAX_NUM_TRIES, ge=1)
    default_headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    _sessions: dict[Any, aiohttp.ClientSession] = PrivateAttr(default_factory=dict)

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
            self._sessions[loop] = session
        return session

    async def _call(self, method: str, url: str, body: Any = None) -> Any:
        headers = {**self.default_headers, "Authorization": f"Bearer {self.api_key}"}
        data = orjson.dumps(body) if body is not None else None
        if data is not None:
            headers["Content-Type"] = "application/json"
        connect_tries = 1 + (self.max_connection_retries if self.max_connection_retries is not None else 4)
        http_tries = self.max_http_attempts
        attempt = 0
        delay = 0.25
        while True:
            attempt += 1
            try:
                async with self._session().request(
                    method,
                    url,
                    data=data,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                ) as resp:
                    content = await resp.read()
                    if resp.status < 400:
                        return orjson.loads(content) if content else None
                    if resp.status not in RETRY_ERROR_CODES or attempt >= http_tries:
                        raise OpenAIEndpointError(url, resp.status, content)
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError):
                if attempt >= connect_tries:
                    raise
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 8.0)

    async def create_response(self, **kwargs: Any) -> Any:
        """``POST {base_url}/responses``."""
        return await self._call("POST", f"{self.base_url}/responses", kwargs)

    async def create_chat_completion(self, **kwargs: Any) -> Any:
        """``POST {base_url}/chat/completions``."""
        return await self._call("POST", f"{self.base_url}/chat/completions", kwargs)

    async def create_completion(self, **kwargs: Any) -> Any:
        """``POST {base_url}/completions``."""
        return await self._call("POST", f"{self.base_url}/completions", kwargs)

    async def create_models(self) -> Any:
        """``GET {base_url}/models``."""
        return await self._call("GET", f"{self.base_url}/models")

    async def create_tokenize(self, **kwargs: Any) -> Any:
        """``POST /tokenize`` at the server root (``base_url`` without ``/v1``)."""
        return await self._call("POST", f"{self.base_url.removesuffix('/v1')}/tokenize", kwargs)
