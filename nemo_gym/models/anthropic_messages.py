"""Anthropic's Messages API ⇄ the Responses API, both ways, on plain dicts.

Two uses, in opposite directions:

- a model server in front of Anthropic's API sends a Responses request as a Messages request
  (:func:`responses_params_to_messages_request`) and reads the answer back
  (:func:`messages_response_to_response`);
- a model server that serves Anthropic clients (the Claude Code CLI) reads their Messages
  request as a Responses request (:func:`messages_request_to_responses_params`), answers it with
  its own Responses call and sends that back as a Messages response
  (:func:`response_to_messages_response`), as a whole or as Messages events
  (:func:`messages_response_events`).

The mapping: ``system`` is ``instructions`` (system/developer messages join it); text and
base64 image blocks are message content; ``thinking`` blocks are reasoning items (the signature
rides in ``encrypted_content``); ``tool_use`` blocks are function calls (JSON ``input`` ⇄
``arguments`` string); ``tool_result`` blocks are function call outputs. Consecutive items of
one role share one Messages turn, as Anthropic requires alternating turns. No ``anthropic``
package is needed: the objects are built and checked here.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable
from typing import Any

from nemo_gym.models.chat_tools import ConversionUnsupported
from nemo_gym.models.conversion import TOKEN_ID_FIELDS, new_item_id
from nemo_gym.models.responses_chat import ECHOED_REQUEST_SETTINGS

IdFactory = Callable[[str], str]

CONTIGUITY_FIELD = "token_ids_contiguous"

IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""The image types Anthropic's API takes."""
_INCOMPLETE_OF_STOP = {
    "max_tokens": "max_output_tokens",
    "model_context_window_exceeded": "max_output_tokens",
    "refusal": "content_filter",
}
_STOP_OF_INCOMPLETE = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}
_EMPTY_SCHEMA = {"type": "object", "properties": {}}
_TOKEN_FIELDS = (*TOKEN_ID_FIELDS, CONTIGUITY_FIELD)
# Roles a Messages client may send: Claude Code puts a `system` turn mid-conversation at times.
_CLIENT_ROLES = ("user", "assistant", "system")
# Models whose API refuses temperature / top_p / top_k.
_FIXED_SAMPLING_MODELS = ("claude-opus-4-7", "claude-opus-4-8")
# Request settings a Responses answer echoes.
_ECHOED = ("tool_choice", "parallel_tool_calls", "tools", *ECHOED_REQUEST_SETTINGS)


# ---- Responses request -> Messages request (a server in front of Anthropic)


