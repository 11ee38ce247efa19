"""Conversion between the OpenAI Responses API and Chat Completions, both ways, on plain dicts.

Model servers speak Responses to agents and Chat Completions to engines (vLLM, the CPU engine).
Everything here works on JSON-ready dicts with no pydantic validation, because it runs on every
model call; the dicts it produces validate against the ``openai`` package's types.

Mapping rules:

- ``instructions`` becomes a leading system message; messages keep their role.
- Items from one model call (``reasoning``, an assistant ``message``, ``function_call``\\ s with
  nothing else between them) become ONE assistant message: reasoning as ``<think>...</think>``
  prepended to the content (or ``reasoning_content`` with ``think_tags=False``), function calls
  as ``tool_calls``. ``function_call_output`` becomes a ``tool`` message.
- Token IDs for RL (:data:`TOKEN_ID_FIELDS`) ride on the last output item of a model call in
  Responses form and on the assistant message in Chat Completions form; a completion from vLLM
  carries them as ``prompt_token_ids``, ``choices[0].token_ids`` and ``choices[0].logprobs``.

One idea: both directions apply one grammar of items (how a model call's items group into one
assistant turn, which types and roles exist), kept in one place so the two cannot drift apart.
"""

from __future__ import annotations

import operator
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from uuid import uuid4

from nemo_gym.models.chat_tools import (
    ConversionUnsupported,
    chat_tool_choice_to_responses,
    chat_tool_to_responses,
    needs_a_tool,
    response_format_to_text_format,
    responses_tool_choice_to_chat,
    responses_tool_to_chat,
    text_format_to_response_format,
)
from nemo_gym.models.conversation_store import current_conversation
from nemo_gym.models.media import MediaLimits, media_kind, responses_part_to_chat
from nemo_gym.models.token_usage import chat_usage_to_responses, responses_usage_to_chat

TOKEN_ID_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
"""The per-call token-ID fields; a model call carries all three or none."""
ROUTED_EXPERTS_FIELD = "routed_experts"
"""A MoE engine's per-token expert routing, carried next to the token IDs when the engine gives it."""

_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_MESSAGE_ROLES = ("system", "developer", "user", "assistant")
_INPUT_ITEM_TYPES = ("message", "reasoning", "function_call", "function_call_output")
# Within one model call, items come in this order (reasoning, then text, then tool calls); an item
# ranking below its predecessor therefore starts a new call.
_CALL_ORDER = {"reasoning": 0, "message": 1, "function_call": 2}
FINISH_TO_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_INCOMPLETE_TO_FINISH = {reason: finish for finish, reason in FINISH_TO_INCOMPLETE.items()}


# --- Responses -> Chat Completions (requests)


