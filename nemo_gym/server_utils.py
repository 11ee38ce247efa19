"""Compatibility: NeMo Gym's ``nemo_gym.server_utils`` names, for trainers and NeMo Gym-style server code.

A compatibility layer over :mod:`nemo_gym.serving.server_client` and :mod:`nemo_gym.serving.server`:

- ``HEAD_SERVER_KEY_NAME``, ``BaseServerConfig`` (NeMo RL and verl build the head server's
  address with them), ``SESSION_ID_KEY`` (``request.session[SESSION_ID_KEY]`` in a route);
- ``ServerClient(head_server_config=, global_config_dict=)`` whose ``post``/``get`` answer like
  aiohttp responses (``await resp.json()``), ``raise_for_status`` and ``get_response_json``
  for those answers, ``request`` (one call to a URL through the process-wide client);
- the server classes ``BaseServer``/``SimpleServer`` and NeMo Gym's worker-entrypoint checks;
- the process-wide aiohttp client verifiers sets up (``GlobalAIOHTTPAsyncClientConfig``,
  ``set_global_aiohttp_client``, ``is_global_aiohttp_client_setup``, ``get_global_aiohttp_client``):
  its connection limits are the configured ones, lowered to what the open-file limit allows.
  nemo_gym's own clients keep one session per event loop and do not use it.

Unlike NeMo Gym's, ``request`` retries a failed connection a bounded number of times.
"""

from __future__ import annotations

import asyncio
import math
import os
from typing import Any

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict

from nemo_gym.config_types import TOKEN_CAPTURE_PATH_SEGMENT, BaseServerConfig
from nemo_gym.global_config import HEAD_SERVER_KEY_NAME, get_first_server_config_dict, get_global_config_dict
from nemo_gym.models.openai_client import MAX_NUM_TRIES
from nemo_gym.serving.nemo_gym_client import ClientResponse, HTTPStatusError
from nemo_gym.serving.nemo_gym_client import NeMoGymServerClient as ServerClient
from nemo_gym.serving.protocol import ROLLOUT_PREFIX, SESSION_COOKIE
from nemo_gym.serving.served_names import served_name
from nemo_gym.serving.server import BaseServer
from nemo_gym.serving.server_client import capped_connector
from nemo_gym.serving.transport import NotConnected, RetryPolicy, TransportFailure, send_with_retries
from nemo_gym.telemetry.connection_pool import reset_server_name, set_server_name

__all__ = [
    "HEAD_SERVER_KEY_NAME",
    "MAX_NUM_TRIES",
    "SESSION_ID_KEY",
    "BaseServer",
    "BaseServerConfig",
    "ClientResponse",
    "GlobalAIOHTTPAsyncClientConfig",
    "ServerClient",
    "SimpleServer",
    "apply_rollout_prefix",
    "get_first_server_config_dict",
    "get_global_aiohttp_client",
    "get_response_json",
    "get_server_url",
    "global_aiohttp_client_exit",
    "is_global_aiohttp_client_request_debug_enabled",
    "is_global_aiohttp_client_setup",
    "is_nemo_gym_fastapi_entrypoint",
    "raise_for_status",
    "request",
    "rollout_path_prefix",
    "set_global_aiohttp_client",
]

SESSION_ID_KEY = SESSION_COOKIE
# Base of NeMo Gym servers that build their app in setup_webserver(): our one server base.
SimpleServer = BaseServer
IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME = "IS_NEMO_GYM_FASTAPI_WORKER"
IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME = "IS_NEMO_GYM_FASTAPI_ENTRYPOINT"

_GLOBAL_AIOHTTP_CLIENT: aiohttp.ClientSession | None = None
_GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG = False
# NeMo Gym's switch for labelling calls only with its queue-timing connector; calls here are
# always labelled (a context variable, no cost worth a switch). Kept for code that sets it.
_GLOBAL_AIOHTTP_CLIENT_QUEUE_TELEMETRY = False


def is_nemo_gym_fastapi_worker() -> bool:
    """Whether this process is one of NeMo Gym's multi-worker uvicorn workers (never here: one process per server)."""
    return os.environ.get(IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME) == "1"


def is_nemo_gym_fastapi_entrypoint(file: str) -> bool:
    """Whether ``file`` is the entrypoint a NeMo Gym worker process imports (False unless a worker)."""
    entry = os.environ.get(IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME)
    return is_nemo_gym_fastapi_worker() and bool(entry) and file.endswith(entry or "")


async def raise_for_status(response: Any, content: bytes | None = None) -> None:
    """Raise the answer's own ``aiohttp.ClientResponseError`` for a non-2xx status, its body in ``response_content``.

    Answers of :class:`ServerClient` raise :class:`~nemo_gym.serving.nemo_gym_client.HTTPStatusError`
    (a ``ClientResponseError`` that the server base also files as the downstream server's failure).
    """
    if response.ok:
        return
    if content is None:
        # The body stream, as NeMo Gym reads it (``read()`` of an aiohttp answer would buffer it).
        stream = getattr(response, "content", None)
        content = await stream.read() if stream is not None else await response.read()
    try:
        response.raise_for_status()
    except aiohttp.ClientResponseError as exc:
        exc.response_content = content  # type: ignore[attr-defined]
        raise
    # An answer object whose raise_for_status does not raise for this status.
    where = getattr(response, "server_name", None) or str(getattr(response, "url", ""))
    raise HTTPStatusError(where, getattr(response, "url_path", ""), response.status, content or b"")