def responses_params_to_messages_request(
    params: dict[str, Any],
    *,
    model: str,
    max_tokens: int,
    thinking: dict[str, Any] | None = None,
    thinking_budget_tokens: int | None = None,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Messages request for Responses create-params (a dict of the fields set).

    ``extra_body`` fields are sent as given; ``max_output_tokens`` wins over ``max_tokens``.
    Thinking is configured by at most one of ``thinking``, ``thinking_budget_tokens`` or
    ``extra_body["thinking"]`` (``ValueError`` otherwise). Raises ``ValueError`` for sampling
    settings a model refuses and :class:`ConversionUnsupported` for what Messages cannot hold.
    """
    request: dict[str, Any] = dict(extra_body or {})
    request.update(
        {"model": model, "max_tokens": params.get("max_output_tokens") or max_tokens, "messages": []}
    )
    system = [params["instructions"]] if params.get("instructions") else []
    raw = params.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw or [])
    for index, item in enumerate(items):
        kind, where = item.get("type") or "message", f"input item {index}"
        if kind == "message" and item.get("role") in ("system", "developer"):
            system.append(_plain_text(item.get("content") or "", where))
        elif kind == "message" and item.get("role") in ("user", "assistant"):
            _append_turn(
                request["messages"],
                item["role"],
                _content_blocks(item.get("content") or "", item["role"], where),
            )
        elif kind == "message":
            raise ConversionUnsupported(f"{where} has role {item.get('role')!r}, which Messages cannot hold")
        elif kind == "reasoning":
            _append_turn(request["messages"], "assistant", _thinking_blocks(item))
        elif kind == "function_call":
            _append_turn(request["messages"], "assistant", [_tool_use(item)])
        elif kind == "function_call_output":
            block = {"type": "tool_result", "tool_use_id": item["call_id"], "content": item["output"]}
            _append_turn(request["messages"], "user", [block])
        else:
            raise ConversionUnsupported(f"{where} has type {kind!r}, which has no Messages form")
    if any(system):
        request["system"] = [{"type": "text", "text": text} for text in system if text]
    for key in ("temperature", "top_p"):
        if params.get(key) is not None:
            request[key] = params[key]
    if any(name in model for name in _FIXED_SAMPLING_MODELS):
        fixed = [key for key in ("temperature", "top_p", "top_k") if request.get(key) is not None]
        if fixed:
            raise ValueError(f"{model} does not take sampling settings; leave out {fixed}")
    tools = [_tool_to_messages(tool, index) for index, tool in enumerate(params.get("tools") or [])]
    if tools:
        request["tools"] = tools
    if params.get("tool_choice") is not None:
        request["tool_choice"] = _tool_choice_to_messages(params["tool_choice"])
    sources = ["thinking" in request, thinking is not None, thinking_budget_tokens is not None]
    if sum(sources) > 1:
        raise ValueError(
            "configure thinking in one place only: thinking, thinking_budget_tokens or extra_body"
        )
    if thinking is not None:
        request["thinking"] = thinking
    elif thinking_budget_tokens is not None:
        request["thinking"] = {"type": "enabled", "budget_tokens": thinking_budget_tokens}
    return request


def _append_turn(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    # Messages turns alternate: items of the same role join the turn before them.
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": list(blocks)})


def _plain_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.get("type") not in ("input_text", "output_text", "text"):
            raise ConversionUnsupported(f"{where}: a system message part of type {part.get('type')!r}")
        texts.append(part["text"])
    return "\n".join(texts)


def _content_blocks(content: Any, role: str, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks = []
    for part in content:
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and role == "assistant":
            blocks.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and role == "user":
            media_type, data = parse_image_data_url(part.get("image_url"), where)
            blocks.append(
                {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
            )
        else:
            raise ConversionUnsupported(
                f"{where}: a {role} content part of type {kind!r} has no Messages form"
            )
    return blocks


def parse_image_data_url(image_url: Any, where: str) -> tuple[str, str]:
    """``(media type, base64 data)`` of a ``data:`` image URL; ``ValueError`` naming ``where`` otherwise."""
    if isinstance(image_url, dict):
        image_url = image_url.get("url")
    if not isinstance(image_url, str) or not image_url.startswith("data:"):
        raise ValueError(f"{where}: Messages takes images as base64 data: URLs, not remote URLs")
    header, _, data = image_url.partition(",")
    fields = header.removeprefix("data:").split(";")
    media_type = "image/jpeg" if fields[0].lower() == "image/jpg" else fields[0].lower()
    if not data or "base64" not in fields[1:]:
        raise ValueError(f"{where}: the image data URL holds no base64 data")
    if media_type not in IMAGE_MEDIA_TYPES:
        raise ValueError(f"{where}: image type {media_type!r}; Messages takes {sorted(IMAGE_MEDIA_TYPES)}")
    try:
        base64.b64decode(data, validate=True)
    except binascii.Error as error:
        raise ValueError(f"{where}: the image data URL's base64 does not decode") from error
    return media_type, data


def _thinking_blocks(item: dict[str, Any]) -> list[dict[str, Any]]:
    # A thinking block must carry a signature; open models have none to give.
    signature = item.get("encrypted_content") or ""
    return [
        {"type": "thinking", "thinking": part["text"], "signature": signature}
        for part in item.get("summary") or []
    ]


def _tool_use(item: dict[str, Any]) -> dict[str, Any]:
    arguments = json.loads(item.get("arguments") or "{}")
    if not isinstance(arguments, dict):
        raise ValueError(
            f"function call {item['call_id']!r}: arguments must be a JSON object for a tool_use block"
        )
    return {"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": arguments}


def _tool_to_messages(tool: dict[str, Any], index: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise ConversionUnsupported(
            f"tools[{index}] has type {tool.get('type')!r}; Messages takes function tools"
        )
    converted = {"name": tool["name"], "input_schema": tool.get("parameters") or dict(_EMPTY_SCHEMA)}
    if tool.get("description"):
        converted["description"] = tool["description"]
    return converted


def _tool_choice_to_messages(tool_choice: Any) -> dict[str, Any]:
    if tool_choice in ("auto", "none"):
        return {"type": tool_choice}
    if tool_choice == "required":
        return {"type": "any"}
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        return {"type": "tool", "name": tool_choice["name"]}
    raise ConversionUnsupported(f"tool_choice {tool_choice!r} has no Messages form")


# ---- Messages answer -> Responses answer


def messages_content_to_items(
    content: list[dict[str, Any]], new_id: IdFactory = new_item_id
) -> list[dict[str, Any]]:
    """Assistant content blocks as Responses output items, in order (text runs join one message)."""
    items: list[dict[str, Any]] = []
    text: list[str] = []

    def close_text() -> None:
        if text:
            part = {"type": "output_text", "text": "".join(text), "annotations": []}
            items.append({"id": new_id("msg"), "type": "message", "role": "assistant", "status": "completed",
                          "content": [part]})  # fmt: skip
            text.clear()

    for block in content:
        kind = block.get("type")
        if kind == "text":
            text.append(block.get("text") or "")
            continue
        close_text()
        if kind == "thinking":
            summary = [{"type": "summary_text", "text": block.get("thinking") or block.get("text") or ""}]
            items.append({"id": new_id("rs"), "type": "reasoning", "summary": summary,
                          "encrypted_content": block.get("signature")})  # fmt: skip
        elif kind == "tool_use":
            items.append(
                {"id": block["id"], "type": "function_call", "call_id": block["id"], "name": block["name"],
                 "arguments": json.dumps(block.get("input") or {}), "status": "completed"}
            )  # fmt: skip
        else:
            raise ConversionUnsupported(f"an Anthropic content block of type {kind!r} has no Responses form")
    close_text()
    return items


def messages_response_to_response(
    answer: dict[str, Any], params: dict[str, Any], *, model: str, new_id: IdFactory = new_item_id
) -> dict[str, Any]:
    """The Responses response for a Messages ``answer`` to ``params`` (settings echoed, usage mapped)."""
    output = messages_content_to_items(answer.get("content") or [], new_id)
    if not output:
        output = messages_content_to_items([{"type": "text", "text": ""}], new_id)
    reason = _INCOMPLETE_OF_STOP.get(answer.get("stop_reason") or "")
    usage = answer.get("usage")
    response: dict[str, Any] = {key: params.get(key) for key in _ECHOED}
    response.update(
        {
            "id": new_id("resp"),
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "output": output,
            "tools": params.get("tools") or [],
            "tool_choice": params.get("tool_choice") if params.get("tool_choice") is not None else "auto",
            "status": "incomplete" if reason else "completed",
            "incomplete_details": {"reason": reason} if reason else None,
            "usage": None if usage is None else _usage_to_responses(usage),
        }
    )
    return response


def _usage_to_responses(usage: dict[str, Any]) -> dict[str, Any]:
    input_tokens, output_tokens = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "input_tokens_details": {"cached_tokens": usage.get("cache_read_input_tokens")},
        # Anthropic does not count thinking tokens apart.
        "output_tokens_details": {"reasoning_tokens": None},
    }


# ---- Messages request -> Responses request (a server serving Anthropic clients)


def messages_request_to_responses_params(
    body: dict[str, Any], new_id: IdFactory = new_item_id
) -> dict[str, Any]:
    """Responses create-params for a Messages request (fields the request does not set are left out)."""
    items: list[dict[str, Any]] = []
    for index, message in enumerate(body.get("messages") or []):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in _CLIENT_ROLES:
            raise ValueError(f"{where} must be an object with role 'user', 'assistant' or 'system'")
        content, role = message.get("content", ""), message["role"]
        if isinstance(content, str):
            turn = [{"type": "message", "role": role, "content": content}]
        elif isinstance(content, list):
            turn = _blocks_to_items(role, content, where, new_id)
        else:
            raise ValueError(f"{where}.content must be a string or a list of content blocks")
        # A client that keeps our token-ID fields on an assistant turn (an SDK user, a capture
        # proxy) hands them back on the turn's last item, where the Responses path carries them.
        fields = {key: message[key] for key in _TOKEN_FIELDS if key in message}
        if fields and role == "assistant" and turn:
            turn[-1] = {**turn[-1], **fields}
        items += turn
    params: dict[str, Any] = {"input": items}
    if body.get("stop_sequences"):
        raise ValueError(
            "stop_sequences are not served: stop strings cut sampled text inside tokens; leave them out"
        )
    system = body.get("system")
    if isinstance(system, list):
        system = "\n".join(
            block["text"] for block in system if block.get("type") == "text" and block.get("text")
        )
    if system:
        params["instructions"] = system
    for source, target in (("model", "model"), ("max_tokens", "max_output_tokens"), ("temperature", "temperature"),
                           ("top_p", "top_p")):  # fmt: skip
        if body.get(source) is not None:
            params[target] = body[source]
    tools = [_tool_to_responses(tool, index) for index, tool in enumerate(body.get("tools") or [])]
    if tools:
        params["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, dict):
        raise ValueError("tool_choice must be an object such as {'type': 'auto'}")
    if choice is not None:
        modes = {"auto": "auto", "none": "none", "any": "required"}
        if choice.get("type") in modes:
            params["tool_choice"] = modes[choice["type"]]
        elif choice.get("type") == "tool":
            params["tool_choice"] = {"type": "function", "name": choice["name"]}
        else:
            raise ConversionUnsupported(f"tool_choice {choice!r} has no Responses form")
    return params


def _tool_to_responses(tool: Any, index: int) -> dict[str, Any]:
    # Anthropic's server tools (web search, code execution, ...) run on Anthropic's side.
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise ValueError(f"tools[{index}] must be an object with a 'name'")
    if tool.get("type") not in (None, "custom"):
        raise ConversionUnsupported(
            f"tools[{index}] ({tool['name']!r}) has type {tool['type']!r}: only client tools "
            "(with an input_schema) can be served by this model"
        )
    if not isinstance(tool.get("input_schema", {}), dict):
        raise ValueError(f"tools[{index}].input_schema must be a JSON schema object")
    return {"type": "function", "name": tool["name"], "description": tool.get("description"),
            "parameters": tool.get("input_schema") or dict(_EMPTY_SCHEMA), "strict": False}  # fmt: skip


def _blocks_to_items(
    role: str, blocks: list[dict[str, Any]], where: str, new_id: IdFactory
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []

    def close_message() -> None:
        if parts:
            single = len(parts) == 1 and parts[0]["type"] == "input_text"
            items.append(
                {"type": "message", "role": role, "content": parts[0]["text"] if single else list(parts)}
            )
            parts.clear()

    for index, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{index}]"
        if kind == "text":
            parts.append({"type": "input_text", "text": block.get("text") or ""})
        elif kind == "image":
            parts.append(_image_part(block, at))
        else:
            close_message()
            if kind == "tool_use" and not isinstance(block.get("input", {}), dict):
                raise ValueError(f"{at}.input must be an object")
            if kind == "tool_use":
                items.append({"id": block["id"], "type": "function_call", "call_id": block["id"], "name": block["name"],
                              "arguments": json.dumps(block.get("input") or {}), "status": "completed"})  # fmt: skip
            elif kind == "tool_result":
                output = _tool_result_output(block.get("content", ""), at)
                items.append(
                    {"type": "function_call_output", "call_id": block["tool_use_id"], "output": output}
                )
            elif kind == "thinking":
                summary = [{"type": "summary_text", "text": block.get("thinking") or ""}]
                items.append({"id": new_id("rs"), "type": "reasoning", "summary": summary,
                              "encrypted_content": block.get("signature")})  # fmt: skip
            else:
                raise ConversionUnsupported(f"{at}: a content block of type {kind!r} has no Responses form")
    close_message()
    return items


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") != "base64":
        raise ConversionUnsupported(f"{where}: only base64 image sources convert")
    if source.get("media_type") not in IMAGE_MEDIA_TYPES:
        raise ValueError(
            f"{where}: image type {source.get('media_type')!r}; expected {sorted(IMAGE_MEDIA_TYPES)}"
        )
    url = f"data:{source['media_type']};base64,{source['data']}"
    return {"type": "input_image", "image_url": url, "detail": "auto"}


def _tool_result_output(content: Any, where: str) -> Any:
    if isinstance(content, str):
        return content
    if all(block.get("type") == "text" for block in content):
        return "\n".join(block.get("text") or "" for block in content)
    parts = []
    for block in content:
        if block.get("type") == "text":
            parts.append({"type": "input_text", "text": block.get("text") or ""})
        elif block.get("type") == "image":
            parts.append(_image_part(block, where))
        else:
            raise ConversionUnsupported(f"{where}: a tool_result block of type {block.get('type')!r}")
    return parts


# ---- Responses answer -> Messages answer (+ events)


def response_to_messages_response(
    response: dict[str, Any], *, model: str, new_id: IdFactory = new_item_id
) -> dict[str, Any]:
    """A Responses ``response`` as a Messages response; the call's token-ID fields (see
    :func:`call_token_fields`) are kept on it, beside Anthropic's own fields."""
    content: list[dict[str, Any]] = []
    for index, item in enumerate(response.get("output") or []):
        kind, where = item.get("type") or "message", f"output item {index}"
        if kind == "message":
            content += _content_blocks(item.get("content") or "", "assistant", where)
        elif kind == "reasoning":
            content += _thinking_blocks(item)
        elif kind == "function_call":
            content.append(_tool_use(item))
        else:
            raise ConversionUnsupported(f"{where} has type {kind!r}, which a Messages response cannot hold")
    reason = (response.get("incomplete_details") or {}).get("reason")
    has_tool_use = any(block["type"] == "tool_use" for block in content)
    stop = _STOP_OF_INCOMPLETE.get(reason or "") or ("tool_use" if has_tool_use else "end_turn")
    usage = response.get("usage") or {}
    answer = {
        # The Responses id is kept: a token capture recorded the call under it.
        "id": str(response.get("id") or "") or new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("input_tokens") or 0,
            "output_tokens": usage.get("output_tokens") or 0,
        },
    }
    answer.update(call_token_fields(response))
    return answer


