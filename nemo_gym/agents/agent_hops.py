"""The hops an agent makes in a rollout, with infrastructure faults classified.

Agents call the model, the tools, ``/seed_session`` and ``/verify`` through these helpers so
that an infrastructure fault in any hop (see :mod:`nemo_gym.agents.hop_faults`) fails the rollout
with a failure class instead of being shown to the model or verified into a reward::

    async with rollout_deadline(self.config.rollout_timeout_s):
        await call_json(rollout, env, "/seed_session", body)
        response = await call_model(rollout, model, params)
        tools = offered_tools(params)  # only these may be called, whatever the model names
        outputs = await execute_tool_calls(rollout, env, function_calls(response["output"]), tools)

Tool routing: a tool call is sent to ``POST /<name>`` of the resources server only when ``name``
is a tool the row offered (its ``responses_create_params.tools``, plus any the agent config
allows) and a plain tool name: a model that names ``seed_session``, ``verify``,
``aggregate_metrics``, ``../../verify`` or any tool it was not offered gets "no such tool" as the
tool's output, and no request is made.

Deadlines (both configurable, see docs/RELIABILITY.md): each hop ``NEMO_GYM_HOP_TIMEOUT_S``
(default 300 s), a whole rollout ``NEMO_GYM_ROLLOUT_TIMEOUT_S`` (default 1,200 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from typing import Any

import orjson

from nemo_gym.agents.hop_faults import (
    HopFault,
    check_responses_object,
    check_status,
    error_text,
    from_call_error,
    parse_body,
    status_failure_class,
)
from nemo_gym.failure_classes import TIMEOUT
from nemo_gym.response_items import function_call_output_item
from nemo_gym.serving.server_client import Rollout, ServerCallError, raise_for_status

DEFAULT_HOP_TIMEOUT_S = 300.0
DEFAULT_ROLLOUT_TIMEOUT_S = 1200.0
MODEL_PATH = "/v1/responses"
# Routes of a resources (or any) server that are never a tool, whatever a row offers.
RESERVED_ROUTE_NAMES = frozenset(
    {"", "seed_session", "verify", "aggregate_metrics", "run", "v1", "ng-rollout"}
)
# A tool name maps to one path segment: no "/", no "%", no "." or ".." (the path must not move).
_TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,127}")


def offered_tools(params: Mapping[str, Any] | None, extra: Iterable[str] = ()) -> frozenset[str]:
    """The function tools a model was offered in ``params`` (``tools[*].name``, Responses or Chat
    shape), plus ``extra`` (tools an agent config allows on every row)."""
    names = {name for name in extra if isinstance(name, str)}
    for tool in (params or {}).get("tools") or []:
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            continue
        function = tool.get("function")
        name = tool.get("name") or (function.get("name") if isinstance(function, Mapping) else None)
        if isinstance(name, str):
            names.add(name)
    return frozenset(names)


def is_callable_tool(name: str, offered: Collection[str]) -> bool:
    """Whether a model's call of ``name`` may go to the resources server: it was offered, it is a
    plain name (one path segment) and not one of the server's own routes."""
    return name in offered and name not in RESERVED_ROUTE_NAMES and _TOOL_NAME.fullmatch(name) is not None


class CallableTools(frozenset[str]):
    """Offered tool names that all pass :func:`is_callable_tool` (see :func:`callable_tools`): a
    call's name is then checked by one set lookup instead of the checks on every tool call."""

    __slots__ = ()


def callable_tools(offered: Collection[str]) -> CallableTools:
    """The names in ``offered`` that :func:`is_callable_tool` lets through, checked once (per
    rollout): :func:`execute_tool_call` given these calls exactly the same tools."""
    return CallableTools(
        name for name in offered if isinstance(name, str) and is_callable_tool(name, offered)
    )


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"{name}={value!r} must be > 0 seconds")
    return seconds


# Read once at import (not per hop: the hot path of every rollout).
_HOP_TIMEOUT_S = _env_seconds("NEMO_GYM_HOP_TIMEOUT_S", DEFAULT_HOP_TIMEOUT_S)
_ROLLOUT_TIMEOUT_S = _env_seconds("NEMO_GYM_ROLLOUT_TIMEOUT_S", DEFAULT_ROLLOUT_TIMEOUT_S)