def responses_to_chat_request(
    params: dict[str, Any],
    *,
    think_tags: bool = True,
    limit_mm_per_prompt: Mapping[str, int] | None = None,
    fold_system: bool = False,
    text_parts: bool = False,
) -> dict[str, Any]:
    """Convert Responses create-params into a Chat Completions request.

    Returns a new dict with ``messages`` and, when set, ``model``, ``tools``, ``tool_choice``,
    ``parallel_tool_calls``, ``temperature``, ``top_p``, ``max_tokens``, ``response_format`` and
    ``reasoning_effort``. Assistant messages rebuilt from items that carried token IDs get the
    :data:`TOKEN_ID_FIELDS` keys. ``metadata`` and other Responses-only fields are dropped.
    Image, file and video parts of user/system messages become Chat parts (see
    :mod:`nemo_gym.models.media`), at most ``limit_mm_per_prompt[kind]`` of each kind
    (:class:`~nemo_gym.models.media.MediaLimitError` past it). With ``fold_system``, the
    system/developer messages that open the input join ``instructions`` in one leading system
    message (many chat templates take a single system message, first). Chat-shaped input
    (``tool`` messages, assistant messages with ``tool_calls``) is taken as the Responses items it
    stands for. With ``text_parts``, content given as a list of parts (or a string ``input``) stays
    a list of chat text parts rather than joining into one string. Raises ``ValueError`` naming the
    offending item, part or tool (:class:`~nemo_gym.models.chat_tools.ConversionUnsupported` for
    what chat cannot express).
    """
    if "input" not in params or params["input"] is None:
        raise ValueError("Responses create-params have no 'input'; give a string or a list of items")
    messages: list[dict[str, Any]] = []
    if params.get("instructions"):
        messages.append({"role": "system", "content": params["instructions"]})
    raw_input = params["input"]
    if isinstance(raw_input, str):
        content: Any = [{"type": "text", "text": raw_input}] if text_parts else raw_input
        messages.append({"role": "user", "content": content})
    else:
        messages.extend(_converted_input(raw_input, think_tags, limit_mm_per_prompt, text_parts))
    if fold_system and params.get("instructions"):
        texts = [messages.pop(0)["content"]]
        while messages and messages[0]["role"] in ("system", "developer"):
            texts.append(_text_of(messages.pop(0)["content"], "leading system message"))
        messages.insert(0, {"role": "system", "content": "\n\n".join(texts)})

    request: dict[str, Any] = {"messages": messages}
    for key in ("model", "temperature", "top_p"):
        if params.get(key) is not None:
            request[key] = params[key]
    if params.get("max_output_tokens") is not None:
        request["max_tokens"] = params["max_output_tokens"]
    tool_choice = params.get("tool_choice")
    if params.get("tools"):
        request["tools"] = [responses_tool_to_chat(tool, i) for i, tool in enumerate(params["tools"])]
        if tool_choice is not None:
            request["tool_choice"] = responses_tool_choice_to_chat(tool_choice)
        if params.get("parallel_tool_calls") is not None:
            request["parallel_tool_calls"] = params["parallel_tool_calls"]
    elif needs_a_tool(tool_choice):
        # Passed on for the model server's edge (ChatBridge) or its engine to refuse, as NeMo Gym
        # 0.4.0's converter did: a folder's own server may fake its engine and take it.
        request["tool_choice"] = responses_tool_choice_to_chat(tool_choice)
    text_format = (params.get("text") or {}).get("format")
    response_format = text_format_to_response_format(text_format) if text_format else None
    if response_format is not None:
        request["response_format"] = response_format
    effort = (params.get("reasoning") or {}).get("effort")
    if effort is not None:
        request["reasoning_effort"] = effort
    return request


