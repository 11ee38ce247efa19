"""``stream=true`` for every model server: OpenAI's streaming events, as server-sent events.

For a model server that computes its answer as one object (a Responses ``response`` or a
``chat.completion``), :func:`response_events` and :func:`chat_completion_chunks` turn that
object into the event sequence OpenAI's API sends for the same answer, and :func:`sse_response`
sends it: the events arrive once the answer is complete. Servers whose engine produces the
answer in pieces (the CPU engine, vLLM, OpenAI) send events as they are produced instead, with
:mod:`nemo_gym.models.chat_stream`. Token IDs, logprobs and any other engine fields ride in the final event
(``response.completed`` carries the whole response; the last chat chunk carries the choice's
``token_ids``, ``logprobs`` and the completion's ``prompt_token_ids``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from starlette.responses import Response

_WORDS = re.compile(r"\S+\s*|\s+")
_WORDS_PER_DELTA = 4
# The chat completion's own fields; any other field (vLLM's prompt_token_ids, ...) goes on the last chunk.
_CHAT_FIELDS = frozenset({"id", "object", "created", "model", "choices", "usage", "system_fingerprint"})
_CHOICE_FIELDS = frozenset({"index", "message", "finish_reason", "logprobs"})
_FINAL_EVENT = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}


# A comment line that keeps an idle event stream open (a keep-alive is not the first token).
SSE_KEEPALIVE = b": keep-alive\n\n"


def text_pieces(text: str) -> list[str]:
    """``text`` cut into deltas of a few words each (at least one piece, even for '')."""
    words = _WORDS.findall(text)
    pieces = ["".join(words[i : i + _WORDS_PER_DELTA]) for i in range(0, len(words), _WORDS_PER_DELTA)]
    return pieces or [""]


def response_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The Responses API streaming events for a finished ``response`` object, numbered in order."""
    events: list[dict[str, Any]] = []
    start = {**response, "status": "in_progress", "output": [], "usage": None}
    events.append({"type": "response.created", "response": start})
    events.append({"type": "response.in_progress", "response": start})
    for index, item in enumerate(response.get("output") or []):
        events += item_events(index, item)
    final = _FINAL_EVENT.get(str(response.get("status")), "response.completed")
    events.append({"type": final, "response": response})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def item_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The events that announce, fill and finish one output ``item`` (without sequence numbers)."""
    kind = item.get("type", "message")
    item_id = item.get("id") or f"item_{index}"
    where = {"item_id": item_id, "output_index": index}
    if kind == "message":
        yield _added(index, {**_pending(item), "content": []})
        for part_index, part in enumerate(item.get("content") or []):
            at = {**where, "content_index": part_index}
            empty = {**part, "text": ""} if part.get("type") == "output_text" else {**part, "refusal": ""}
            yield {"type": "response.content_part.added", **at, "part": empty}
            if part.get("type") == "output_text":
                text = part.get("text") or ""
                for piece in text_pieces(text):
                    yield {"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []}
                yield {"type": "response.output_text.done", **at, "text": text, "logprobs": []}
            elif part.get("type") == "refusal":
                refusal = part.get("refusal") or ""
                yield {"type": "response.refusal.delta", **at, "delta": refusal}
                yield {"type": "response.refusal.done", **at, "refusal": refusal}
            yield {"type": "response.content_part.done", **at, "part": part}
    elif kind == "function_call":
        yield _added(index, {**_pending(item), "arguments": ""})
        arguments = item.get("arguments") or ""
        yield {"type": "response.function_call_arguments.delta", **where, "delta": arguments}
        yield {
            "type": "response.function_call_arguments.done",
            **where,
            "name": item.get("name"),
            "arguments": arguments,
        }
    elif kind == "reasoning":
        yield _added(index, {**_pending(item), "summary": []})
        for summary_index, part in enumerate(item.get("summary") or []):
            at = {**where, "summary_index": summary_index}
            text = part.get("text") or ""
            yield {"type": "response.reasoning_summary_part.added", **at, "part": {**part, "text": ""}}
            for piece in text_pieces(text):
                yield {"type": "response.reasoning_summary_text.delta", **at, "delta": piece}
            yield {"type": "response.reasoning_summary_text.done", **at, "text": text}
            yield {"type": "response.reasoning_summary_part.done", **at, "part": part}
    else:
        yield _added(index, item)
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def _pending(item: dict[str, Any]) -> dict[str, Any]:
    """The item as first announced: in progress, without its content or engine fields."""
    return {
        key: value
        for key, value in item.items()
        if key in ("id", "type", "role", "name", "call_id", "status", "encrypted_content")
    } | {"status": "in_progress"}


def _added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def chat_completion_chunks(completion: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects for a finished chat completion.

    Per choice: a chunk with the role, the reasoning and content text in deltas, one chunk per
    tool call, and a last chunk with the finish reason, the choice's logprobs and engine fields
    (``token_ids``). Engine fields of the completion itself (``prompt_token_ids``) go on the
    very last chunk, and a usage chunk (no choices) follows when ``include_usage``.
    """
    head = {
        "id": completion.get("id"),
        "object": "chat.completion.chunk",
        "created": completion.get("created"),
        "model": completion.get("model"),
    }
    if completion.get("system_fingerprint") is not None:
        head["system_fingerprint"] = completion["system_fingerprint"]

    def chunk(index: int, delta: dict[str, Any], **choice: Any) -> dict[str, Any]:
        return {
            **head,
            "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None, **choice}],
        }

    chunks: list[dict[str, Any]] = []
    for choice in completion.get("choices") or []:
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        chunks.append(chunk(index, {"role": message.get("role") or "assistant", "content": ""}))
        for key in ("reasoning_content", "reasoning"):
            if isinstance(message.get(key), str) and message[key]:
                chunks += [chunk(index, {key: piece}) for piece in text_pieces(message[key])]
                break
        if isinstance(message.get("content"), str) and message["content"]:
            chunks += [chunk(index, {"content": piece}) for piece in text_pieces(message["content"])]
        if message.get("refusal"):
            chunks.append(chunk(index, {"refusal": message["refusal"]}))
        for call_index, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            delta_call = {
                "index": call_index,
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {"name": function.get("name"), "arguments": function.get("arguments") or ""},
            }
            chunks.append(chunk(index, {"tool_calls": [delta_call]}))
        extras = {key: value for key, value in choice.items() if key not in _CHOICE_FIELDS}
        chunks.append(
            chunk(
                index,
                {},
                finish_reason=choice.get("finish_reason") or "stop",
                logprobs=choice.get("logprobs"),
                **extras,
            )
        )
    extras = {key: value for key, value in completion.items() if key not in _CHAT_FIELDS}
    if extras and chunks:
        chunks[-1].update(extras)
    if include_usage:
        chunks.append({**head, "choices": [], "usage": completion.get("usage")})
    return chunks


def sse_body(events: Iterable[dict[str, Any]], named: bool, done_marker: bool) -> bytes:
    """Server-sent events: ``event: <type>`` lines when ``named``, ``data: [DONE]`` at the end if asked."""
    parts = []
    for event in events:
        name = f"event: {event['type']}\n".encode() if named else b""
        parts.append(name + b"data: " + orjson.dumps(event, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n")
    if done_marker:
        parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def sse_response(body: bytes) -> Response:
    """An ``text/event-stream`` answer holding the whole event stream."""
    return Response(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def stream_responses(response: dict[str, Any]) -> Response:
    """A finished Responses object as OpenAI's Responses streaming events."""
    return sse_response(sse_body(response_events(response), named=True, done_marker=False))


def stream_chat_completion(completion: dict[str, Any], include_usage: bool) -> Response:
    """A finished chat completion as ``chat.completion.chunk`` events ending in ``data: [DONE]``."""
    return sse_response(
        sse_body(chat_completion_chunks(completion, include_usage), named=False, done_marker=True)
    )
