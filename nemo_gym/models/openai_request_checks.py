"""Shape checks of the OpenAI requests a model server accepts: a wrong shape is a 400 naming the field.

Every model server runs these before its handler, so a malformed request (a message whose
``content`` is a number, a tool that is not an object) gets a clear 4xx instead of failing deep
inside a conversion with a 500. Only the structure the servers rely on is checked; values an
engine judges (a model name it does not serve, a temperature it cannot honour) are left to it.
Token-ID arrays are checked to be lists, not element by element, so large ones stay cheap.

A request as JSON parses it (plain ``dict``, ``list``, ``str``, ...) is first checked on a fast
path that compares exact types and makes no call per field; anything it does not accept (a
wrong shape, or a subclass such as ``bool`` where a number goes) goes through the full checks,
which name the field.
"""

from __future__ import annotations

from typing import Any

from nemo_gym.serving.server import HTTPError

_TOKEN_ID_LISTS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
_TOKEN_ID_SET = frozenset(_TOKEN_ID_LISTS)


def _fail(message: str) -> HTTPError:
    return HTTPError(400, message)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_optional(body: dict[str, Any], key: str, check: Any, wanted: str, where: str = "") -> None:
    if body.get(key) is not None and not check(body[key]):
        raise _fail(f"{where}{key} must be {wanted}, got {_kind(body[key])}")


def _check_text_field(item: dict[str, Any], key: str, where: str) -> None:
    if key in item and item[key] is not None and not isinstance(item[key], str):
        raise _fail(f"{where}.{key} must be a string, got {_kind(item[key])}")


def _check_content(content: Any, where: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _fail(f"{where}.content must be a string or a list of content parts, got {_kind(content)}")
    for index, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _fail(f"{where}.content[{index}] must be an object with a 'type'")
        for key in ("text", "refusal"):
            _check_text_field(part, key, f"{where}.content[{index}]")


def _check_common(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _fail(f"the request body must be a JSON object, got {_kind(body)}")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise _fail(f"stream must be true or false, got {body['stream']!r}")
    # The same checks as _check_optional's, written out (they run on every model call).
    value = body.get("model")
    if value is not None and not isinstance(value, str):
        raise _fail(f"model must be a string, got {_kind(value)}")
    value = body.get("metadata")
    if value is not None and not isinstance(value, dict):
        raise _fail(f"metadata must be an object, got {_kind(value)}")
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None and not _is_number(value):
            raise _fail(f"{key} must be a number, got {_kind(value)}")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _fail(f"tools must be a list, got {_kind(tools)}")
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise _fail(f"tools[{index}] must be an object, got {_kind(tool)}")
    return body


def _check_parameters(parameters: Any, where: str) -> None:
    """A function tool's JSON schema: an object whose ``properties`` (if any) is an object."""
    if parameters is None:
        return
    if not isinstance(parameters, dict):
        raise _fail(f"{where} must be a JSON schema object, got {_kind(parameters)}")
    properties = parameters.get("properties")
    if properties is not None and not isinstance(properties, dict):
        raise _fail(f"{where}.properties must be an object (name → schema), got {_kind(properties)}")
    for name, schema in (properties or {}).items():
        # JSON Schema's true/false schemas too: chat templates and argument builders read each
        # property's keys, so a non-object is refused here, named, instead of failing there.
        if not isinstance(schema, dict):
            raise _fail(f"{where}.properties.{name} must be a JSON schema object, got {_kind(schema)}")
    required = parameters.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(r, str) for r in required)
    ):
        raise _fail(f"{where}.required must be a list of property names, got {_kind(required)}")


_NUMBERS = frozenset({int, float})