class _AssistantTurn:
    """The pieces of one model call, collected until the call's items end."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []
        self.token_fields: dict[str, Any] | None = None
        self.rank = 0

    def add(self, item: dict[str, Any], kind: str, where: str) -> None:
        self.rank = _CALL_ORDER[kind]
        # A call's namespace, or a message's phase, has no place in a chat message: refused, not dropped.
        for field in ("namespace", "phase"):
            if item.get(field) is not None:
                raise ConversionUnsupported(
                    f"{where} has a {field} ({item[field]!r}), which Chat Completions cannot hold"
                )
        if kind == "reasoning":
            self.reasoning.extend(_reasoning_texts(item))
        elif kind == "message":
            self.text.append(_text_of(item.get("content") or "", where))
        else:
            function = {"name": item["name"], "arguments": item["arguments"]}
            self.tool_calls.append({"id": item["call_id"], "type": "function", "function": function})
        token_fields = token_fields_of(item, where)
        if token_fields is not None:
            if self.token_fields is not None:
                raise ValueError(f"{where} carries a second model call's token IDs; split the calls first")
            self.token_fields = token_fields

    def to_message(self, think_tags: bool) -> dict[str, Any]:
        text = "".join(self.text)
        if think_tags:
            text = "".join(f"{_THINK_OPEN}{r}{_THINK_CLOSE}" for r in self.reasoning) + text
        # OpenAI rejects an assistant message with neither content nor tool calls.
        message: dict[str, Any] = {"role": "assistant", "content": text or (None if self.tool_calls else "")}
        if self.reasoning and not think_tags:
            message["reasoning_content"] = "\n".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.token_fields:
            message.update(self.token_fields)
        return message


def _input_items_to_messages(
    items: list[dict[str, Any]], think_tags: bool, media: MediaLimits, text_parts: bool = False
) -> list[dict[str, Any]]:
    messages = _ChatMessages(think_tags, media, text_parts)
    messages.feed(items)
    return messages.result()


class _ChatMessages:
    """Chat messages built from input items, resumable: :meth:`feed` more items later and
    :meth:`result` is what converting all the items at once gives (a kept conversation's
    next turn converts only its new items, see :func:`_converted_input`)."""

    def __init__(self, think_tags: bool, media: MediaLimits, text_parts: bool) -> None:
        self.think_tags, self.media, self.text_parts = think_tags, media, text_parts
        self.messages: list[dict[str, Any]] = []
        self.turn: _AssistantTurn | None = None
        self.items: list[dict[str, Any]] = []  # the items converted so far

    def feed(self, items: list[dict[str, Any]]) -> None:
        """Convert ``items``, the ones that follow those fed so far."""
        messages, think_tags, media, text_parts = self.messages, self.think_tags, self.media, self.text_parts
        turn = self.turn
        for index, item in _responses_items(items, len(self.items)):
            where = f"input item {index}"
            kind = _item_type(item, where)
            from_model = kind != "function_call_output" and (kind != "message" or item["role"] == "assistant")
            if turn is not None and (not from_model or _CALL_ORDER[kind] < turn.rank):
                messages.append(turn.to_message(think_tags))
                turn = None
            if kind == "function_call_output":
                # A tool may answer with images (a screenshot): they ride in the tool message as parts.
                content = _content_of(item["output"], where, media, text_parts)
                messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
            elif not from_model:
                messages.append(
                    {
                        "role": item["role"],
                        "content": _content_of(item.get("content") or "", where, media, text_parts),
                    }
                )
            else:
                turn = turn or _AssistantTurn()
                turn.add(item, kind, where)
                if turn.token_fields is not None:
                    # Token IDs ride on the last item of a call, so the call ends here.
                    messages.append(turn.to_message(think_tags))
                    turn = None
        self.turn = turn
        self.items.extend(items)

    def result(self) -> list[dict[str, Any]]:
        """The messages of every item fed (copies: a caller may change them)."""
        out = [dict(message) for message in self.messages]
        if self.turn is not None:
            out.append(self.turn.to_message(self.think_tags))
        return out


def _converted_input(
    items: list[dict[str, Any]],
    think_tags: bool,
    limit_mm_per_prompt: Mapping[str, int] | None,
    text_parts: bool,
) -> list[dict[str, Any]]:
    """The chat messages of ``items``. In a kept conversation (see
    :mod:`nemo_gym.models.conversation_store`) the messages of the items already converted on an
    earlier turn are reused when the request still starts with those very items, and only the
    items after them are converted."""
    conversation = current_conversation()
    if conversation is None:
        return _input_items_to_messages(items, think_tags, MediaLimits(limit_mm_per_prompt), text_parts)
    limits = ",".join(f"{kind}={n}" for kind, n in sorted((limit_mm_per_prompt or {}).items()))
    key = f"conversion.chat_messages:{think_tags}:{text_parts}:{limits}"
    built = conversation.derived.pop(key, None)
    done = len(built.items) if built is not None else 0
    if built is None or done > len(items) or not all(map(operator.is_, built.items, items[:done])):
        built, done = _ChatMessages(think_tags, MediaLimits(limit_mm_per_prompt), text_parts), 0
    built.feed(items[done:])  # a failure leaves nothing cached: the pop above dropped it
    conversation.derived[key] = built
    return built.result()


def _responses_items(items: list[dict[str, Any]], start: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, item)`` for each input item (numbered from ``start``), chat-shaped ones taken as
    their Responses items."""
    for index, item in enumerate(items, start):
        role = item.get("role") if item.get("type") in (None, "message") else None
        if role == "tool":
            output = item.get("content") or ""
            yield (
                index,
                {"type": "function_call_output", "call_id": item.get("tool_call_id"), "output": output},
            )
        elif role == "assistant" and item.get("tool_calls"):
            token_fields = {key: item[key] for key in TOKEN_ID_FIELDS if key in item}
            message = {k: v for k, v in item.items() if k != "tool_calls" and k not in token_fields}
            if message.get("content"):
                yield index, message
            calls = item["tool_calls"]
            for number, call in enumerate(calls):
                function = call["function"]
                yield (
                    index,
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": function["name"],
                        "arguments": function.get("arguments") or "{}",
                        **(token_fields if number == len(calls) - 1 else {}),
                    },
                )
        else:
            yield index, item


