"""The Responses ⇄ Chat Completions conversions of NeMo Gym's ``ResponsesConverter``, on dicts.

:mod:`nemo_gym.models.conversion` is the one conversion; this module adds what NeMo Gym's
converter does on top of it, so that ``nemo_gym.responses_converter`` (the typed class NeMo Gym
environments and model adapters import) stays a thin layer of pydantic validation:

- a request field that chat cannot express (``previous_response_id``, ``include``, ...) is refused
  with :class:`~nemo_gym.models.chat_tools.ConversionUnsupported` instead of being dropped;
  request fields the conversion does not name (``metadata``, ``seed``, ``chat_template_kwargs``,
  ...) pass through to the chat request; ``instructions`` and the system/developer messages that
  open the input become one system message;
- content given as parts stays a list of chat parts (a string ``input`` becomes one text part);
- a function call's item ``id`` is its ``call_id`` (NeMo Gym replays them as one);
- the response echoes the request's settings, takes its ``model``, and leaves token counts the
  engine did not report as ``None`` rather than 0;
- :func:`split_input_output_items` cuts a trajectory where the model's own items begin.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nemo_gym.models.chat_tools import ConversionUnsupported, chat_tool_choice_to_responses
from nemo_gym.models.conversion import (
    FINISH_TO_INCOMPLETE,
    ROUTED_EXPERTS_FIELD,
    TOKEN_ID_FIELDS,
    assistant_message_to_items,
    chat_request_to_responses_params,
    new_item_id,
    responses_to_chat_request,
    token_fields_of,
)
from nemo_gym.models.token_usage import chat_usage_to_responses

IdFactory = Callable[[str], str]

# Responses request fields with no Chat Completions counterpart: refused, never silently dropped.
NO_CHAT_FORM = (
    "background",
    "context_management",
    "conversation",
    "include",
    "max_tool_calls",
    "previous_response_id",
    "prompt",
    "truncation",
)
# What responses_to_chat_request reads; every other request field passes through unchanged.
_CONVERTED = frozenset(
    {"input", "instructions", "model", "max_output_tokens", "reasoning", "text", "tools", "tool_choice"}
    | {"parallel_tool_calls", "temperature", "top_p"}
)
# Request settings a response echoes.
ECHOED_REQUEST_SETTINGS = (
    "temperature",
    "top_p",
    "background",
    "max_output_tokens",
    "max_tool_calls",
    "previous_response_id",
    "prompt",
    "reasoning",
    "service_tier",
    "text",
    "top_logprobs",
    "truncation",
    "metadata",
    "instructions",
    "user",
)
# Chat request fields that mean the same on a Responses request.
_SAME_ON_RESPONSES = (
    "metadata",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "service_tier",
    "store",
    "top_logprobs",
    "user",
    "stream",
)
# Output item types that only the model produces: the first of them starts the generated part.
_MODEL_ITEM_TYPES = frozenset(
    {
        "reasoning",
        "function_call",
        "custom_tool_call",
        "code_interpreter_call",
        "computer_call",
        "file_search_call",
        "image_generation_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "tool_search_call",
        "web_search_call",
    }
)


def responses_params_to_chat_params(
    params: dict[str, Any], *, token_ids: bool, think_tags: bool = True
) -> dict[str, Any]:
    """A Responses create-params dict (only the fields set) as a Chat Completions request dict.

    ``token_ids``: keep the token-ID fields replayed on assistant turns (off, they are left out).
    Raises :class:`ConversionUnsupported` for a field, item, tool or reasoning setting chat has
    no form for, ``ValueError`` for malformed input.
    """
    refused = [key for key in NO_CHAT_FORM if params.get(key) is not None]
    if refused:
        raise ConversionUnsupported(
            f"Responses request field(s) {refused} have no Chat Completions form; "
            "send this request to a model server that serves the Responses API directly"
        )
    reasoning = params.get("reasoning") or {}
    unsupported = sorted(key for key, value in reasoning.items() if key != "effort" and value is not None)
    if unsupported:
        raise ConversionUnsupported(f"reasoning field(s) {unsupported} have no Chat Completions form")
    request = responses_to_chat_request(params, think_tags=think_tags, fold_system=True, text_parts=True)
    if not token_ids:
        for message in request["messages"]:
            for key in (*TOKEN_ID_FIELDS, ROUTED_EXPERTS_FIELD):
                message.pop(key, None)
    verbosity = (params.get("text") or {}).get("verbosity")
    if verbosity is not None:
        request["verbosity"] = verbosity
    passed = {key: value for key, value in params.items() if key not in _CONVERTED and value is not None}
    return {**passed, **request}


def assistant_message_to_output_items(
    message: dict[str, Any], *, think_tags: bool, token_ids: bool, new_id: IdFactory = new_item_id
) -> list[dict[str, Any]]:
    """One assistant chat message as Responses output items (see ``assistant_message_to_items``).

    With ``token_ids``, the message's token-ID fields (and ``routed_experts``) ride on the last item.
    """
    items = assistant_message_to_items(message, think_tags, new_id)
    for item in items:
        if item["type"] == "function_call":
            item["id"] = item["call_id"]
    fields = token_fields_of(message, "assistant message") if token_ids else None
    if fields is not None:
        if message.get(ROUTED_EXPERTS_FIELD) is not None:
            fields[ROUTED_EXPERTS_FIELD] = message[ROUTED_EXPERTS_FIELD]
        items[-1].update(fields)
    return items


def chat_messages_to_items(
    messages: list[dict[str, Any]], *, think_tags: bool, token_ids: bool, new_id: IdFactory = new_item_id
) -> list[dict[str, Any]]:
    """Chat messages as Responses items: input messages, model output items, function call outputs."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "assistant":
            items += assistant_message_to_output_items(
                message, think_tags=think_tags, token_ids=token_ids, new_id=new_id
            )
            continue
        (item,) = chat_request_to_responses_params({"messages": [message]}, new_id=new_id)["input"]
        if item["type"] == "function_call_output":
            item["status"] = "completed"
            if isinstance(message.get("content"), list):  # a tool's text parts stay parts
                item["output"] = [{"type": "input_text", "text": part["text"]} for part in message["content"]]
        items.append(item)
    return items


