"""Chat completion chunks as they arrive: folded into a completion, and sent as Responses events.

:mod:`nemo_gym.models.streaming` turns a finished answer into OpenAI's events; :mod:`nemo_gym.serving.sse`
carries events in and out. This module is for answers that arrive as chat completion chunks
(vLLM's stream, the CPU engine's own):

- :class:`ChatCompletionAccumulator` folds the chunks into the completion they add up to
  (token IDs and logprobs included), so a stream ends with exactly the answer a non-streaming
  call would have given.
- :class:`ResponsesEventStream` sends Responses API events live from the chunks and, at the
  end, closes every item with the final response's content and sends that response (the
  authoritative one) in the last event.

Live text is split the way the final conversion splits it: ``<think>`` at the start of the
content opens a reasoning item, other text is the message. Text whose role is only known later
(a ``</think>`` closing a block that the chat template opened, a second ``<think>`` block) is
sent as it was classified at the time; the final event's response is right in every case.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.models.streaming import item_events
from nemo_gym.response_items import build_response
from nemo_gym.serving.sse import error_event

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_FINAL_TYPES = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}
_KIND_ORDER = {"reasoning": 0, "message": 1, "function_call": 2}


# ---- chat chunks folded into a completion ---------------------------------------------------
class ChatCompletionAccumulator:
    """Folds ``chat.completion.chunk`` objects into the ``chat.completion`` they add up to.

    Text deltas are joined, tool calls gathered by their ``index`` (arguments joined), logprob
    lists and vLLM's per-chunk ``token_ids`` concatenated; other fields keep their last value.
    """

    def __init__(self) -> None:
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        """Fold one chunk in."""
        for key, value in chunk.items():
            if key in ("choices", "object"):
                continue
            if value is not None or key not in self._head:
                self._head[key] = value
        for part in chunk.get("choices") or []:
            self._add_choice(part)

    def _add_choice(self, part: dict[str, Any]) -> None:
        index = part.get("index", 0)
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = {
                "index": index,
                "message": {"role": "assistant", "content": None},
                "logprobs": None,
                "finish_reason": None,
            }
        message = choice["message"]
        for key, value in (part.get("delta") or {}).items():
            if key == "tool_calls":
                _add_tool_calls(message, value or [])
            elif key == "role":
                message["role"] = value or message["role"]
            elif isinstance(value, str):
                message[key] = (message.get(key) or "") + value
            elif value is not None or key not in message:
                message[key] = value
        logprobs = part.get("logprobs")
        if isinstance(logprobs, dict):
            merged = choice["logprobs"] = choice["logprobs"] or {}
            for key, entries in logprobs.items():
                if isinstance(entries, list):
                    merged.setdefault(key, []).extend(entries)
                elif key not in merged:
                    merged[key] = entries
        for key, value in part.items():
            if key in ("index", "delta", "logprobs"):
                continue
            if key == "token_ids" and isinstance(value, list):
                choice.setdefault("token_ids", []).extend(value)
            elif value is not None or key not in choice:
                choice[key] = value

    def completion(self) -> dict[str, Any]:
        """The chat completion so far."""
        choices = [self._choices[index] for index in sorted(self._choices)]
        return {**self._head, "object": "chat.completion", "choices": choices}


def _add_tool_calls(message: dict[str, Any], deltas: list[Any]) -> None:
    calls = message.get("tool_calls") or []
    message["tool_calls"] = calls
    for delta in deltas:
        if not isinstance(delta, dict):
            continue
        index = delta.get("index", len(calls))
        while len(calls) <= index:
            calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        call = calls[index]
        call["id"] = delta.get("id") or call["id"]
        call["type"] = delta.get("type") or call["type"]
        function = delta.get("function") or {}
        call["function"]["name"] = function.get("name") or call["function"]["name"]
        call["function"]["arguments"] += function.get("arguments") or ""


# ---- Responses events from chat chunks ----------------------------------------------------
class ThinkSplitter:
    """Live split of assistant content into reasoning (a leading ``<think>`` block) and answer text.

    :meth:`feed` returns ``(kind, text)`` pieces, ``kind`` being ``reasoning`` or ``message``.
    Text that may still turn out to be a tag is held back; after a second ``<think>`` nothing
    more is given out (the end of the stream settles it).
    """

    def __init__(self) -> None:
        self._state = "start"
        self._pending = ""
        self._lead = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        """The pieces that ``text`` makes certain."""
        self._pending += text
        out: list[tuple[str, str]] = []
        while True:
            if self._state == "start":
                head = self._pending.lstrip()
                if THINK_OPEN.startswith(head):
                    return out  # empty or a partial "<think>": not decided yet
                if head.startswith(THINK_OPEN):
                    # Whitespace before the block stays with the answer, as the conversion keeps it.
                    self._lead = self._pending[: len(self._pending) - len(head)]
                    self._pending = head[len(THINK_OPEN) :]
                    self._state = "reasoning"
                else:
                    self._state = "message"
            elif self._state == "reasoning":
                end = self._pending.find(THINK_CLOSE)
                if end == -1:
                    return out + self._give("reasoning", THINK_CLOSE)
                if end:
                    out.append(("reasoning", self._pending[:end]))
                self._pending = self._lead + self._pending[end + len(THINK_CLOSE) :]
                self._lead = ""
                self._state = "message"
            elif self._state == "message":
                start = self._pending.find(THINK_OPEN)
                if start == -1:
                    return out + self._give("message", THINK_OPEN)
                if start:
                    out.append(("message", self._pending[:start]))
                self._pending = ""
                self._state = "held"
            else:
                self._pending = ""
                return out

    def _give(self, kind: str, tag: str) -> list[tuple[str, str]]:
        # All pending text but a tail that may be the start of ``tag``.
        keep = held_tail(self._pending, (tag,))
        ready = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(ready) :]
        return [(kind, ready)] if ready else []


def held_tail(text: str, patterns: tuple[str, ...] | list[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of one of ``patterns``."""
    longest = 0
    for pattern in patterns:
        for size in range(min(len(pattern) - 1, len(text)), longest, -1):
            if text.endswith(pattern[:size]):
                longest = size
                break
    return longest