def call_token_fields(response: dict[str, Any]) -> dict[str, Any]:
    """The token-ID fields of a Responses answer (from the last output item carrying them; ``{}``
    when it has none): one dialect answer is one model call, so they sit on the answer itself."""
    for item in reversed(response.get("output") or []):
        if isinstance(item, dict) and "prompt_token_ids" in item:
            return {key: item[key] for key in _TOKEN_FIELDS if key in item}
    return {}


def messages_response_events(answer: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, data)`` of the Messages events streaming a finished ``answer``.

    ``message_start`` (the answer without content or stop reason), ``ping``, per block
    ``content_block_start`` / ``content_block_delta`` (a thinking block's signature in a second
    delta) / ``content_block_stop``, ``message_delta`` (stop reason, output tokens, and the
    call's token-ID fields when the answer has them), ``message_stop``.
    """
    tokens = {key: answer[key] for key in _TOKEN_FIELDS if key in answer}
    shell = {key: value for key, value in answer.items() if key not in tokens}
    usage = answer.get("usage") or {}
    # As Anthropic streams: no content, no stop reason yet, the prompt's tokens counted.
    shell.update(content=[], stop_reason=None, stop_sequence=None,
                 usage={"input_tokens": usage.get("input_tokens", 0), "output_tokens": 0})  # fmt: skip
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": shell}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(answer.get("content") or []):
        kind = block.get("type")
        empty: dict[str, Any]
        if kind == "text":
            empty = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block.get("text") or ""}
        elif kind == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block.get("thinking") or ""}
        elif kind == "tool_use":
            empty = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})}
        else:
            raise ConversionUnsupported(f"a content block of type {kind!r} cannot be streamed")
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": empty})
        )
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        )
        if kind == "thinking":
            signed = {"type": "signature_delta", "signature": block.get("signature") or ""}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": signed})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    stop = {"stop_reason": answer.get("stop_reason"), "stop_sequence": answer.get("stop_sequence")}
    output_tokens = usage.get("output_tokens", 0)
    # The call's token IDs ride on the last data event, as on the Responses and Chat streams.
    events.append(
        ("message_delta",
         {"type": "message_delta", "delta": stop, "usage": {"output_tokens": output_tokens}, **tokens})
    )  # fmt: skip
    events.append(("message_stop", {"type": "message_stop"}))
    return events