async def get_response_json(response: Any) -> Any:
    """The JSON body of an answer."""
    return orjson.loads(await response.read())


async def request(
    method: str,
    url: str,
    _internal: bool = False,
    _max_connection_retries: int | None = None,
    _server_name: str | None = None,
    **kwargs: Any,
) -> aiohttp.ClientResponse:
    """One HTTP call to ``url`` through the process-wide client (``json=`` a dict or pydantic model).

    A refused or dropped connection is retried up to ``_max_connection_retries`` (at most
    ``MAX_NUM_TRIES``) times with backoff and jitter; the answer is returned whatever its status
    (see :func:`raise_for_status`). The call and its retries carry ``_server_name`` as their
    destination label (:mod:`nemo_gym.telemetry.connection_pool`; ``"external"`` by default).
    """
    tries = min(_max_connection_retries or MAX_NUM_TRIES, MAX_NUM_TRIES)
    if isinstance(kwargs.get("json"), BaseModel):
        kwargs["json"] = kwargs["json"].model_dump(exclude_unset=True, mode="json")
    if "json" in kwargs:
        kwargs["data"] = orjson.dumps(kwargs.pop("json"))
        kwargs.setdefault("headers", {})
        kwargs["headers"] = {**kwargs["headers"], "Content-Type": "application/json"}
    label = set_server_name(_server_name or "external")
    client = get_global_aiohttp_client()

    async def attempt(_seconds_left: float, _number: int) -> aiohttp.ClientResponse:
        try:
            return await client.request(method=method, url=url, **kwargs)
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
            raise NotConnected(exc) from exc

    try:
        # The one retry loop (no deadline of its own: NeMo Gym's request has none); after the
        # last try the connection error itself is raised, as NeMo Gym's callers expect.
        policy = RetryPolicy(connect_retries=tries - 1, first_backoff_s=0.1, max_delay_s=math.inf)
        return await send_with_retries(attempt, policy, math.inf)
    except TransportFailure as exc:
        raise exc.__cause__ or exc from None
    finally:
        reset_server_name(label)


def get_server_url(server_name: str) -> str:
    """``http://host:port`` of a configured server instance, from the global config."""
    config = get_first_server_config_dict(get_global_config_dict(), server_name)
    return f"http://{config['host']}:{config['port']}"


def rollout_path_prefix(rollout_id: str | None, *, token_capture: bool = False) -> str:
    """The ``/ng-rollout/<id>`` path prefix that correlates calls with a rollout ('' without one)."""
    if not rollout_id:
        return ""
    return f"{ROLLOUT_PREFIX}{rollout_id}" + (f"/{TOKEN_CAPTURE_PATH_SEGMENT}" if token_capture else "")


def apply_rollout_prefix(base_url: str, rollout_id: str | None, *, token_capture: bool = False) -> str:
    """``base_url`` with the rollout's path prefix appended."""
    if not rollout_id:
        return base_url
    return base_url.rstrip("/") + rollout_path_prefix(rollout_id, token_capture=token_capture)


class GlobalAIOHTTPAsyncClientConfig(BaseModel):
    """Connection limits of the process-wide client (read from the global config's keys)."""

    model_config = ConfigDict(extra="ignore")

    global_aiohttp_connector_limit: int = 100 * 1024
    global_aiohttp_connector_limit_per_host: int = 1024
    global_aiohttp_client_request_debug: bool = False


def set_global_aiohttp_client(cfg: GlobalAIOHTTPAsyncClientConfig) -> aiohttp.ClientSession:
    """Create the process-wide client (call inside the event loop that will use it)."""
    global _GLOBAL_AIOHTTP_CLIENT, _GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG
    if _GLOBAL_AIOHTTP_CLIENT is not None:
        raise RuntimeError(
            "the global aiohttp client is already set up; close it first (global_aiohttp_client_exit)"
        )
    connector = capped_connector(
        cfg.global_aiohttp_connector_limit, cfg.global_aiohttp_connector_limit_per_host
    )
    _GLOBAL_AIOHTTP_CLIENT = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
    _GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG = cfg.global_aiohttp_client_request_debug
    return _GLOBAL_AIOHTTP_CLIENT


def is_global_aiohttp_client_request_debug_enabled() -> bool:
    """Whether the process-wide client was set up with ``global_aiohttp_client_request_debug``
    (callers then log each request they make)."""
    return _GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG


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
    global _GLOBAL_AIOHTTP_CLIENT, _GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG
    client, _GLOBAL_AIOHTTP_CLIENT = _GLOBAL_AIOHTTP_CLIENT, None
    _GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG = False
    if client is not None and not client.closed:
        asyncio.run(client.close())


def __getattr__(name: str) -> Any:
    return served_name(name, __name__)
