"""NeMo Gym's ``nemo_gym.server_utils`` names, for trainers that import them (NeMo RL, verl, verifiers).

A compatibility layer with no logic of its own, over :mod:`nemo_gym.serving.server_client`:

- ``HEAD_SERVER_KEY_NAME``, ``BaseServerConfig`` (NeMo RL and verl build the head server's
  address with them), ``SESSION_ID_KEY``;
- ``ServerClient(head_server_config=, global_config_dict=)`` whose ``post``/``get`` answer like
  aiohttp responses (``await resp.json()``), as NeMo Gym-style code expects;
- the process-wide aiohttp client verifiers sets up (``GlobalAIOHTTPAsyncClientConfig``,
  ``set_global_aiohttp_client``, ``is_global_aiohttp_client_setup``, ``get_global_aiohttp_client``):
  its connection limits are the configured ones, lowered to what the open-file limit allows.
  nemo_gym's own clients keep one session per event loop and do not use it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict

from nemo_gym.config_types import BaseServerConfig
from nemo_gym.global_config import HEAD_SERVER_KEY_NAME, get_global_config_dict
from nemo_gym.serving.protocol import SESSION_COOKIE
from nemo_gym.serving.server_client import ServerCallError, ServerResponse, capped_connector
from nemo_gym.serving.server_client import ServerClient as _ServerClient

__all__ = [
    "HEAD_SERVER_KEY_NAME",
    "SESSION_ID_KEY",
    "BaseServerConfig",
    "ClientResponse",
    "GlobalAIOHTTPAsyncClientConfig",
    "ServerClient",
    "get_global_aiohttp_client",
    "get_response_json",
    "global_aiohttp_client_exit",
    "is_global_aiohttp_client_setup",
    "set_global_aiohttp_client",
]

SESSION_ID_KEY = SESSION_COOKIE

_GLOBAL_AIOHTTP_CLIENT: aiohttp.ClientSession | None = None


class ClientResponse:
    """A finished answer shaped like aiohttp's: ``status``, ``ok``, ``cookies``, ``await read()/json()/text()``."""

    def __init__(self, response: ServerResponse, server_name: str, url_path: str) -> None:
        self.status = response.status
        self.ok = response.ok
        self.cookies = response.cookies
        self._response = response
        self._where = (server_name, url_path)

    async def read(self) -> bytes:
        """The raw body."""
        return self._response.body

    async def json(self, **_: Any) -> Any:
        """The body parsed as JSON."""
        return self._response.json()

    async def text(self) -> str:
        """The body as text."""
        return self._response.body.decode(errors="replace")

    def raise_for_status(self) -> None:
        """Raise :class:`~nemo_gym.serving.server_client.ServerCallError` (with ``.status``) for a non-2xx answer."""
        if not self.ok:
            raise ServerCallError(
                "http_error", *self._where, f"HTTP {self.status}: {self._response.body[:2000]!r}", self.status
            )


class ServerClient(_ServerClient):
    """NeMo Gym's client constructor: the head server's ``BaseServerConfig`` and the global config."""

    def __init__(self, head_server_config: Any = None, global_config_dict: Any = None, **kwargs: Any) -> None:
        head_url = (
            f"http://{head_server_config.host}:{head_server_config.port}" if head_server_config else None
        )
        super().__init__(head_url, **kwargs)
        self.head_server_config = head_server_config
        self.global_config_dict = global_config_dict

    async def post(self, server_name: str, url_path: str, json: Any = None, **kwargs: Any) -> Any:
        """POST to a named server; an aiohttp-shaped :class:`ClientResponse`."""
        if isinstance(json, BaseModel):
            json = json.model_dump(exclude_unset=True)
        resp = await self.request("POST", server_name, url_path, json, **kwargs)
        return ClientResponse(resp, server_name, url_path)

    async def get(self, server_name: str, url_path: str, **kwargs: Any) -> Any:
        """GET from a named server; an aiohttp-shaped :class:`ClientResponse`."""
        resp = await self.request("GET", server_name, url_path, None, **kwargs)
        return ClientResponse(resp, server_name, url_path)


async def get_response_json(response: ClientResponse) -> Any:
    """The JSON body of a :class:`ClientResponse`."""
    return orjson.loads(await response.read())


class GlobalAIOHTTPAsyncClientConfig(BaseModel):
    """Connection limits of the process-wide client (read from the global config's keys)."""

    model_config = ConfigDict(extra="ignore")

    global_aiohttp_connector_limit: int = 100 * 1024
    global_aiohttp_connector_limit_per_host: int = 1024
    global_aiohttp_client_request_debug: bool = False


def set_global_aiohttp_client(cfg: GlobalAIOHTTPAsyncClientConfig) -> aiohttp.ClientSession:
    """Create the process-wide client (call inside the event loop that will use it)."""
    global _GLOBAL_AIOHTTP_CLIENT
    if _GLOBAL_AIOHTTP_CLIENT is not None:
        raise RuntimeError(
            "the global aiohttp client is already set up; close it first (global_aiohttp_client_exit)"
        )
    connector = capped_connector(
        cfg.global_aiohttp_connector_limit, cfg.global_aiohttp_connector_limit_per_host
    )
    _GLOBAL_AIOHTTP_CLIENT = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
    return _GLOBAL_AIOHTTP_CLIENT


def is_global_aiohttp_client_setup() -> bool:
    """Whether the process-wide client exists."""
    return _GLOBAL_AIOHTTP_CLIENT is not None


def get_global_aiohttp_client() -> aiohttp.ClientSession:
    """The process-wide client, created from the global config on first use."""
    if _GLOBAL_AIOHTTP_CLIENT is None:
        return set_global_aiohttp_client(
            GlobalAIOHTTPAsyncClientConfig.model_validate(dict(get_global_config_dict()))
        )
    return _GLOBAL_AIOHTTP_CLIENT


def global_aiohttp_client_exit() -> None:
    """Close the process-wide client (from outside any running event loop)."""
    global _GLOBAL_AIOHTTP_CLIENT
    client, _GLOBAL_AIOHTTP_CLIENT = _GLOBAL_AIOHTTP_CLIENT, None
    if client is not None and not client.closed:
        asyncio.run(client.close())
