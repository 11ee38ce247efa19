"""Google's Gemini API (``generateContent``) ⇄ the Responses API, on plain dicts.

A model server answers Gemini clients (Gemini CLI, the ``google-genai`` SDK) by reading their
request as Responses create-params (:func:`gemini_request_to_responses_params`), answering with
its own Responses call, and sending the answer back as a ``GenerateContentResponse``
(:func:`response_to_gemini_response`), whole or as the chunks of ``streamGenerateContent``
(:func:`gemini_stream_chunks`).

The mapping: ``systemInstruction`` is ``instructions``; ``contents`` turns of role ``user`` /
``model`` are user / assistant messages; a ``text`` part with ``thought: true`` is a reasoning
item; ``functionCall`` parts are function calls (``args`` object ⇄ ``arguments`` JSON, the part's
``id`` is the call id); ``functionResponse`` parts are function call outputs (matched to their
call by ``id``, else by name to the oldest call still unanswered); ``inlineData`` images are
image parts; ``tools[].functionDeclarations`` are function tools (Gemini's OpenAPI-style
``parameters`` with upper-case types are read as JSON schema); ``toolConfig`` is
``tool_choice``; ``generationConfig`` gives temperature, top-p and the output limit.

Requests for JSON output under a schema (``responseMimeType: application/json`` with a
``responseSchema`` / ``responseJsonSchema``) are what Gemini CLI sends for its own bookkeeping
(routing with ``complexity_score``, the next-speaker check), not turns of the agent: see
:func:`json_schema_request` and :func:`schema_default_instance`.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_gym.models.anthropic_messages import call_token_fields, parse_image_data_url
from nemo_gym.models.chat_tools import ConversionUnsupported
from nemo_gym.models.conversion import TOKEN_ID_FIELDS, new_item_id

CONTIGUITY_FIELD = "token_ids_contiguous"
_TOKEN_FIELDS = (*TOKEN_ID_FIELDS, CONTIGUITY_FIELD)
_TOOL_MODES = {"AUTO": "auto", "NONE": "none", "ANY": "required", "VALIDATED": "auto"}
_FINISH_OF_INCOMPLETE = {"max_output_tokens": "MAX_TOKENS", "content_filter": "SAFETY"}
# Settings an engine would have to honour for the answer to be what the client asked for.
_REFUSED_SETTINGS = {
    "stopSequences": "stop strings cut sampled text inside tokens",
    "responseLogprobs": "log-probs travel as nemo_gym's token-ID fields",
}


# ---- Gemini request -> Responses request


def gemini_request_to_responses_params(body: dict[str, Any]) -> dict[str, Any]:
    """Responses create-params for a ``generateContent`` body (``ValueError`` naming the field)."""
    items: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (name, call id) of calls not answered yet
    contents = body.get("contents")
    if isinstance(contents, dict):
        contents = [contents]
    if not isinstance(contents, list) or not contents:
        raise ValueError("contents must be a non-empty list of {role, parts} turns")
    for turn_index, turn in enumerate(contents):
        where = f"contents[{turn_index}]"
        if not isinstance(turn, dict) or not isinstance(turn.get("parts"), list):
            raise ValueError(f"{where} must be an object with a 'parts' list")
        role = turn.get("role") or "user"
        if role not in ("user", "model", "function", "tool"):
            raise ValueError(f"{where}.role is {role!r}; expected 'user' or 'model'")
        items += _turn_items(role, turn["parts"], where, turn_index, pending)
    params: dict[str, Any] = {"input": items}
    system = _system_text(body.get("systemInstruction") or body.get("system_instruction"))
    if system:
        params["instructions"] = system
    tools = _tools(body.get("tools") or [])
    if tools:
        params["tools"] = tools
    choice = _tool_choice(body.get("toolConfig") or body.get("tool_config"))
    if choice is not None:
        params["tool_choice"] = choice
    config = body.get("generationConfig") or body.get("generation_config") or {}
    if not isinstance(config, dict):
        raise ValueError("generationConfig must be an object")
    for key, why in _REFUSED_SETTINGS.items():
        if config.get(key):
            raise ValueError(f"generationConfig.{key} is not served: {why}; leave it out")
    if config.get("candidateCount") not in (None, 1):
        raise ValueError("generationConfig.candidateCount must be 1: one sample per call")
    for source, target in (("temperature", "temperature"), ("topP", "top_p"),
                           ("maxOutputTokens", "max_output_tokens")):  # fmt: skip
        if config.get(source) is not None:
            params[target] = config[source]
    return params


def _turn_items(
    role: str, parts: list[Any], where: str, turn_index: int, pending: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    speaker = "assistant" if role == "model" else "user"
    items: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []

    def close_message() -> None:
        if content:
            single = len(content) == 1 and content[0]["type"] in ("input_text", "output_text")
            items.append(
                {
                    "type": "message",
                    "role": speaker,
                    "content": content[0]["text"] if single else list(content),
                }
            )
            content.clear()

    for part_index, part in enumerate(parts):
        at = f"{where}.parts[{part_index}]"
        if not isinstance(part, dict):
            raise ValueError(f"{at} must be an object")
        for kind in ("functionCall", "functionResponse", "inlineData"):
            if kind in part and not isinstance(part[kind], dict):
                raise ValueError(f"{at}.{kind} must be an object")
        if "functionCall" in part and not isinstance(part["functionCall"].get("args", {}), dict):
            raise ValueError(f"{at}.functionCall.args must be an object")
        if "functionCall" in part:
            close_message()
            call = part["functionCall"] or {}
            name = call.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError(f"{at}.functionCall needs a 'name'")
            call_id = str(call.get("id") or f"call_{turn_index}_{part_index}")
            pending.append((name, call_id))
            items.append({"type": "function_call", "call_id": call_id, "name": name,
                          "arguments": json.dumps(call.get("args") or {}, ensure_ascii=False),
                          "status": "completed"})  # fmt: skip
        elif "functionResponse" in part:
            close_message()
            answer = part["functionResponse"] or {}
            items.append(
                {"type": "function_call_output", "call_id": _answered_call(answer, pending, at),
                 "output": _function_output(answer.get("response"))}
            )  # fmt: skip
        elif "text" in part:
            if part.get("thought"):
                close_message()
                items.append({"type": "reasoning", "id": new_item_id("rs"),
                              "summary": [{"type": "summary_text", "text": str(part["text"] or "")}]})  # fmt: skip
            else:
                kind = "output_text" if speaker == "assistant" else "input_text"
                content.append({"type": kind, "text": str(part["text"] or "")})
        elif "inlineData" in part and speaker == "user":
            data = part["inlineData"] or {}
            url = f"data:{data.get('mimeType')};base64,{data.get('data')}"
            parse_image_data_url(url, at)  # names a type or payload it cannot take
            content.append({"type": "input_image", "image_url": url, "detail": "auto"})
        else:
            kinds = sorted(key for key in part if key not in ("thoughtSignature", "thought"))
            raise ConversionUnsupported(f"{at}: a {speaker} part of kind {kinds} has no Responses form")
    close_message()
    if speaker == "assistant":
        for item in items:
            if item.get("type") == "message" and isinstance(item["content"], list):
                item["content"] = [{**part, "type": "output_text"} for part in item["content"]]
    return items


def _answered_call(answer: dict[str, Any], pending: list[tuple[str, str]], where: str) -> str:
    wanted_id, name = answer.get("id"), answer.get("name")
    for index, (call_name, call_id) in enumerate(pending):
        if (wanted_id and call_id == wanted_id) or (not wanted_id and call_name == name):
            del pending[index]
            return call_id
    if wanted_id:
        return str(wanted_id)
    raise ValueError(f"{where}.functionResponse {name!r} answers no earlier functionCall of that name")


def _function_output(response: Any) -> str:
    # Gemini CLI answers {"output": "<text>"}; the text is what the model should read.
    if isinstance(response, dict) and set(response) == {"output"} and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response, ensure_ascii=False)


def _system_text(system: Any) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    parts = system.get("parts") if isinstance(system, dict) else system
    if not isinstance(parts, list):
        raise ValueError("systemInstruction must be a string or {parts: [{text}]}")
    return "\n".join(
        str(part.get("text") or "") for part in parts if isinstance(part, dict) and part.get("text")
    )


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise ValueError("tools must be a list")
    converted = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"tools[{index}] must be an object")
        declarations = tool.get("functionDeclarations", tool.get("function_declarations"))
        others = sorted(key for key in tool if key not in ("functionDeclarations", "function_declarations"))
        if others:
            raise ConversionUnsupported(
                f"tools[{index}] has {others}: only functionDeclarations can be served by this model"
            )
        for position, declaration in enumerate(declarations or []):
            name = declaration.get("name") if isinstance(declaration, dict) else None
            if not isinstance(name, str) or not name:
                raise ValueError(f"tools[{index}].functionDeclarations[{position}] needs a 'name'")
            schema = declaration.get("parametersJsonSchema")
            if schema is None:
                schema = json_schema_of(declaration.get("parameters"))
            converted.append(
                {"type": "function", "name": name, "description": declaration.get("description"),
                 "parameters": schema or {"type": "object", "properties": {}}, "strict": False}
            )  # fmt: skip
    return converted


def json_schema_of(schema: Any) -> Any:
    """Gemini's OpenAPI-style schema (``type: OBJECT``, ``nullable``) as JSON schema."""
    if isinstance(schema, list):
        return [json_schema_of(value) for value in schema]
    if not isinstance(schema, dict):
        return schema
    converted: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            converted[key] = value.lower()
        elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            converted[key] = {name: json_schema_of(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "additionalProperties"):
            converted[key] = json_schema_of(value)
        elif key != "nullable":
            converted[key] = value
    if schema.get("nullable") and isinstance(converted.get("type"), str):
        converted["type"] = [converted["type"], "null"]
    return converted


def _tool_choice(config: Any) -> Any:
    if not config:
        return None
    if not isinstance(config, dict):
        raise ValueError("toolConfig must be an object")
    calling = config.get("functionCallingConfig") or config.get("function_calling_config") or {}
    mode = str(calling.get("mode") or "AUTO").upper()
    if mode not in _TOOL_MODES:
        raise ValueError(
            f"toolConfig.functionCallingConfig.mode {mode!r}; expected one of {sorted(_TOOL_MODES)}"
        )
    allowed = calling.get("allowedFunctionNames") or []
    if mode == "ANY" and len(allowed) == 1:
        return {"type": "function", "name": allowed[0]}
    return _TOOL_MODES[mode]


def json_schema_request(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a request asks its answer to follow, or None for a free-form request
    (``ValueError`` for a schema that is not an object)."""
    config = body.get("generationConfig") or {}
    if not isinstance(config, dict) or config.get("responseMimeType") != "application/json":
        return None
    for key in ("responseJsonSchema", "responseSchema"):
        schema = config.get(key)
        if schema is not None and not isinstance(schema, dict):
            raise ValueError(f"generationConfig.{key} must be a JSON schema object")
        if schema is not None:
            return dict(json_schema_of(schema)) if key == "responseSchema" else dict(schema)
    return {}


def schema_default_instance(schema: Any) -> Any:
    """The plainest value that satisfies ``schema``: an enum's first value, a number's minimum
    (else 0), ``""``, ``false``, ``[]``, ``null``, an object with its required properties."""
    if not isinstance(schema, dict):
        return {}
    if schema.get("enum"):
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return schema_default_instance(schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum")) or 0
        value = low + (1 if "exclusiveMinimum" in schema and "minimum" not in schema else 0)
        return int(value) if kind == "integer" else value
    if kind == "string":
        return ""
    if kind == "boolean":
        return False
    if kind == "array":
        return [schema_default_instance(schema.get("items"))] * int(schema.get("minItems") or 0)
    if kind == "null":
        return None
    properties = schema.get("properties") or {}
    required = schema.get("required") or list(properties)
    return {name: schema_default_instance(properties.get(name)) for name in required}


# ---- Responses answer -> Gemini answer


def response_to_gemini_response(response: dict[str, Any], *, model: str) -> dict[str, Any]:
    """A Responses ``response`` as a ``GenerateContentResponse``; the call's token-ID fields ride
    on it beside Gemini's own (as on the Messages path)."""
    parts: list[dict[str, Any]] = []
    for index, item in enumerate(response.get("output") or []):
        kind = item.get("type") or "message"
        if kind == "reasoning":
            text = "".join(str(part.get("text") or "") for part in item.get("summary") or [])
            parts.append({"text": text, "thought": True})
        elif kind == "message":
            content = item.get("content") or ""
            text = (
                content
                if isinstance(content, str)
                else "".join(str(part.get("text") or part.get("refusal") or "") for part in content)
            )
            parts.append({"text": text})
        elif kind == "function_call":
            arguments = json.loads(item.get("arguments") or "{}")
            if not isinstance(arguments, dict):
                raise ValueError(f"output item {index}: function call arguments must be a JSON object")
            parts.append({"functionCall": {"id": item["call_id"], "name": item["name"], "args": arguments}})
        else:
            raise ConversionUnsupported(f"output item {index} has type {kind!r}, which Gemini cannot hold")
    reason = (response.get("incomplete_details") or {}).get("reason")
    usage = response.get("usage") or {}
    prompt, generated = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
    answer = {
        "candidates": [
            {
                "content": {"role": "model", "parts": parts or [{"text": ""}]},
                "finishReason": _FINISH_OF_INCOMPLETE.get(reason or "", "STOP"),
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": prompt,
            "candidatesTokenCount": generated,
            "totalTokenCount": prompt + generated,
        },
        "modelVersion": model,
        "responseId": str(response.get("id") or new_item_id("resp")),
    }
    answer.update(call_token_fields(response))
    return answer


def gemini_stream_chunks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished ``GenerateContentResponse`` as the chunks ``streamGenerateContent`` sends: one per
    part; the last carries the finish reason, the usage and the call's token-ID fields."""
    candidate = answer["candidates"][0]
    parts = candidate["content"]["parts"]
    shared: dict[str, Any] = {key: answer[key] for key in ("modelVersion", "responseId") if key in answer}
    chunks = []
    for index, part in enumerate(parts):
        chunk_candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]}, "index": 0}
        chunk: dict[str, Any] = {"candidates": [chunk_candidate], **shared}
        if index == len(parts) - 1:
            chunk_candidate["finishReason"] = candidate.get("finishReason", "STOP")
            chunk["usageMetadata"] = answer.get("usageMetadata")
            chunk.update({key: answer[key] for key in _TOKEN_FIELDS if key in answer})
        chunks.append(chunk)
    return chunks


def json_answer(value: Any, *, model: str) -> dict[str, Any]:
    """A ``GenerateContentResponse`` whose one text part is ``value`` as JSON (no token-ID fields:
    no model call produced it)."""
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": json.dumps(value)}]},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0},
        "modelVersion": model,
        "responseId": new_item_id("resp"),
    }
