"""Tools, tool choices and output formats between the Responses API and Chat Completions.

The two APIs declare the same things in different shapes: a Responses function tool is flat
(``{"type": "function", "name": ...}``) where a chat tool nests it (``{"type": "function",
"function": {"name": ...}}``); the same holds for ``custom`` tools (free-form text input,
optionally constrained by a grammar), for a forced ``tool_choice`` and for ``allowed_tools``.
A structured-output ``text.format`` is a chat ``response_format``. Anything else (hosted tools
such as ``web_search``) has no chat form and raises :class:`ConversionUnsupported`.
"""

from __future__ import annotations

from typing import Any

_TOOL_TYPES = ("function", "custom")


class ConversionUnsupported(ValueError, NotImplementedError):
    """A request or item the other API has no form for.

    A ``ValueError`` (the caller sent something this path cannot take: a 4xx) and a
    ``NotImplementedError`` (what NeMo Gym's converter raises for the same cases).
    """


def responses_tool_to_chat(tool: dict[str, Any], index: int) -> dict[str, Any]:
    """The chat form of ``tools[index]`` of a Responses request (function or custom)."""
    kind = tool.get("type")
    if kind not in _TOOL_TYPES:
        raise ConversionUnsupported(
            f"tools[{index}] has type {kind!r}; only function and custom tools convert to Chat Completions"
        )
    if tool.get("defer_loading"):
        raise ConversionUnsupported(
            f"tools[{index}] sets defer_loading, which Chat Completions cannot express"
        )
    if kind == "function":
        function: dict[str, Any] = {"name": tool["name"]}
        for key in ("description", "parameters"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        if tool.get("strict"):
            # Only a strict schema asks the engine for something; `strict: false` is every engine's default.
            function["strict"] = True
        return {"type": "function", "function": function}
    custom = {key: value for key, value in tool.items() if key not in ("type", "defer_loading")}
    tool_format = custom.get("format")
    if isinstance(tool_format, dict) and tool_format.get("type") == "grammar":
        # Responses puts the grammar's fields beside `type`; chat nests them under `grammar`.
        grammar = {key: value for key, value in tool_format.items() if key != "type"}
        custom["format"] = {"type": "grammar", "grammar": grammar}
    return {"type": "custom", "custom": custom}


def chat_tool_to_responses(tool: dict[str, Any], index: int) -> dict[str, Any]:
    """The Responses form of ``tools[index]`` of a chat request (function or custom)."""
    kind = tool.get("type")
    if kind not in _TOOL_TYPES:
        raise ConversionUnsupported(
            f"tools[{index}] has type {kind!r}; only function and custom tools convert"
        )
    if kind == "custom":
        custom = dict(tool["custom"])
        tool_format = custom.get("format")
        if isinstance(tool_format, dict) and tool_format.get("type") == "grammar":
            custom["format"] = {"type": "grammar", **(tool_format.get("grammar") or {})}
        return {"type": "custom", **custom}
    function = tool["function"]
    converted: dict[str, Any] = {
        "type": "function",
        "name": function["name"],
        "parameters": function.get("parameters"),
        # Responses treats a missing `strict` as true, Chat Completions as false: keep chat's meaning.
        "strict": bool(function.get("strict") or False),
    }
    if function.get("description") is not None:
        converted["description"] = function["description"]
    return converted


def _reference_to_chat(reference: dict[str, Any]) -> dict[str, Any]:
    kind = reference.get("type")
    if kind not in _TOOL_TYPES:
        raise ConversionUnsupported(f"tool reference {reference!r} has no Chat Completions form")
    return {"type": kind, kind: {key: value for key, value in reference.items() if key != "type"}}


def _reference_to_responses(reference: dict[str, Any]) -> dict[str, Any]:
    kind = reference.get("type")
    if kind not in _TOOL_TYPES:
        raise ConversionUnsupported(f"tool reference {reference!r} has no Responses form")
    return {"type": kind, **reference[kind]}


def needs_a_tool(tool_choice: Any) -> bool:
    """Whether ``tool_choice`` (either API's form) makes the model call a tool: anything but
    ``None``, ``"auto"`` and ``"none"``."""
    return tool_choice not in (None, "auto", "none")


def responses_tool_choice_to_chat(tool_choice: Any) -> Any:
    """A Responses ``tool_choice`` in chat form: a mode string, a forced tool, or ``allowed_tools``."""
    if tool_choice is None or isinstance(tool_choice, str):
        return tool_choice
    if tool_choice.get("type") == "allowed_tools":
        tools = [_reference_to_chat(reference) for reference in tool_choice.get("tools") or []]
        return {"type": "allowed_tools", "allowed_tools": {"mode": tool_choice.get("mode"), "tools": tools}}
    if tool_choice.get("type") not in _TOOL_TYPES:
        raise ConversionUnsupported(
            f"tool_choice {tool_choice!r} has no Chat Completions form; use 'auto', 'none', 'required', "
            "a function, a custom tool or allowed_tools"
        )
    return _reference_to_chat(tool_choice)


def chat_tool_choice_to_responses(tool_choice: Any) -> Any:
    """A chat ``tool_choice`` in Responses form (the inverse of :func:`responses_tool_choice_to_chat`)."""
    if tool_choice is None or isinstance(tool_choice, str):
        return tool_choice
    if tool_choice.get("type") == "allowed_tools":
        allowed = tool_choice.get("allowed_tools") or {}
        tools = [_reference_to_responses(reference) for reference in allowed.get("tools") or []]
        return {"type": "allowed_tools", "mode": allowed.get("mode"), "tools": tools}
    return _reference_to_responses(tool_choice)


def text_format_to_response_format(text_format: dict[str, Any]) -> dict[str, Any] | None:
    """A Responses ``text.format`` as a chat ``response_format`` (None for plain text)."""
    kind = text_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise ConversionUnsupported(f"text.format type {kind!r} has no Chat Completions form")
    schema = {key: value for key, value in text_format.items() if key != "type" and value is not None}
    return {"type": "json_schema", "json_schema": schema}


def response_format_to_text_format(response_format: dict[str, Any]) -> dict[str, Any]:
    """A chat ``response_format`` as a Responses ``text.format``."""
    return {"type": response_format["type"], **(response_format.get("json_schema") or {})}
