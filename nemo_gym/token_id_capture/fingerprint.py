"""Hashes of a conversation that are the same in every dialect (Chat, Responses, Anthropic).

:func:`assistant_fingerprint` hashes only what the model wrote (assistant messages and
Responses ``function_call`` items, reasoning left out because harnesses need not echo it): it
names the call whose output a request ends with. :func:`conversation_digest` hashes every turn,
tool results included: a resolver checks it before reusing a parent's tokens, so a rewritten or
summarized history is never continued. Fields are tagged and length-prefixed so no two
different conversations hash the same input. These are pure functions; the encoding is NeMo
Gym's (version :data:`FINGERPRINT_VERSION`), shared with every resolver.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

FINGERPRINT_VERSION = 2
_FINGERPRINT_DOMAIN = b"nemo-gym-lineage"
_CONTEXT_DOMAIN = b"nemo-gym-lineage-context"
_TEXT_BLOCKS = {"", "text", "input_text", "output_text"}


def _canonical_json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ValueError(f"prompt content of type {type(value).__name__} cannot be fingerprinted") from exc


def canonicalize_tool_arguments(value: Any) -> str:
    """Tool arguments as sorted-key JSON (a harness may re-serialize them between turns)."""
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value.strip()
    return _canonical_json(value)


def _feed(hasher: Any, tag: bytes, value: str) -> None:
    data = value.encode()
    hasher.update(tag + len(data).to_bytes(8, "big") + data)


def _is_assistant_authored(item: dict[str, Any]) -> bool:
    return item.get("role") == "assistant" or item.get("type") == "function_call"


def _content_parts(content: Any) -> list[tuple[str, str]]:
    """(kind, payload) of each content part; tool uses and results are read elsewhere."""
    if content is None:
        return []
    if isinstance(content, str):
        return [("text", content)] if content else []
    if not isinstance(content, list):
        raise ValueError(f"message content of type {type(content).__name__} cannot be fingerprinted")
    parts = []
    for block in content:
        if isinstance(block, str):
            parts += [("text", block)] if block else []
            continue
        if not isinstance(block, dict):
            raise ValueError(f"content block of type {type(block).__name__} cannot be fingerprinted")
        kind = str(block.get("type") or "")
        if kind in ("tool_use", "tool_result"):
            continue
        if kind in _TEXT_BLOCKS and isinstance(block.get("text"), str):
            parts += [("text", block["text"])] if block["text"] else []
        elif not kind:
            raise ValueError("a content block has no type")
        else:
            parts.append((kind, _canonical_json(block)))
    return parts


def _tool_calls(item: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(call id, name, canonical arguments) of the tool calls an item makes, in any dialect."""
    calls = []
    if item.get("type") == "function_call":
        name = str(item.get("name", ""))
        if item.get("namespace"):
            name = f"{item['namespace']}__{name}"
        calls.append(
            (
                str(item.get("call_id") or item.get("id") or ""),
                name,
                canonicalize_tool_arguments(item.get("arguments")),
            )
        )
    if isinstance(item.get("content"), list):
        for block in item["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append(
                    (
                        str(block.get("id") or ""),
                        str(block.get("name", "")),
                        canonicalize_tool_arguments(block.get("input")),
                    )
                )
    for call in item.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        calls.append(
            (
                str((call or {}).get("id") or ""),
                str(function.get("name", "")),
                canonicalize_tool_arguments(function.get("arguments")),
            )
        )
    return calls


def _tool_results(item: dict[str, Any]) -> list[tuple[str, str]]:
    """(call id, output) of the tool results an item carries, in any dialect."""

    def text(value: Any) -> str:
        return value if isinstance(value, str) else _canonical_json(value)

    results = []
    if item.get("type") == "function_call_output":
        results.append((str(item.get("call_id") or item.get("id") or ""), text(item.get("output"))))
    elif item.get("role") == "tool":
        results.append((str(item.get("tool_call_id") or ""), text(item.get("content"))))
    if isinstance(item.get("content"), list):
        for block in item["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                results.append(
                    (str(block.get("tool_use_id") or block.get("id") or ""), text(block.get("content")))
                )
    return results


def _objects(messages: list[Any] | None) -> list[dict[str, Any]]:
    for message in messages or []:
        if not isinstance(message, dict):
            raise ValueError(f"request item of type {type(message).__name__} cannot be fingerprinted")
    return list(messages or [])


def assistant_fingerprint(messages: list[dict[str, Any]]) -> str:
    """Hash of the model-authored turns, in order ("" when there are none)."""
    hasher = hashlib.sha256(_FINGERPRINT_DOMAIN)
    authored = [m for m in _objects(messages) if _is_assistant_authored(m)]
    for message in authored:
        for kind, payload in _content_parts(message.get("content")):
            _feed(hasher, b"\x00", kind)
            _feed(hasher, b"\x01", payload)
        for call_id, name, arguments in _tool_calls(message):
            _feed(hasher, b"\x02", call_id)
            _feed(hasher, b"\x03", name)
            _feed(hasher, b"\x04", arguments)
    return hasher.hexdigest() if authored else ""


def conversation_digest(messages: list[dict[str, Any]]) -> str:
    """Hash of every turn: roles, content, tool calls and tool results."""
    hasher = hashlib.sha256(_CONTEXT_DOMAIN)
    for message in _objects(messages):
        _feed(hasher, b"\x00", str(message.get("role") or message.get("type") or ""))
        for kind, payload in _content_parts(message.get("content")):
            _feed(hasher, b"\x01", kind)
            _feed(hasher, b"\x02", payload)
        for call_id, name, arguments in _tool_calls(message):
            _feed(hasher, b"\x03", call_id)
            _feed(hasher, b"\x04", name)
            _feed(hasher, b"\x05", arguments)
        for call_id, output in _tool_results(message):
            _feed(hasher, b"\x06", call_id)
            _feed(hasher, b"\x07", output)
    return hasher.hexdigest()