def _item_type(item: dict[str, Any], where: str) -> str:
    # NeMo Gym rows omit `type` on messages: a role alone marks a message.
    kind = item.get("type") or ("message" if item.get("role") else None)
    if kind not in _INPUT_ITEM_TYPES:
        raise ConversionUnsupported(
            f"{where} has unsupported type {kind!r} (no Chat Completions form; expected one of "
            f"{_INPUT_ITEM_TYPES}): send it to a model server that passes the Responses API through"
        )
    if kind == "message" and item.get("role") not in _MESSAGE_ROLES:
        raise ValueError(f"{where} has unsupported role {item.get('role')!r}; expected {_MESSAGE_ROLES}")
    return kind


def _reasoning_texts(item: dict[str, Any]) -> list[str]:
    # `content` holds the raw chain of thought when a producer kept it; `summary` is all that
    # OpenAI and NeMo Gym's vLLM adapter fill.
    parts = item.get("content") or item.get("summary") or []
    return [part["text"] for part in parts]


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where} has content of type {type(content).__name__}; expected str or parts")
    texts = []
    for part in content:
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            texts.append(part["text"])
        elif kind == "refusal":
            texts.append(part["refusal"])
        else:
            raise ValueError(f"{where} has a content part of type {kind!r}; only text parts convert")
    return "".join(texts)


def _content_of(content: Any, where: str, media: MediaLimits, text_parts: bool = False) -> Any:
    """A user/system message's content: its text, or Chat parts when it holds images, files or videos."""
    has_media = isinstance(content, list) and any(isinstance(p, dict) and media_kind(p) for p in content)
    if not isinstance(content, list) or not (has_media or text_parts):
        return _text_of(content, where)
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        part_where = f"{where} content[{index}]"
        kind = media_kind(part)
        if kind is None:
            parts.append({"type": "text", "text": _text_of([part], part_where)})
            continue
        media.add(kind, part_where)
        parts.append(responses_part_to_chat(part, part_where))
    return parts


