"""scripted_model: a deterministic Responses API model for tests and benchmarks (no inference).

It picks the first script whose ``match`` regex finds the conversation's last user message,
then plays the script's turn for the current model call (turn 0 on the first call, 1 after the
first tool results, ...; the last turn repeats). A turn either calls a tool or answers text.
Templates in ``text`` and tool ``arguments`` can use ``{last_user}``, ``{tool_output}``,
``{tool_output[FIELD]}`` (a field of a JSON tool output, nested as ``[a][b]``), ``{match[N]}``
(regex groups) and ``{metadata[KEY]}`` (the request's metadata). Scripts are checked when the
server starts: a regex that does not compile or a template outside this list is a config error
naming the script and the template. Answers carry the model name ``GET /v1/models`` lists.
A request asking for structured output (a JSON schema) is answered with a small instance of
that schema instead of the script's text, as a model decoding under the constraint would.
"""

from __future__ import annotations

import re
import string
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, HTTPError, SimpleResponsesAPIModel
from nemo_gym.response_items import (
    build_response,
    content_text,
    count_model_turns,
    function_call_item,
    input_items,
    message_item,
    new_id,
    usage_dict,
)


class ScriptTurn(BaseModel):
    """One model call: ``call_tool`` (a tool name, or ``first`` for the first offered tool) or ``text``.

    ``arguments`` for a tool call: a mapping of templates, or ``auto`` (string parameters get
    the last user message, numbers 0, booleans false).
    """

    model_config = ConfigDict(extra="forbid")

    call_tool: str | None = None
    arguments: dict[str, Any] | str = "auto"
    text: str | None = None


class Script(BaseModel):
    """A regex on the last user message (``None`` matches anything) and the turns to play."""

    model_config = ConfigDict(extra="forbid")

    match: str | None = None
    turns: list[ScriptTurn] = Field(min_length=1)


DEFAULT_SCRIPTS = [
    Script(turns=[ScriptTurn(call_tool="first"), ScriptTurn(text="Here is what I found: {tool_output}")]),
]


SUPPORTED_TEMPLATES = (
    "{last_user}, {tool_output}, {tool_output[FIELD]} (a field of a JSON tool output), "
    "{match[N]} (regex group N), {metadata[KEY]}"
)
_FIELD_NAME = re.compile(r"([A-Za-z_]\w*)((?:\[[^\[\]]+\])*)")