@dataclass
class _LiveItem:
    index: int
    kind: str
    id: str
    text: str = ""
    name: str = ""
    call_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class ResponsesEventStream:
    """Responses API streaming events for an answer that arrives as chat completion chunks.

    :meth:`start` gives ``response.created`` and ``response.in_progress``; :meth:`feed` the
    events a chunk makes certain (reasoning and message text deltas, function calls as the
    engine's tool parser streams them); :meth:`finish` closes the items with the final
    response's content (sending any text held back) and ends with that response. Events are
    numbered in order.
    """

    def __init__(self, params: dict[str, Any], model: str) -> None:
        self.response = build_response([], params, model=model, status="in_progress")
        self._sequence = 0
        self._items: list[_LiveItem] = []
        self._calls: dict[int, _LiveItem] = {}
        self._splitter = ThinkSplitter()

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        """The events that open the stream."""
        return [
            self._event("response.created", response=dict(self.response)),
            self._event("response.in_progress", response=dict(self.response)),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events one chat completion chunk makes certain (only the first choice is followed)."""
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str) and delta[key]:
                    events += self._text("reasoning", delta[key])
            if isinstance(delta.get("content"), str) and delta["content"]:
                for kind, text in self._splitter.feed(delta["content"]):
                    events += self._text(kind, text)
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    events += self._call(call)
        return events

    def _may_open(self, kind: str) -> bool:
        # Output order is reasoning, message, function calls (as the conversion builds it).
        return not self._items or _KIND_ORDER[self._items[-1].kind] < _KIND_ORDER[kind]

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        live = self._items[-1] if self._items else None
        if live is None or live.kind != kind:
            if not self._may_open(kind):
                return events  # out of order: the end of the stream sends it
            live = _LiveItem(
                len(self._items), kind, f"{'rs' if kind == 'reasoning' else 'msg'}_{uuid.uuid4().hex}"
            )
            self._items.append(live)
            where = {"item_id": live.id, "output_index": live.index}
            if kind == "message":
                item = {
                    "id": live.id,
                    "type": "message",
                    "role": "assistant",
                    "status": "in_progress",
                    "content": [],
                }
                events.append(self._event("response.output_item.added", output_index=live.index, item=item))
                part = {"type": "output_text", "text": "", "annotations": []}
                events.append(self._event("response.content_part.added", **where, content_index=0, part=part))
            else:
                item = {"id": live.id, "type": "reasoning", "status": "in_progress", "summary": []}
                events.append(self._event("response.output_item.added", output_index=live.index, item=item))
                part = {"type": "summary_text", "text": ""}
                events.append(
                    self._event("response.reasoning_summary_part.added", **where, summary_index=0, part=part)
                )
        live.text += text
        events.append(self._delta(live, text))
        return events

    def _delta(self, live: _LiveItem, text: str) -> dict[str, Any]:
        where = {"item_id": live.id, "output_index": live.index}
        if live.kind == "message":
            return self._event(
                "response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]
            )
        if live.kind == "reasoning":
            return self._event("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text)
        return self._event("response.function_call_arguments.delta", **where, delta=text)

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        key = call.get("index", 0)
        function = call.get("function") or {}
        live = self._calls.get(key)
        if live is None:
            if not function.get("name") or not self._may_open("function_call"):
                return events
            live = _LiveItem(len(self._items), "function_call", f"fc_{uuid.uuid4().hex}")
            live.name = function["name"]
            live.call_id = call.get("id") or f"call_{uuid.uuid4().hex}"
            self._items.append(live)
            self._calls[key] = live
            item = {
                "id": live.id,
                "type": "function_call",
                "call_id": live.call_id,
                "name": live.name,
                "arguments": "",
                "status": "in_progress",
            }
            events.append(self._event("response.output_item.added", output_index=live.index, item=item))
        arguments = function.get("arguments") or ""
        if arguments:
            live.text += arguments
            events.append(self._delta(live, arguments))
        return events

    def finish(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """Close every item with ``response``'s content and end with ``response`` itself.

        ``response`` (the conversion of the whole completion) gets this stream's response id
        and the ids of the items sent live.
        """
        response["id"] = self.response["id"]
        response["created_at"] = self.response["created_at"]
        output = response.get("output") or []
        events: list[dict[str, Any]] = []
        matched = 0
        for live, item in zip(self._items, output, strict=False):
            if not _same_item(live, item):
                break
            item["id"] = live.id
            events += self._close(live, item)
            matched += 1
        for live in self._items[matched:]:
            events += self._close(live, None)
        for offset, item in enumerate(output[matched:]):
            for event in item_events(len(self._items) + offset, item):
                events.append({**event, "sequence_number": self._sequence})
                self._sequence += 1
        final = _FINAL_TYPES.get(str(response.get("status")), "response.completed")
        events.append(self._event(final, response=response))
        return events

    def fail(self, message: str, failure_class: str) -> list[dict[str, Any]]:
        """The event that ends a stream the engine broke off."""
        event = error_event(message, failure_class, self._sequence)
        self._sequence += 1
        return [event]

    def _close(self, live: _LiveItem, item: dict[str, Any] | None) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        where = {"item_id": live.id, "output_index": live.index}
        final_text = _item_text(item) if item is not None else live.text
        if final_text.startswith(live.text) and len(final_text) > len(live.text):
            events.append(self._delta(live, final_text[len(live.text) :]))
        if live.kind == "message":
            part = (
                (item.get("content") or [{}])[0]
                if item is not None
                else {"type": "output_text", "text": live.text, "annotations": []}
            )
            events.append(
                self._event(
                    "response.output_text.done", **where, content_index=0, text=final_text, logprobs=[]
                )
            )
            events.append(self._event("response.content_part.done", **where, content_index=0, part=part))
            done = item or {
                "id": live.id,
                "type": "message",
                "role": "assistant",
                "status": "incomplete",
                "content": [part],
            }
        elif live.kind == "reasoning":
            part = {"type": "summary_text", "text": final_text}
            events.append(
                self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=final_text)
            )
            events.append(
                self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=part)
            )
            for number, extra in enumerate((item or {}).get("summary", [])[1:], start=1):
                at = {**where, "summary_index": number}
                text = extra.get("text") or ""
                events.append(
                    self._event("response.reasoning_summary_part.added", **at, part={**extra, "text": ""})
                )
                events.append(self._event("response.reasoning_summary_text.delta", **at, delta=text))
                events.append(self._event("response.reasoning_summary_text.done", **at, text=text))
                events.append(self._event("response.reasoning_summary_part.done", **at, part=extra))
            done = item or {"id": live.id, "type": "reasoning", "status": "incomplete", "summary": [part]}
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done", **where, name=live.name, arguments=final_text
                )
            )
            done = item or {
                "id": live.id,
                "type": "function_call",
                "call_id": live.call_id,
                "name": live.name,
                "arguments": live.text,
                "status": "incomplete",
            }
        events.append(self._event("response.output_item.done", output_index=live.index, item=done))
        return events


def _item_text(item: dict[str, Any]) -> str:
    kind = item.get("type")
    if kind == "message":
        part = (item.get("content") or [{}])[0]
        return str(part.get("text") or "") if part.get("type") == "output_text" else ""
    if kind == "reasoning":
        summary = item.get("summary") or [{}]
        return str(summary[0].get("text") or "")
    if kind == "function_call":
        return str(item.get("arguments") or "")
    return ""


def _same_item(live: _LiveItem, item: dict[str, Any]) -> bool:
    if item.get("type") != live.kind or not _item_text(item).startswith(live.text):
        return False
    return live.kind != "function_call" or item.get("name") == live.name