def token_fields_of(source: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The :data:`TOKEN_ID_FIELDS` of ``source`` (None when it has none); ``ValueError`` on a partial set."""
    present = [key for key in TOKEN_ID_FIELDS if source.get(key) is not None]
    if not present:
        return None
    if len(present) < len(TOKEN_ID_FIELDS):
        missing = [key for key in TOKEN_ID_FIELDS if key not in present]
        raise ValueError(f"{where} carries {present} but not {missing}; send all three or none")
    return {key: source[key] for key in TOKEN_ID_FIELDS}


# --- Chat Completions -> Responses (responses)


def chat_completion_to_response(
    completion: dict[str, Any], *, request_params: dict[str, Any], think_tags: bool = True
) -> dict[str, Any]:
    """Convert a Chat Completions response into a Responses API response.

    ``request_params`` are the Responses create-params the call answered; ``tools``,
    ``tool_choice``, ``temperature``, ``top_p``, ``parallel_tool_calls``, ``max_output_tokens``,
    ``instructions`` and ``metadata`` are echoed from them. ``output`` holds, in order, a
    ``reasoning`` item (from ``reasoning_content`` and, with ``think_tags``, ``<think>`` blocks
    in the content), an assistant ``message`` (left out when its text is empty and another item
    exists) and one ``function_call`` per tool call. When the completion has vLLM token IDs, the
    last output item gets all of :data:`TOKEN_ID_FIELDS`. A ``length`` finish gives
    ``status: incomplete``. Raises ``ValueError`` on a completion with no choices or with
    inconsistent token IDs.
    """
    choices = completion.get("choices") or []
    if not choices:
        raise ValueError("chat completion has no choices; nothing to convert")
    choice = choices[0]
    output = assistant_message_to_items(choice["message"], think_tags)
    token_fields = _completiontoken_fields_of(completion, choice)
    if token_fields is not None:
        output[-1].update(token_fields)
    incomplete_reason = FINISH_TO_INCOMPLETE.get(choice.get("finish_reason") or "")
    return {
        "id": new_item_id("resp"),
        "object": "response",
        "created_at": float(completion.get("created") or time.time()),
        "status": "incomplete" if incomplete_reason else "completed",
        "error": None,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": request_params.get("instructions"),
        "metadata": request_params.get("metadata"),
        "model": completion.get("model") or request_params.get("model") or "",
        "output": output,
        # Required by the Response type: fall back to the Responses API's own defaults.
        "parallel_tool_calls": _default(request_params.get("parallel_tool_calls"), True),
        "tool_choice": _default(request_params.get("tool_choice"), "auto"),
        "tools": request_params.get("tools") or [],
        # Optional ones echo the request: the engine, not this API, chose any unset value.
        "temperature": request_params.get("temperature"),
        "top_p": request_params.get("top_p"),
        "max_output_tokens": request_params.get("max_output_tokens"),
        "usage": chat_usage_to_responses(completion.get("usage")),
    }


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def split_think_tags(content: str) -> tuple[list[str], str]:
    """Split ``<think>`` blocks out of assistant text; return ``(reasoning_texts, remaining_text)``.

    Whitespace is kept exactly so that tags and text join back to the original. Handles text
    whose ``<think>`` was opened by the chat template (only ``</think>`` appears) and a final
    block cut off before ``</think>`` (its text counts as reasoning, not as an answer).
    """
    texts: list[str] = []
    close, opening = content.find(_THINK_CLOSE), content.find(_THINK_OPEN)
    if close != -1 and (opening == -1 or close < opening):
        texts.append(content[:close])
        content = content[close + len(_THINK_CLOSE) :]
    if _THINK_OPEN in content:
        texts.extend(_THINK_BLOCK.findall(content))
        content = _THINK_BLOCK.sub("", content)
        opening = content.find(_THINK_OPEN)
        if opening != -1:
            texts.append(content[opening + len(_THINK_OPEN) :])
            content = content[:opening]
    return texts, content


def new_item_id(prefix: str) -> str:
    """A fresh id for a response object or item: ``<prefix>_<32 hex digits>``."""
    return f"{prefix}_{uuid4().hex}"


def assistant_message_to_items(
    message: dict[str, Any], think_tags: bool, new_id: Callable[[str], str] = new_item_id
) -> list[dict[str, Any]]:
    """The Responses output items for one assistant chat message, in call order.

    A ``reasoning`` item (from ``reasoning_content`` / ``reasoning`` and, with ``think_tags``,
    ``<think>`` blocks in the content), an assistant ``message`` (text and any ``refusal``; left
    out when empty and another item exists) and one ``function_call`` per tool call. Ids come
    from ``new_id(prefix)``. Token-ID fields on the message are not copied (see callers).
    """
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = _text_of(content, "assistant message")
    # vLLM's reasoning parsers fill `reasoning_content` (older) or `reasoning` (newer).
    separate = message.get("reasoning_content") or message.get("reasoning")
    reasoning = [separate] if separate else []
    if think_tags:
        tagged, content = split_think_tags(content)
        reasoning.extend(tagged)
    items: list[dict[str, Any]] = []
    if reasoning:
        summary = [{"type": "summary_text", "text": text} for text in reasoning]
        items.append({"id": new_id("rs"), "type": "reasoning", "summary": summary, "status": "completed"})
    tool_calls = message.get("tool_calls") or []
    refusal = message.get("refusal")
    # An empty message is left out when another item carries the call (NeMo Gym does the same).
    if content or refusal or not (items or tool_calls):
        parts: list[dict[str, Any]] = []
        if content or not refusal:
            parts.append({"type": "output_text", "text": content, "annotations": []})
        if refusal:
            parts.append({"type": "refusal", "refusal": str(refusal)})
        items.append(
            {
                "id": new_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": parts,
            }
        )
    for call in tool_calls:
        function = call["function"]
        items.append(
            {
                "id": new_id("fc"),
                "type": "function_call",
                "call_id": call.get("id") or new_id("call"),
                "name": function["name"],
                "arguments": function.get("arguments") or "{}",
                "status": "completed",
            }
        )
    return items


def _completiontoken_fields_of(completion: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any] | None:
    prompt_ids = completion.get("prompt_token_ids")
    if prompt_ids is None:
        prompt_ids = choice.get("prompt_token_ids")  # where vLLM before 0.10.2 put them
    generation_ids = choice.get("token_ids")
    if prompt_ids is None and generation_ids is None:
        return None
    if prompt_ids is None or generation_ids is None:
        raise ValueError(
            "chat completion has only one of prompt_token_ids / choices[0].token_ids; "
            "ask the engine for both with return_token_ids=true"
        )
    logprob_entries = (choice.get("logprobs") or {}).get("content")
    if logprob_entries is None:
        raise ValueError("chat completion has token IDs but no choices[0].logprobs; request logprobs")
    if len(logprob_entries) != len(generation_ids):
        raise ValueError(
            f"chat completion has {len(generation_ids)} generated token IDs but {len(logprob_entries)} logprobs"
        )
    fields = {
        "prompt_token_ids": prompt_ids,
        "generation_token_ids": generation_ids,
        "generation_log_probs": [entry["logprob"] for entry in logprob_entries],
    }
    # MoE engines that record expert routing (vLLM's enable_return_routed_experts) attach it to the
    # message; NeMo RL replays it as is, so it rides next to the token IDs untouched.
    routed = (choice.get("message") or {}).get(ROUTED_EXPERTS_FIELD, choice.get(ROUTED_EXPERTS_FIELD))
    if routed is not None:
        fields[ROUTED_EXPERTS_FIELD] = routed
    return fields


# --- The reverse direction: Chat Completions requests -> Responses, Responses -> Chat Completions


def chat_request_to_responses_params(
    chat_request: dict[str, Any], *, think_tags: bool = True, new_id: Callable[[str], str] = new_item_id
) -> dict[str, Any]:
    """Convert a Chat Completions request into Responses create-params.

    Each assistant message becomes ``reasoning`` / ``message`` / ``function_call`` items (token-ID
    fields on the message move onto the last of them), each ``tool`` message a
    ``function_call_output``, other messages keep their role. ``max_tokens`` (or
    ``max_completion_tokens``) becomes ``max_output_tokens``. Raises ``ValueError`` naming an
    unsupported message role. Text and image parts of user/system messages become Responses parts.
    """
    items: list[dict[str, Any]] = []
    for index, message in enumerate(chat_request.get("messages") or []):
        role, where = message.get("role"), f"message {index}"
        if role == "assistant":
            produced = assistant_message_to_items(message, think_tags, new_id)
            token_fields = token_fields_of(message, where)
            if token_fields is not None:
                produced[-1].update(token_fields)
            items.extend(produced)
        elif role == "tool":
            output = _text_of(message.get("content") or "", where)
            call_id = message["tool_call_id"]
            items.append({"type": "function_call_output", "call_id": call_id, "output": output})
        elif role in _MESSAGE_ROLES:
            content = _chat_content_to_responses(message.get("content") or "", where)
            items.append({"type": "message", "role": role, "content": content})
        else:
            raise ConversionUnsupported(
                f"{where} has unsupported role {role!r}; expected {_MESSAGE_ROLES} or tool"
            )

    params: dict[str, Any] = {"input": items}
    for key in ("model", "temperature", "top_p", "parallel_tool_calls"):
        if chat_request.get(key) is not None:
            params[key] = chat_request[key]
    max_tokens = _default(chat_request.get("max_completion_tokens"), chat_request.get("max_tokens"))
    if max_tokens is not None:
        params["max_output_tokens"] = max_tokens
    if chat_request.get("tools"):
        params["tools"] = [chat_tool_to_responses(tool, i) for i, tool in enumerate(chat_request["tools"])]
    if chat_request.get("tool_choice") is not None:
        params["tool_choice"] = chat_tool_choice_to_responses(chat_request["tool_choice"])
    if chat_request.get("response_format"):
        params["text"] = {"format": response_format_to_text_format(chat_request["response_format"])}
    if chat_request.get("reasoning_effort") is not None:
        params["reasoning"] = {"effort": chat_request["reasoning_effort"]}
    return params


def _chat_content_to_responses(content: Any, where: str) -> Any:
    if not isinstance(content, list) or not any(part.get("type") == "image_url" for part in content):
        return _text_of(content, where)
    parts = []
    for part in content:
        if part.get("type") == "image_url":
            image = part["image_url"]
            url, detail = (image, None) if isinstance(image, str) else (image.get("url"), image.get("detail"))
            parts.append({"type": "input_image", "image_url": url, "detail": detail or "auto"})
        else:
            parts.append({"type": "input_text", "text": _text_of([part], where)})
    return parts


def response_to_chat_completion(response: dict[str, Any], *, think_tags: bool = True) -> dict[str, Any]:
    """Convert a Responses API response into a Chat Completions response with one choice.

    The output items must come from model calls only (``reasoning``, assistant ``message``,
    ``function_call``); they become one assistant message. Token-ID fields become vLLM's
    ``prompt_token_ids``, ``choices[0].token_ids`` and ``choices[0].logprobs``. Raises
    ``ValueError`` naming an item a chat completion cannot hold, such as a
    ``function_call_output``, or token IDs from more than one model call.
    """
    turn = _AssistantTurn()
    for index, item in enumerate(response.get("output") or []):
        where = f"output item {index}"
        kind = _item_type(item, where)
        if kind == "function_call_output" or (kind == "message" and item["role"] != "assistant"):
            raise ValueError(
                f"{where} is a {kind} item; a chat completion holds only the model's own items "
                "(reasoning, assistant message, function_call)"
            )
        turn.add(item, kind, where)
    token_fields, turn.token_fields = turn.token_fields, None
    choice: dict[str, Any] = {
        "index": 0,
        "message": turn.to_message(think_tags),
        "finish_reason": _finish_reason(response, turn),
        "logprobs": None,
    }
    completion: dict[str, Any] = {
        "id": f"chatcmpl-{uuid4().hex}",
        "object": "chat.completion",
        "created": int(response.get("created_at") or time.time()),
        "model": response.get("model") or "",
        "choices": [choice],
    }
    if token_fields is not None:
        completion["prompt_token_ids"] = token_fields["prompt_token_ids"]
        choice["token_ids"] = token_fields["generation_token_ids"]
        pairs = zip(token_fields["generation_token_ids"], token_fields["generation_log_probs"], strict=True)
        # "token_id:<id>" is vLLM's spelling for a token reported by ID.
        entries = [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []} for t, lp in pairs
        ]
        choice["logprobs"] = {"content": entries}
    usage = responses_usage_to_chat(response.get("usage"))
    if usage is not None:
        completion["usage"] = usage
    return completion


def _finish_reason(response: dict[str, Any], turn: _AssistantTurn) -> str:
    if response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return _INCOMPLETE_TO_FINISH.get(reason or "", "length")
    return "tool_calls" if turn.tool_calls else "stop"


# --- Agents: one call's output becomes the next call's input


def response_output_to_input_items(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turn a model call's ``output`` items into input items for the next call.

    Returns new dicts with ``None``-valued keys dropped (strict Responses servers reject
    ``"id": null``); everything else, token-ID fields included, is kept unchanged. Raises
    ``ValueError`` naming an item whose type is not an input item this module understands.
    """
    items: list[dict[str, Any]] = []
    for index, item in enumerate(output):
        kind = _item_type(item, f"output item {index}")
        copied = {key: value for key, value in item.items() if value is not None}
        copied["type"] = kind
        if kind == "message" and isinstance(item.get("content"), list):
            copied["content"] = [{k: v for k, v in part.items() if v is not None} for part in item["content"]]
        items.append(copied)
    return items