def responses_request_fine(body: dict[str, Any]) -> bool:
    """Whether a Responses request passes every check of :func:`check_responses_request`, seen on
    plain values only (one function, one pass over the tools: it runs on every model call)."""
    if "stream" in body and body["stream"] is not None and body["stream"].__class__ is not bool:
        return False
    if "model" in body and body["model"] is not None and body["model"].__class__ is not str:
        return False
    if "metadata" in body and body["metadata"] is not None and body["metadata"].__class__ is not dict:
        return False
    if (
        "temperature" in body
        and body["temperature"] is not None
        and body["temperature"].__class__ not in _NUMBERS
    ):
        return False
    if "top_p" in body and body["top_p"] is not None and body["top_p"].__class__ not in _NUMBERS:
        return False
    if "max_output_tokens" in body:
        value = body["max_output_tokens"]
        if value is not None and value.__class__ is not int:
            return False
    tools = body["tools"] if "tools" in body else None
    if tools is not None:
        if tools.__class__ is not list:
            return False
        for tool in tools:
            if tool.__class__ is not dict:
                return False
            if "type" in tool and tool["type"] != "function":
                continue
            if "name" not in tool or tool["name"].__class__ is not str:
                return False
            # The function's JSON schema (what _check_parameters accepts), written out here.
            parameters = tool["parameters"] if "parameters" in tool else None
            if parameters is None:
                continue
            if parameters.__class__ is not dict:
                return False
            if "properties" in parameters and parameters["properties"] is not None:
                properties = parameters["properties"]
                if properties.__class__ is not dict:
                    return False
                for schema in properties.values():
                    if schema.__class__ is not dict:
                        return False
            if "required" in parameters and parameters["required"] is not None:
                required = parameters["required"]
                if required.__class__ is not list:
                    return False
                for name in required:
                    if name.__class__ is not str:
                        return False
    items = body["input"] if "input" in body else None
    if items.__class__ is str:
        return True
    if items.__class__ is not list:
        return False
    for item in items:
        if item.__class__ is not dict:
            return False
        kind = item["type"] if "type" in item else "message"
        if kind == "message":
            if "role" not in item or item["role"].__class__ is not str:
                return False
            content = item["content"] if "content" in item else None
            if content is not None and content.__class__ is not str:
                if content.__class__ is not list:
                    return False
                for part in content:
                    if part.__class__ is not dict or "type" not in part or part["type"].__class__ is not str:
                        return False
                    for key in ("text", "refusal"):
                        if key in part and part[key] is not None and part[key].__class__ is not str:
                            return False
        elif kind == "function_call":
            if "name" not in item or item["name"].__class__ is not str:
                return False
            if "arguments" not in item or item["arguments"].__class__ is not str:
                return False
            if "call_id" in item and item["call_id"] is not None and item["call_id"].__class__ is not str:
                return False
        elif kind == "function_call_output":
            if "call_id" in item and item["call_id"] is not None and item["call_id"].__class__ is not str:
                return False
            if (
                "output" in item
                and item["output"].__class__ is not str
                and item["output"].__class__ is not list
            ):
                return False
        elif kind.__class__ is not str:
            return False
        elif kind == "reasoning" and "summary" in item and item["summary"].__class__ is not list:
            return False
        if not _TOKEN_ID_SET.isdisjoint(item):  # one C call for the usual item, which has none
            for key in _TOKEN_ID_LISTS:
                if key in item and item[key] is not None and item[key].__class__ is not list:
                    return False
    return True


def check_responses_request(body: Any) -> None:
    """Raise ``HTTPError`` 400 naming the field when a Responses create request has the wrong shape."""
    if body.__class__ is dict and responses_request_fine(body):
        return
    check_responses_request_fully(body)


def check_responses_request_fully(body: Any) -> None:
    """:func:`check_responses_request` without its fast path (every check, field by field)."""
    body = _check_common(body)
    value = body.get("max_output_tokens")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise _fail(f"max_output_tokens must be an integer, got {_kind(value)}")
    for index, tool in enumerate(body.get("tools") or []):
        if tool.get("type", "function") == "function":
            if not isinstance(tool.get("name"), str):
                raise _fail(f"tools[{index}].name must be a string (a function tool's name)")
            _check_parameters(tool.get("parameters"), f"tools[{index}].parameters")
    value = body.get("input")
    if value is None:
        # OpenAI can continue a stored conversation without input; no server here stores one.
        raise _fail("input is missing: a Responses request needs 'input' (a string or a list of items)")
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _fail(f"input must be a string or a list of items, got {_kind(value)}")
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise _fail(f"{where} must be an object, got {_kind(item)}")
        kind = item.get("type", "message")
        if not isinstance(kind, str):
            raise _fail(f"{where}.type must be a string, got {_kind(kind)}")
        if kind == "message":
            if not isinstance(item.get("role"), str):
                raise _fail(f"{where}.role must be a string (user, assistant, system, developer)")
            _check_content(item.get("content"), where)
        elif kind == "function_call":
            for key in ("name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise _fail(
                        f"{where}.{key} must be a string (a function_call item), got {_kind(item.get(key))}"
                    )
            _check_text_field(item, "call_id", where)
        elif kind == "function_call_output":
            _check_text_field(item, "call_id", where)
            if "output" in item and not isinstance(item["output"], str | list):
                raise _fail(f"{where}.output must be a string or a list, got {_kind(item['output'])}")
        elif kind == "reasoning" and "summary" in item and not isinstance(item["summary"], list):
            raise _fail(f"{where}.summary must be a list, got {_kind(item['summary'])}")
        for key in _TOKEN_ID_LISTS:
            if key in item and item[key] is not None and not isinstance(item[key], list):
                raise _fail(f"{where}.{key} must be a list, got {_kind(item[key])}")


def check_chat_request(body: Any) -> None:
    """Raise ``HTTPError`` 400 naming the field when a Chat Completions request has the wrong shape."""
    body = _check_common(body)
    for key in ("max_tokens", "max_completion_tokens"):
        _check_optional(body, key, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
    for index, tool in enumerate(body.get("tools") or []):
        if tool.get("type", "function") == "function" and not (
            isinstance(tool.get("function"), dict) and isinstance(tool["function"].get("name"), str)
        ):
            raise _fail(f"tools[{index}].function must be an object with a string 'name'")
        if tool.get("type", "function") == "function":
            _check_parameters(tool["function"].get("parameters"), f"tools[{index}].function.parameters")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _fail(f"messages must be a list of messages, got {_kind(messages)}")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _fail(f"{where} must be an object with a string 'role'")
        _check_content(message.get("content"), where)
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise _fail(f"{where}.tool_calls must be a list, got {_kind(calls)}")
        for number, call in enumerate(calls):
            at = f"{where}.tool_calls[{number}]"
            if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
                raise _fail(f"{at} must be an object with a 'function' object")
            function = call["function"]
            if not isinstance(function.get("name"), str):
                raise _fail(f"{at}.function.name must be a string")
            _check_text_field(function, "arguments", f"{at}.function")
