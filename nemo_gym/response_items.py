"""Small builders and readers for Responses API objects as plain dicts.

Servers pass Responses objects between them as dicts shaped like the ``openai`` package's
types (``openai.types.responses.Response``); these helpers build and read them without
re-validating large payloads on every hop.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from operator import countOf
from typing import Any

MODEL_ITEM_TYPES = frozenset({"function_call", "reasoning"})


def new_id(prefix: str) -> str:
    """A fresh id in OpenAI's style (``resp_...``, ``msg_...``, ``fc_...``, ``call_...``)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(text: str, *, role: str = "assistant") -> dict[str, Any]:
    """An output message item holding one ``output_text`` part."""
    return {
        "id": new_id("msg"),
        "type": "message",
        "role": role,
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call_item(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    """A ``function_call`` output item (``arguments`` is a JSON string, as the API sends it)."""
    return {
        "id": new_id("fc"),
        "type": "function_call",
        "call_id": call_id or new_id("call"),
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def function_call_output_item(call_id: str, output: str) -> dict[str, Any]:
    """The input item that hands a tool's result back to the model."""
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def usage_dict(
    input_tokens: int = 0, output_tokens: int = 0, reasoning_tokens: int = 0, cached_tokens: int = 0
) -> dict[str, Any]:
    """A Responses API ``usage`` object."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def add_usage(total: dict[str, Any] | None, extra: dict[str, Any] | None) -> dict[str, Any] | None:
    """Sum two usage objects (either may be None)."""
    if not extra:
        return total
    if not total:
        return {**extra}
    return usage_dict(
        input_tokens=total.get("input_tokens", 0) + extra.get("input_tokens", 0),
        output_tokens=total.get("output_tokens", 0) + extra.get("output_tokens", 0),
        reasoning_tokens=(total.get("output_tokens_details") or {}).get("reasoning_tokens", 0)
        + (extra.get("output_tokens_details") or {}).get("reasoning_tokens", 0),
        cached_tokens=(total.get("input_tokens_details") or {}).get("cached_tokens", 0)
        + (extra.get("input_tokens_details") or {}).get("cached_tokens", 0),
    )


class UsageSum:
    """:func:`add_usage` folded over a rollout's model calls (``usage = add_usage(usage, u)`` for
    each ``u``) without building a usage object per call: from the second usage on, the four sums
    are kept as numbers, added in add_usage's order from the same reads, so :meth:`total` is
    exactly the folded value (and a bad usage raises at the same call)."""

    __slots__ = ("_first", "_summed", "_input", "_output", "_reasoning", "_cached")

    def __init__(self) -> None:
        self._first: dict[str, Any] | None = None  # the fold while it is one usage's copy
        self._summed = False  # two usages were added: the sums below are the fold
        self._input: Any = 0
        self._output: Any = 0
        self._reasoning: Any = 0
        self._cached: Any = 0

    def add(self, extra: dict[str, Any] | None) -> None:
        """Add one model call's ``usage`` (None or empty adds nothing)."""
        if not extra:
            return
        if not self._summed:  # the first two usages: add_usage itself
            folded = add_usage(self._first, extra)
            if self._first is None:
                self._first = folded
                return
            assert folded is not None
            self._input = folded["input_tokens"]
            self._output = folded["output_tokens"]
            self._reasoning = folded["output_tokens_details"]["reasoning_tokens"]
            self._cached = folded["input_tokens_details"]["cached_tokens"]
            self._first, self._summed = None, True
            return
        self._input = self._input + extra.get("input_tokens", 0)
        self._output = self._output + extra.get("output_tokens", 0)
        self._reasoning = self._reasoning + (extra.get("output_tokens_details") or {}).get(
            "reasoning_tokens", 0
        )
        self._cached = self._cached + (extra.get("input_tokens_details") or {}).get("cached_tokens", 0)
        self._input + self._output  # noqa: B018 - usage_dict's total_tokens, raising where it would

    def total(self) -> dict[str, Any] | None:
        """The summed usage: None if no call had one, the one usage's copy if one call had."""
        if not self._summed:
            return self._first
        return usage_dict(self._input, self._output, self._reasoning, self._cached)


def build_response(
    output: list[dict[str, Any]],
    params: dict[str, Any],
    *,
    model: str,
    usage: dict[str, Any] | None = None,
    status: str = "completed",
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    """A Responses API response object for ``output``, echoing the request's settings."""
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": float(int(time.time())),
        "model": model,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": params.get("instructions"),
        "metadata": params.get("metadata") or {},
        "output": output,
        "parallel_tool_calls": params.get("parallel_tool_calls", True) is not False,
        "temperature": params.get("temperature"),
        "tool_choice": params.get("tool_choice") or "auto",
        "tools": params.get("tools") or [],
        "top_p": params.get("top_p"),
        "max_output_tokens": params.get("max_output_tokens"),
        "usage": usage,
    }


def input_items(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``input`` as a list of items (a bare string becomes one user message)."""
    value = params.get("input")
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value, "type": "message"}]
    return list(value)


def content_text(content: Any) -> str:
    """The text of a message's ``content`` (a string or a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def output_text(response: dict[str, Any]) -> str:
    """The text of the last assistant message in a response's output ('' if none).

    Only messages with ``role: assistant`` count: a message without a role, or with another
    one, is not the model's answer.
    """
    for item in reversed(response.get("output") or []):
        if item.get("type") == "message" and item.get("role") == "assistant":
            return content_text(item.get("content"))
    return ""


def all_output_text(response: dict[str, Any]) -> str:
    """Every ``output_text`` part of every assistant message in a response's output, joined.

    This is the OpenAI SDK's ``Response.output_text`` (what NeMo Gym environments read; the SDK's
    output messages are always the assistant's): text split over several messages is rejoined;
    reasoning items, tool calls, refusal parts and messages of any other role (or none) add
    nothing.
    """
    return "".join(
        part.get("text") or ""
        for item in response.get("output") or []
        if item.get("type") == "message"
        and item.get("role") == "assistant"
        and isinstance(item.get("content"), list)
        for part in item["content"]
        if isinstance(part, dict) and part.get("type") == "output_text"
    )


def function_calls(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``function_call`` items among ``items``."""
    return [item for item in items if item.get("type") == "function_call"]


def is_model_item(item: dict[str, Any]) -> bool:
    """Whether an input item was produced by the model (assistant message, call, reasoning)."""
    return item.get("type") in MODEL_ITEM_TYPES or item.get("role") == "assistant"


def count_model_turns(items: Iterable[dict[str, Any]]) -> int:
    """How many model calls produced the items in a history (runs of model-produced items)."""
    turns = 0
    previous = False
    for item in items:
        current = is_model_item(item)
        if current and not previous:
            turns += 1
        previous = current
    return turns


def response_shape_errors(response: Any, where: str = "response") -> list[str]:
    """What is wrong with the shape of a Responses API response object, as ``field: problem`` lines.

    Only the parts every reader walks are checked (``output`` a list of objects, a message's
    ``content`` a string or a list of objects, text and call fields strings), so a malformed
    body is named here instead of failing deep inside a verifier. Unknown fields are fine.
    """
    if response.__class__ is not dict and not isinstance(response, dict):
        return [f"{where}: must be an object, got {type(response).__name__}"]
    output = response["output"] if "output" in response else None
    if output is None:
        return []
    if output.__class__ is not list and not isinstance(output, list):
        return [f"{where}.output: must be a list of items, got {type(output).__name__}"]
    if output_shape_fine(output):
        return []  # the usual output: nothing to name, no path built
    errors = []
    for index, item in enumerate(output):
        if _item_shape_fine(item):
            continue
        path = f"{where}.output.{index}"
        if not isinstance(item, dict):
            errors.append(f"{path}: must be an object, got {type(item).__name__}")
            continue
        for key in ("type", "role", "name", "arguments", "call_id"):
            value = item.get(key)
            if value is not None and not isinstance(value, str):
                errors.append(f"{path}.{key}: must be a string, got {type(value).__name__}")
        content = item.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            errors.append(
                f"{path}.content: must be a string or a list of parts, got {type(content).__name__}"
            )
            continue
        for part_index, part in enumerate(content):
            if not isinstance(part, dict):
                errors.append(f"{path}.content.{part_index}: must be an object, got {type(part).__name__}")
            elif part.get("text") is not None and not isinstance(part["text"], str):
                errors.append(f"{path}.content.{part_index}.text: must be a string")
    return errors


def output_shape_fine(output: list[Any]) -> bool:
    """Whether every item of a response's ``output`` list passes :func:`response_shape_errors`'s
    checks (a fast path: plain ``dict``/``str``/``list`` types; anything else needs the full checks)."""
    for item in output:
        if not _item_shape_fine(item):
            return False
    return True


_STR_OR_NONE = frozenset({str, type(None)})
_STR_AND_LIST = frozenset({str, list})


def _item_shape_fine(item: Any) -> bool:
    """Whether an output item passes :func:`response_shape_errors`'s checks (a fast path: plain
    ``dict``/``str``/``list`` types, looked at without a call per field; anything else goes
    through the full checks)."""
    if item.__class__ is not dict:
        return False
    # The types of its values, gathered in C: the usual items are settled without a loop here.
    kinds = set(map(type, item.values()))
    if kinds <= _STR_OR_NONE:
        return True  # every field a string or null: a call, or a message whose content is text
    if (
        kinds == _STR_AND_LIST
        and "content" in item
        and item["content"].__class__ is list
        and countOf(map(type, item.values()), list) == 1
    ):
        content: Any = item["content"]  # the one list is the content: every other field a string
    else:
        for key in ("type", "role", "name", "arguments", "call_id"):
            if key in item and item[key] is not None and item[key].__class__ is not str:
                return False
        content = item["content"] if "content" in item else None
        if content is None or content.__class__ is str:
            return True
        if content.__class__ is not list:
            return False
    for part in content:
        if part.__class__ is not dict:
            return False
        if "text" in part and part["text"] is not None and part["text"].__class__ is not str:
            return False
    return True


def create_params_shape_errors(params: Any, where: str = "responses_create_params") -> list[str]:
    """What is wrong with the parts of a Responses create request servers read, as ``field: problem``.

    ``input`` is a string or a list of item objects, ``tools`` a list of objects, ``instructions``
    a string; other fields pass through unchecked.
    """
    if not isinstance(params, dict):
        return [f"{where}: must be an object, got {type(params).__name__}"]
    errors = []
    value = params.get("input")
    if value is not None and not isinstance(value, str):
        if not isinstance(value, list):
            errors.append(f"{where}.input: must be a string or a list of items, got {type(value).__name__}")
        else:
            errors += [
                f"{where}.input.{i}: must be an object, got {type(item).__name__}"
                for i, item in enumerate(value)
                if not isinstance(item, dict)
            ]
    tools = params.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            errors.append(f"{where}.tools: must be a list of tools, got {type(tools).__name__}")
        else:
            errors += [
                f"{where}.tools.{i}: must be an object, got {type(tool).__name__}"
                for i, tool in enumerate(tools)
                if not isinstance(tool, dict)
            ]
    instructions = params.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        errors.append(f"{where}.instructions: must be a string, got {type(instructions).__name__}")
    return errors


# What a response without its envelope gets on intake (a verify body carrying only ``output``).
ENVELOPE_DEFAULTS: dict[str, Any] = {
    "id": "",
    "created_at": 0,
    "model": "",
    "object": "response",
    "output": [],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}
