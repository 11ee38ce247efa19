"""Streaming clients' request bodies, mapped onto the one-shot request a model server computes.

Harnesses that stream (the Codex CLI over Responses, OpenClaw over Chat Completions) send
``stream: true`` with ``stream_options``, bookkeeping fields no engine knows, and, for Codex,
``namespace`` tools: functions grouped under a namespace, called back with ``namespace`` and
``name`` on the ``function_call`` item. A model server answers them by computing the whole
answer and sending it as events (:mod:`nemo_gym.models.streaming`); this module prepares the
request for that computation:

- :func:`sanitize_chat_body` / :func:`sanitize_responses_body` drop the streaming flags and
  unknown fields (and say whether the client asked for a usage chunk);
- namespace tools become plain functions named ``<namespace>__<name>``, replayed namespaced calls
  are renamed the same way, and :func:`restore_namespace_calls` renames them back on the way out;
- tools a Codex ``additional_tools`` item carries join ``tools``; input items and tools the
  request model cannot hold are dropped one by one with a warning (a lost exotic tool is better
  than a lost rollout); the system/developer messages opening the input join ``instructions``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable
from typing import Any

from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from openai.types.responses.response_create_params import ResponseCreateParamsBase, ToolParam
from openai.types.responses.response_input_item_param import ResponseInputItemParam
from pydantic import TypeAdapter, ValidationError

logger = logging.getLogger(__name__)

NAMESPACE_TOOL_DELIMITER = "__"
"""Joins a namespace and a function name into one flat tool name."""
NamespaceMap = dict[str, tuple[str, str]]
"""Flat tool name -> ``(namespace, name)``."""

CHAT_REQUEST_FIELDS = frozenset(CompletionCreateParamsBase.__annotations__)
"""The fields of a Chat Completions request, as the installed ``openai`` package knows them."""
RESPONSES_REQUEST_FIELDS = frozenset(ResponseCreateParamsBase.__annotations__)
"""The fields of a Responses request, as the installed ``openai`` package knows them."""
_STREAM_FIELDS = ("stream", "stream_options")
_TOOL = TypeAdapter(ToolParam)
_INPUT_ITEM = TypeAdapter(ResponseInputItemParam)


def _validates(adapter: TypeAdapter[Any]) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        try:
            adapter.validate_python(value)
        except ValidationError:
            return False
        return True

    return check


_tool_type_known = _validates(_TOOL)


def tool_is_valid(tool: Any) -> bool:
    """Whether a Responses tool spec is a named function or another tool the ``openai`` package knows.

    A function tool needs only its name: harnesses leave out ``strict`` and ``parameters``,
    which the ``openai`` types require but every engine defaults.
    """
    if isinstance(tool, dict) and tool.get("type") == "function":
        return isinstance(tool.get("name"), str) and bool(tool["name"])
    return _tool_type_known(tool)


_input_item_validates = _validates(_INPUT_ITEM)


def input_item_is_valid(item: Any) -> bool:
    """Whether a Responses input item is one the installed ``openai`` package knows (a field set
    to null counts as absent: a client echoing an output item sends its unset fields as null)."""
    if isinstance(item, dict):
        item = {key: value for key, value in item.items() if value is not None}
    return _input_item_validates(item)


def _wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _keep_known(body: dict[str, Any], known: Iterable[str], what: str) -> dict[str, Any]:
    known = frozenset(known)
    dropped = sorted(key for key in body if key not in known)
    if dropped:
        logger.debug("dropping fields %s from a streaming %s request", dropped, what)
    return {key: value for key, value in body.items() if key in known}


def sanitize_chat_body(body: dict[str, Any], known: Iterable[str]) -> tuple[dict[str, Any], bool]:
    """``(body without streaming flags and fields outside known, whether a usage chunk was asked for)``."""
    include_usage = _wants_usage(body)
    cleaned = {key: copy.deepcopy(value) for key, value in body.items() if key not in _STREAM_FIELDS}
    return _keep_known(cleaned, known, "/v1/chat/completions"), include_usage


def flatten_namespace_tools(tools: Any) -> tuple[list[Any], NamespaceMap]:
    """``(tools with each namespace replaced by its functions, renamed <namespace>__<name>, map back)``."""
    flat: list[Any] = []
    names: NamespaceMap = {}
    for tool in tools or []:
        if not (isinstance(tool, dict) and tool.get("type") == "namespace"):
            flat.append(tool)
            continue
        namespace = str(tool.get("name") or "")
        for member in tool.get("tools") or []:
            if isinstance(member, dict) and member.get("name"):
                joined = f"{namespace}{NAMESPACE_TOOL_DELIMITER}{member['name']}"
                flat.append({**member, "type": "function", "name": joined})
                names[joined] = (namespace, str(member["name"]))
    return flat, names


def _kind(value: Any) -> str:
    return str(value.get("type")) if isinstance(value, dict) else type(value).__name__


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text") or ""
        for part in content or []
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text")
    )


def sanitize_responses_body(
    body: dict[str, Any], known: Iterable[str]
) -> tuple[dict[str, Any], NamespaceMap]:
    """``(body ready for the request model, namespace map)`` for a streaming Responses request.

    ``known``: the request fields kept. Tools and input items the ``openai`` package's types do
    not take are dropped with a warning.
    """
    body = {key: copy.deepcopy(value) for key, value in body.items() if key not in _STREAM_FIELDS}
    names: NamespaceMap = {}
    if "tools" in body:
        tools, names = flatten_namespace_tools(body["tools"])
        body["tools"] = [tool for tool in tools if _check(tool, tool_is_valid, "tool spec")]
    if isinstance(body.get("input"), list):
        kept: list[Any] = []
        carried: list[Any] = []
        for item in body["input"]:
            if isinstance(item, dict) and item.get("type") == "function_call" and item.get("namespace"):
                item["name"] = f"{item.pop('namespace')}{NAMESPACE_TOOL_DELIMITER}{item.get('name')}"
            if isinstance(item, dict) and item.get("type") == "additional_tools":
                # Codex's code mode sends tools in an input item rather than in `tools`.
                carried += item.get("tools") or []
            elif _check(item, input_item_is_valid, "input item"):
                kept.append(item)
        if carried:
            flat, carried_names = flatten_namespace_tools(carried)
            names.update(carried_names)
            functions = [tool for tool in flat if isinstance(tool, dict) and tool.get("type") == "function"]
            others = [
                tool.get("name") if isinstance(tool, dict) else tool for tool in flat if tool not in functions
            ]
            if others:
                logger.warning("dropping non-function tools %s from an additional_tools item", others)
            usable = [tool for tool in functions if _check(tool, tool_is_valid, "tool spec")]
            if usable:
                body["tools"] = [*(body.get("tools") or []), *usable]
        leading = [body.get("instructions") or ""]
        while kept and isinstance(kept[0], dict) and kept[0].get("type") in (None, "message"):
            if kept[0].get("role") not in ("system", "developer"):
                break
            leading.append(_text(kept.pop(0)))
        instructions = "\n\n".join(part for part in leading if part)
        if instructions:
            body["instructions"] = instructions
        body["input"] = kept
    return _keep_known(body, known, "/v1/responses"), names


def _check(value: Any, is_valid: Callable[[Any], bool], what: str) -> bool:
    if is_valid(value):
        return True
    logger.warning(
        "dropping an unsupported %s of type %r from a streaming /v1/responses request", what, _kind(value)
    )
    return False


def restore_namespace_calls(items: list[Any], names: NamespaceMap) -> list[Any]:
    """``items`` with each flattened function call's ``namespace`` and ``name`` given back (new dicts)."""
    restored = []
    for item in items:
        if isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") in names:
            namespace, name = names[item["name"]]
            item = {**item, "namespace": namespace, "name": name}
        restored.append(item)
    return restored
