"""A request's conversation as lineage reads it, in every dialect.

Chat and Anthropic requests carry ``messages``, Responses requests ``input`` (a string input has
no turns to continue). Instructions and tools shape the prompt too, so when present they lead as
one pseudo-turn (a role no dialect uses, never model-authored): a request with a different
envelope never reuses another's tokens.
"""

from __future__ import annotations

import json
from typing import Any

ENVELOPE_ROLE = "_ng_request_envelope"


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def request_messages(body: Any) -> list[dict[str, Any]]:
    """The envelope pseudo-turn (if any) and the request's turns as plain dicts."""
    if body is None:
        return []

    def get(key: str) -> Any:
        return body.get(key) if isinstance(body, dict) else getattr(body, key, None)

    items = get("messages")
    if not isinstance(items, list):
        items = get("input")
    turns = [_plain(i) for i in items if i is not None] if isinstance(items, list) else []
    instructions, tools = get("instructions"), get("tools")
    if not instructions and not tools:
        return turns
    envelope = json.dumps(
        {"instructions": _plain(instructions), "tools": _plain(tools)}, sort_keys=True, default=str
    )
    return [{"role": ENVELOPE_ROLE, "content": envelope}, *turns]