def template_problem(template: str) -> str | None:
    """What is wrong with a script template, or None when the server can fill it."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"not a valid template ({exc}; write {{{{ and }}}} for literal braces)"
    for _, field, spec, _ in parsed:
        if field is None:
            continue
        found = _FIELD_NAME.fullmatch(field)
        name, keys = (found.group(1), re.findall(r"\[([^\[\]]+)\]", found.group(2))) if found else ("", [])
        ok = (
            (name == "last_user" and not keys)
            or name == "tool_output"
            or (name == "match" and len(keys) == 1 and keys[0].isdigit())
            or (name == "metadata" and len(keys) == 1)
        )
        if not ok or "{" in (spec or ""):
            return f"{{{field}}} is not supported"
    return None


class ScriptedModelConfig(BaseResponsesAPIModelConfig):
    """``scripts``: tried in order; the default calls the first tool, then answers with its output."""

    scripts: list[Script] = Field(default_factory=lambda: list(DEFAULT_SCRIPTS))
    model_name: str = "scripted_model"

    @model_validator(mode="after")
    def _check_scripts(self) -> ScriptedModelConfig:
        for number, script in enumerate(self.scripts):
            where = f"scripts[{number}]" + (f" (match {script.match!r})" if script.match else "")
            if script.match:
                try:
                    re.compile(script.match)
                except re.error as exc:
                    raise ValueError(f"{where}: match is not a valid regex: {exc}") from None
            for index, turn in enumerate(script.turns):
                templates = [("text", turn.text)]
                if isinstance(turn.arguments, dict):
                    templates += [(f"arguments.{k}", v) for k, v in turn.arguments.items()]
                for field, template in templates:
                    if not isinstance(template, str):
                        continue
                    problem = template_problem(template)
                    if problem:
                        raise ValueError(
                            f"{where}, turns[{index}].{field}: template {template!r}: {problem}; "
                            f"supported: {SUPPORTED_TEMPLATES}"
                        )
        return self


class _Lenient(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return ""


class _JsonText(str):
    """A tool output: fills ``{tool_output}`` as its text, and ``{tool_output[field]}`` with a
    field of it read as JSON (an object's key, or a list's index)."""

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        try:
            parsed = orjson.loads(str.__str__(self))
        except orjson.JSONDecodeError:
            raise KeyError(
                f"the tool output is not JSON, so it has no field {key!r}: {str.__getitem__(self, slice(0, 80))!r}"
            ) from None
        if isinstance(parsed, dict) and str(key) in parsed:
            value = parsed[str(key)]
        elif isinstance(parsed, list) and isinstance(key, int) and -len(parsed) <= key < len(parsed):
            value = parsed[key]
        else:
            raise KeyError(f"the tool output has no field {key!r}: {str.__getitem__(self, slice(0, 80))!r}")
        return _JsonText(value if isinstance(value, str) else orjson.dumps(value).decode())


class ScriptedModel(SimpleResponsesAPIModel):
    """Answers Responses and Chat Completions requests from its configured scripts."""

    config: ScriptedModelConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._patterns = [re.compile(s.match) if s.match else None for s in self.config.scripts]

    def model_ids(self) -> list[str]:
        """The one model name this server answers with."""
        return [self.config.model_name]

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """Play the matching script's turn for this call as a Responses API response."""
        items = input_items(body)
        last_user = next(
            (content_text(i.get("content")) for i in reversed(items) if i.get("role") == "user"), ""
        )
        tool_output = _JsonText(
            next(
                (
                    str(i.get("output", ""))
                    for i in reversed(items)
                    if i.get("type") == "function_call_output"
                ),
                "",
            )
        )
        turn_index = count_model_turns(items)
        turn, fields = self._turn(last_user, tool_output, turn_index, body.get("metadata") or {})
        tools = body.get("tools") or []
        if turn.call_tool:
            name, arguments = self._tool_call(turn, tools, fields)
            output = [function_call_item(name, orjson.dumps(arguments).decode())]
            answer = output[0]["arguments"]
        elif requested_schema(body) is not None:
            # A request for structured output (a JSON schema) gets an instance of that schema, as
            # from a model decoding under the constraint: a script's text could not be one.
            answer = orjson.dumps(schema_instance(requested_schema(body) or {})).decode()
            output = [message_item(answer)]
        else:
            answer = _fill(turn.text or "", fields)
            output = [message_item(answer)]
        # A rough token count (4 characters a token): this model is for tests and benchmarks.
        prompt_chars = sum(len(content_text(i.get("content"))) for i in items)
        usage = usage_dict(input_tokens=prompt_chars // 4, output_tokens=len(answer) // 4 + 1)
        # Its own name, whatever the request said: the name GET /v1/models lists.
        return build_response(output, body, model=self.config.model_name, usage=usage)

    async def count_input_tokens(self, body: dict[str, Any]) -> int:
        """The same rough count as this model's usage: 4 characters a token."""
        return sum(len(content_text(i.get("content"))) for i in input_items(body)) // 4

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """The same scripts over Chat Completions messages (text answers and tool calls)."""
        messages = body.get("messages") or []
        items = [
            {"role": m.get("role"), "content": m.get("content")} for m in messages if m.get("role") != "tool"
        ]
        items += [
            {"type": "function_call_output", "output": m.get("content")}
            for m in messages
            if m.get("role") == "tool"
        ]
        tools = [
            {"name": t["function"]["name"], **t["function"]}
            for t in body.get("tools") or []
            if "function" in t
        ]
        request: dict[str, Any] = {"input": items, "tools": tools, "model": body.get("model")}
        if isinstance(body.get("response_format"), dict):
            request["response_format"] = body["response_format"]
        response = await self.responses(request)
        item = response["output"][0]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if item["type"] == "function_call":
            message["tool_calls"] = [
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            ]
        else:
            message["content"] = item["content"][0]["text"]
        usage = response["usage"]
        return {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(response["created_at"]),
            "model": response["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if item["type"] == "function_call" else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": usage["input_tokens"],
                "completion_tokens": usage["output_tokens"],
                "total_tokens": usage["total_tokens"],
            },
        }

    def _turn(
        self, last_user: str, tool_output: str, turn_index: int, metadata: dict[str, Any]
    ) -> tuple[ScriptTurn, dict[str, Any]]:
        for script, pattern in zip(self.config.scripts, self._patterns, strict=True):
            found = pattern.search(last_user) if pattern else None
            if pattern is None or found:
                groups = [found.group(0), *found.groups()] if found else []
                turn = script.turns[min(turn_index, len(script.turns) - 1)]
                fields = {
                    "last_user": last_user,
                    "tool_output": tool_output,
                    "match": groups,
                    "metadata": _Lenient(metadata),
                }
                return turn, fields
        raise HTTPError(
            422, f"no script matches the last user message {last_user[:80]!r}; add a script without 'match'"
        )

    def _tool_call(
        self, turn: ScriptTurn, tools: list[dict[str, Any]], fields: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        names = [t.get("name") for t in tools if t.get("type", "function") == "function"]
        name = turn.call_tool if turn.call_tool != "first" else (names[0] if names else None)
        if not name:
            raise HTTPError(422, "script turn says call_tool: first, but the request offers no tools")
        if isinstance(turn.arguments, dict):
            return name, {k: _fill(v, fields) if isinstance(v, str) else v for k, v in turn.arguments.items()}
        schema = next((t.get("parameters") or {} for t in tools if t.get("name") == name), {})
        return name, {
            key: _auto_value(prop, fields["last_user"])
            for key, prop in (schema.get("properties") or {}).items()
        }


def requested_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a request asks the answer to follow (Responses ``text.format`` or Chat
    Completions ``response_format`` of type ``json_schema``), or None."""
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return fmt.get("schema") if isinstance(fmt.get("schema"), dict) else {}
    chat = body.get("response_format")
    if isinstance(chat, dict) and chat.get("type") == "json_schema":
        inner = chat.get("json_schema") or {}
        return inner.get("schema") if isinstance(inner.get("schema"), dict) else {}
    return None


def schema_instance(schema: dict[str, Any], defs: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A small value valid against ``schema``: the first ``enum``/``const``, the first non-null
    branch of ``anyOf``/``oneOf``, every required property of an object (all when none is
    marked required), ``minItems`` items, a number at its minimum."""
    defs = {**(defs or {}), **(schema.get("$defs") or schema.get("definitions") or {})}
    if depth > 20:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.rsplit("/", 1)[-1] in defs:
        return schema_instance(defs[ref.rsplit("/", 1)[-1]], defs, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        branches = [b for b in schema.get(key) or [] if isinstance(b, dict)]
        if branches:
            chosen = next((b for b in branches if b.get("type") != "null"), branches[0])
            return schema_instance(chosen, defs, depth + 1)
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), "null") if isinstance(kind, list) else kind
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        names = schema.get("required") or list(props)
        return {name: schema_instance(props.get(name) or {}, defs, depth + 1) for name in names}
    if kind == "array":
        item = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [schema_instance(item, defs, depth + 1) for _ in range(int(schema.get("minItems") or 0))]
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return "x" * int(schema.get("minLength") or 0)


def _auto_value(prop: dict[str, Any], last_user: str) -> Any:
    kind = prop.get("type")
    if prop.get("enum"):
        return prop["enum"][0]
    return {"integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}.get(str(kind), last_user)


def _fill(template: str, fields: dict[str, Any]) -> str:
    try:
        return string.Formatter().vformat(template, (), fields)
    except (IndexError, KeyError, ValueError, TypeError, AttributeError) as exc:
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise HTTPError(422, f"script template {template!r} cannot be filled: {reason}") from exc


if __name__ == "__main__":
    ScriptedModel.run_webserver()
