"""The function-tool schemas a model sees, built from a server's tool methods, and rows that carry them.

A data row repeats the tools the model may call (``responses_create_params.tools``). Written by
hand, that schema drifts from the tool's request model; built from the method instead (its name,
the first paragraph of its docstring, its body model's JSON schema), it cannot.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nemo_gym.serving.server import body_model

# A tool whose body is a plain dict takes any arguments.
_ANY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def _without_titles(schema: Any) -> Any:
    """``schema`` without pydantic's ``title`` keys (noise to the model; property names stay)."""
    if isinstance(schema, dict):
        return {
            key: (
                _without_titles(value)
                if key != "properties"
                else {k: _without_titles(v) for k, v in value.items()}
            )
            for key, value in schema.items()
            if key != "title"
        }
    if isinstance(schema, list):
        return [_without_titles(item) for item in schema]
    return schema


def function_tool(name: str, handler: Callable[..., Any]) -> dict[str, Any]:
    """The Responses API function tool for ``handler`` served as ``name``.

    ``strict`` is set when OpenAI's strict mode can hold the schema: the body model forbids extra
    fields and requires every field (what a strict tool must declare).
    """
    model = body_model(handler)
    doc = inspect.getdoc(handler) or ""
    tool: dict[str, Any] = {"type": "function", "name": name}
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    if description:
        tool["description"] = description
    if model is None:
        tool["parameters"] = dict(_ANY_OBJECT)
        return tool
    schema = _without_titles(model.model_json_schema())
    schema.pop("description", None)  # the model's docstring is for authors; the tool's says what it does
    if model.model_config.get("extra") == "forbid":
        schema["additionalProperties"] = False
    tool["parameters"] = schema
    properties = schema.get("properties", {})
    strict = schema.get("additionalProperties") is False and set(schema.get("required", [])) == set(
        properties
    )
    if strict and "$defs" not in schema:
        tool["strict"] = True
    return tool


def function_tools(tools: Mapping[str, Callable[..., Any]]) -> list[dict[str, Any]]:
    """The function tools of ``{name: handler}``, sorted by name."""
    return [function_tool(name, tools[name]) for name in sorted(tools)]


def task_row(
    prompt: str | Iterable[Mapping[str, Any]],
    tools: list[dict[str, Any]],
    *,
    instructions: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """One data row: ``responses_create_params`` (the prompt, the tools) and the row's own ``fields``.

    ``prompt`` is the user message's text (or the whole ``input`` list); ``instructions`` becomes
    a developer message before it. Every other field travels untouched to ``/verify``.
    """
    if isinstance(prompt, str):
        items: list[Any] = [{"role": "user", "content": prompt}]
    else:
        items = [dict(item) for item in prompt]
    if instructions is not None:
        items.insert(0, {"role": "developer", "content": instructions})
    params: dict[str, Any] = {"input": items}
    if tools:
        params["tools"] = tools
    reserved = {"responses_create_params"} & set(fields)
    if reserved:
        raise ValueError("pass the prompt and instructions as arguments, not responses_create_params")
    return {"responses_create_params": params, **fields}