def hop_timeout_s() -> float:
    """The deadline of one hop: ``NEMO_GYM_HOP_TIMEOUT_S`` when the process started, default 300 s."""
    return _HOP_TIMEOUT_S


def rollout_timeout_s() -> float:
    """The deadline of one rollout: ``NEMO_GYM_ROLLOUT_TIMEOUT_S`` when the process started, default 1,200 s."""
    return _ROLLOUT_TIMEOUT_S


@contextlib.asynccontextmanager
async def rollout_deadline(seconds: float | None = None, server: str = "agent") -> AsyncIterator[None]:
    """Fail the block with a ``timeout`` :class:`HopFault` after ``seconds`` (default
    :func:`rollout_timeout_s`); the hop in flight is cancelled, so no further model or tool
    call is made for an abandoned rollout."""
    seconds = seconds or rollout_timeout_s()
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise HopFault(
            TIMEOUT, server, "/run", f"rollout not finished within its deadline of {seconds:g}s"
        ) from None


async def call_json(
    rollout: Rollout, server: str, path: str, body: Any = None, *, timeout_s: float | None = None
) -> Any:
    """POST one hop and return its JSON answer.

    Infrastructure faults raise :class:`HopFault`; any other non-2xx raises the usual
    ``http_error`` :class:`ServerCallError` (a 400/413/422 is then answered to the caller as
    its own mistake).
    """
    try:
        resp = await rollout.post(server, path, body, timeout_s=timeout_s or _HOP_TIMEOUT_S)
    except ServerCallError as exc:
        raise from_call_error(exc) from exc
    parsed = check_status(resp, server, path)
    if not 200 <= resp.status < 300:
        raise_for_status(resp, server, path)
    return parsed


async def call_model(
    rollout: Rollout, model_server: str, params: dict[str, Any], *, timeout_s: float | None = None
) -> dict[str, Any]:
    """One model call; the answer is checked to be a Responses object (``bad_upstream_body`` if not)."""
    body = await call_json(rollout, model_server, MODEL_PATH, params, timeout_s=timeout_s)
    return check_responses_object(body, model_server, MODEL_PATH)


async def execute_tool_call(
    rollout: Rollout,
    resources_server: str,
    call: dict[str, Any],
    offered: Collection[str],
    *,
    timeout_s: float | None = None,
) -> str:
    """Run one function call on the resources server; its output text for the model.

    Only a tool in ``offered`` (see :func:`offered_tools`, :func:`callable_tools`) is called; any other name is "no such
    tool" to the model and no request is made. The model's own mistakes (arguments that are not
    JSON, no such tool, a 4xx about the arguments) come back as error text the model sees; an
    infrastructure fault raises :class:`HopFault`.
    """
    name = call.get("name") or ""
    if not isinstance(name, str) or not (
        name in offered if offered.__class__ is CallableTools else is_callable_tool(name, offered)
    ):
        return f"Error: there is no tool named {name!r}"
    try:
        arguments = orjson.loads(call.get("arguments") or "{}")
    except orjson.JSONDecodeError as exc:
        return f"Error: the arguments of {name!r} are not valid JSON: {exc}"
    path = f"/{name}"
    try:
        resp = await rollout.post(resources_server, path, arguments, timeout_s=timeout_s or _HOP_TIMEOUT_S)
    except ServerCallError as exc:
        raise from_call_error(exc) from exc
    status = resp.status
    if 200 <= status < 300:
        body = check_status(resp, resources_server, path)
        return body if isinstance(body, str) else orjson.dumps(body).decode()
    if status == 404:
        return f"Error: there is no tool named {name!r}"
    body = parse_body(resp)
    if status_failure_class(status, body) is not None:
        check_status(resp, resources_server, path)  # raises the HopFault
    return f"Error: tool {name!r} failed (HTTP {status}): {error_text(body)}"


async def execute_tool_calls(
    rollout: Rollout,
    resources_server: str,
    calls: Iterable[dict[str, Any]],
    offered: Collection[str],
    *,
    timeout_s: float | None = None,
) -> list[dict[str, Any]]:
    """Run calls in order (a stateful environment sees them as the model made them); one
    ``function_call_output`` item per call. Only tools in ``offered`` are called."""
    items = []
    for call in calls:
        output = await execute_tool_call(rollout, resources_server, call, offered, timeout_s=timeout_s)
        items.append(function_call_output_item(call.get("call_id") or "", output))
    return items