def chat_params_to_responses_params(
    chat_params: dict[str, Any], *, think_tags: bool, token_ids: bool, new_id: IdFactory = new_item_id
) -> dict[str, Any]:
    """A Chat Completions request dict as Responses create-params (``tool_choice`` defaults to auto)."""
    params = chat_request_to_responses_params(chat_params, think_tags=think_tags, new_id=new_id)
    params["input"] = chat_messages_to_items(
        chat_params.get("messages") or [], think_tags=think_tags, token_ids=token_ids, new_id=new_id
    )
    # A Responses request names only max_completion_tokens' meaning, not the legacy max_tokens.
    params.pop("max_output_tokens", None)
    if chat_params.get("max_completion_tokens") is not None:
        params["max_output_tokens"] = chat_params["max_completion_tokens"]
    params.setdefault("tools", [])
    params["tool_choice"] = chat_tool_choice_to_responses(chat_params.get("tool_choice")) or "auto"
    for key in _SAME_ON_RESPONSES:
        if chat_params.get(key) is not None:
            params[key] = chat_params[key]
    if chat_params.get("verbosity") is not None:
        params["text"] = {**params.get("text", {}), "verbosity": chat_params["verbosity"]}
    return params


def chat_completion_to_response_envelope(
    params: dict[str, Any],
    completion: dict[str, Any],
    output: list[dict[str, Any]],
    *,
    new_id: IdFactory = new_item_id,
    keep_completion_id: bool = False,
) -> dict[str, Any]:
    """The Responses ``response`` for ``completion`` (answering ``params``) with ``output`` items.

    ``keep_completion_id``: reuse the completion's id (when a capture recorded the served payload
    under it), else a fresh ``resp_`` id. A ``length`` or ``content_filter`` finish makes the
    response ``incomplete``; a provider's ``native_finish_reason`` is kept beside it.
    """
    choice = completion["choices"][0]
    reason = FINISH_TO_INCOMPLETE.get(choice.get("finish_reason") or "")
    response: dict[str, Any] = {key: params.get(key) for key in ECHOED_REQUEST_SETTINGS}
    response.update(
        {
            "id": (str(completion.get("id") or "") if keep_completion_id else "") or new_id("resp"),
            "object": "response",
            "created_at": completion.get("created"),
            "model": params.get("model") or completion.get("model") or "",
            "output": output,
            "tool_choice": params.get("tool_choice") if params.get("tool_choice") is not None else "auto",
            "parallel_tool_calls": params.get("parallel_tool_calls"),
            "tools": params.get("tools") or [],
            "status": "incomplete" if reason else "completed",
            "incomplete_details": {"reason": reason} if reason else None,
            "usage": chat_usage_to_responses(completion.get("usage"), unknown=None),
        }
    )
    if choice.get("native_finish_reason") is not None:
        response["native_finish_reason"] = str(choice["native_finish_reason"])
    return response


def split_input_output_items(items: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Cut a trajectory into ``(prompt items, generated items)`` at the first item the model produced.

    The model's items are assistant messages and the output types only a model emits (reasoning,
    function and tool calls); user, system and developer messages and tool outputs stay in the
    prompt part. Items may be dicts or pydantic objects.
    """

    def field(item: Any, key: str) -> Any:
        return item.get(key) if isinstance(item, dict) else getattr(item, key, None)

    for index, item in enumerate(items):
        kind = field(item, "type")
        # NeMo Gym rows may leave `type` off a message: its role alone marks it.
        if (kind in (None, "message") and field(item, "role") == "assistant") or kind in _MODEL_ITEM_TYPES:
            return list(items[:index]), list(items[index:])
    return list(items), []
