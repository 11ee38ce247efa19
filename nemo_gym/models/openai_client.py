"""``NeMoGymAsyncOpenAI``: NeMo Gym's small aiohttp client for OpenAI-compatible endpoints.

Used by NeMo Gym environments and adapters to call a judge or policy endpoint directly.
Unlike NeMo Gym's, retries are always bounded (``max_http_attempts`` tries for the statuses in
:data:`RETRY_ERROR_CODES`, with backoff and jitter; connection failures likewise), and every
call has a deadline: an endpoint that keeps failing becomes an error, never a hang. The HTTP and
the retries are :class:`~nemo_gym.serving.upstream.UpstreamHTTP`'s (one retry loop in nemo_gym).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from nemo_gym.failure_classes import TIMEOUT
from nemo_gym.serving.upstream import UpstreamError, UpstreamHTTP, UpstreamResponse

MAX_NUM_TRIES = 3
RATE_LIMIT_ERROR_CODES = [429, 502, 503, 504, 520]
RETRY_ERROR_CODES = RATE_LIMIT_ERROR_CODES + [404, 408, 500]
DEFAULT_TIMEOUT_S = 1800.0


class OpenAIEndpointError(Exception):
    """An OpenAI-compatible endpoint answered with an error status (``.status``, ``.response_content``;
    ``.answer``: the whole answer, its headers and attempts, when the client got one)."""

    def __init__(self, url: str, status: int, content: bytes, answer: UpstreamResponse | None = None) -> None:
        super().__init__(f"{url}: HTTP {status}: {content[:2000].decode(errors='replace')}")
        self.status = status
        self.response_content = content
        self.answer = answer


class NeMoGymAsyncOpenAI(BaseModel):
    """Calls an OpenAI-compatible endpoint: ``create_response``, ``create_chat_completion``, ...

    Each method takes the request's fields as keyword arguments and returns the parsed JSON.
    NeMo Gym's fields come first; the transport's (which statuses are retried, the connect
    timeout, the backoff, the connection cap) are this package's, used by ``openai_model``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    base_url: str
    api_key: str = ""
    internal: bool = False
    max_connection_retries: int | None = None
    max_http_attempts: int = Field(default=MAX_NUM_TRIES, ge=1)
    default_headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry_statuses: list[int] = Field(default_factory=lambda: list(RETRY_ERROR_CODES))
    connect_timeout_s: float = 10.0
    max_retry_delay_s: float = 8.0
    first_backoff_s: float = 0.25
    max_connections: int | None = None

    _http: UpstreamHTTP | None = PrivateAttr(default=None)
    _shared: bool = PrivateAttr(default=False)

    def use_transport(self, http: UpstreamHTTP) -> None:
        """Send through ``http``, a transport its owner built with this client's settings and
        closes itself (``openai_model``'s own: one connection pool, one ``max_connections`` cap,
        instead of a second pool of this client's)."""
        self._http = http
        self._shared = True

    def _client(self) -> UpstreamHTTP:
        if self._http is None:
            retries = self.max_connection_retries if self.max_connection_retries is not None else 4
            self._http = UpstreamHTTP(
                # Without a key no Authorization header (an endpoint that takes none may refuse one).
                headers={
                    **self.default_headers,
                    **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}),
                },
                request_timeout_s=self.timeout_s,
                connect_timeout_s=self.connect_timeout_s,
                connect_retries=retries,
                retry_statuses=self.retry_statuses,
                max_status_retries=self.max_http_attempts - 1,
                max_retry_delay_s=self.max_retry_delay_s,
                first_backoff_s=self.first_backoff_s,
                max_connections=self.max_connections,
            )
        return self._http

    async def aclose(self) -> None:
        """Close the connections this client opened (a transport it was lent stays open)."""
        if self._http is not None and not self._shared:
            await self._http.close()

    async def _call(self, method: str, url: str, body: Any = None) -> Any:
        try:
            answer = await self._client().request(method, url, body)
        except UpstreamError as exc:
            # NeMo Gym's callers catch aiohttp's errors (and asyncio's timeout).
            if exc.kind == TIMEOUT:
                raise TimeoutError(str(exc)) from exc
            raise aiohttp.ClientConnectionError(str(exc)) from exc
        if answer.status >= 400:
            raise OpenAIEndpointError(url, answer.status, answer.body, answer)
        return orjson.loads(answer.body) if answer.body else None

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
