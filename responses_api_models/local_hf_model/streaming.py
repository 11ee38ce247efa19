"""The CPU engine's live stream: chat completion chunks made token by token as it generates.

:class:`LiveChat` runs on the generation thread. Each sampled token is detokenized
incrementally (a window of the last tokens, so a multi-byte character split over tokens waits
for its last byte), and the new text goes out at once as ``reasoning_content`` or ``content``
deltas, split the way the finished answer is parsed: a leading ``<think>`` block is reasoning;
text that may still become a ``<tool_call>`` (or a llama3 JSON call), a ``</think>``, or a stop
string is held back until it is certain. When generation ends, :meth:`LiveChat.closing_chunks`
sends whatever the final parse adds (held-back text, tool calls) and a last chunk with the
finish reason, logprobs and token IDs, so the chunks add up to the non-streaming answer.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from nemo_gym.base_responses_api_model import (
    THINK_CLOSE,
    THINK_OPEN,
    EventStreamResponse,
    HTTPError,
    ResponsesEventStream,
    error_event,
    held_tail,
    is_context_length_error,
    sse_bytes,
    stream_responses,
    without_stream,
)

if TYPE_CHECKING:
    from responses_api_models.local_hf_model.app import ChatRequest, LocalHFModel

logger = logging.getLogger(__name__)

_TOOL_CALL_OPEN = "<tool_call>"
_CHOICE_FIELDS = frozenset({"index", "message", "finish_reason", "logprobs"})
_COMPLETION_FIELDS = frozenset({"id", "object", "created", "model", "choices", "usage"})


class LiveChat:
    """Chat completion chunks for one generation, emitted through ``emit`` as tokens arrive."""

    def __init__(self, request: ChatRequest, emit: Callable[[dict[str, Any]], None]) -> None:
        self.lm = request.lm
        self.emit = emit
        self.head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": request.server.served_model_name,
        }
        self.reasoning_parser = request.config.reasoning_parser
        self.tool_parser = request.config.tool_call_parser if request.parse_tools else "none"
        self.stop_strings = list(request.stop_strings)
        self.skip_ids: set[int] = set()
        self.sent = {"reasoning_content": "", "content": ""}
        self.first_delta_at: float | None = None
        self._ids: list[int] = []
        self._prefix = self._read = 0
        self._pending = ""
        self._state = "start"

    # ---- on the generation thread --------------------------------------------------------
    def on_token(self, token_id: int) -> None:
        """Take one sampled token; emit the text it makes certain."""
        if token_id in self.skip_ids:
            return  # a stop token ends the text, it is not part of it
        self._ids.append(token_id)
        # Decoding from one token before the newest finished text keeps the joiners (spaces)
        # that a tokenizer adds between tokens.
        before = self.lm.decode(self._ids[self._prefix : self._read])
        after = self.lm.decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return  # an incomplete character: wait for its next byte
        self._pending += after[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        self._advance()

    def _advance(self) -> None:
        while True:
            if self._state == "start":
                head = self._pending.lstrip()
                if self.reasoning_parser and THINK_OPEN.startswith(head):
                    return  # maybe the start of "<think>"
                if self.reasoning_parser and head.startswith(THINK_OPEN):
                    self._pending = head[len(THINK_OPEN) :]
                    self._state = "reasoning"
                else:
                    self._state = "content"
            elif self._state == "reasoning":
                end = self._pending.find(THINK_CLOSE)
                if end == -1:
                    self._give("reasoning_content", (THINK_CLOSE,))
                    return
                rest = self._pending[end + len(THINK_CLOSE) :]
                self._pending = self._pending[:end]
                if not self._give("reasoning_content", (), everything=True):
                    return
                self._pending = rest
                self._state = "content"
            elif self._state == "content":
                if self.tool_parser == "llama3_json" and not self.sent["content"]:
                    stripped = self._pending.lstrip()
                    if not stripped:
                        return
                    if stripped.startswith("{"):
                        self._state = "held"  # the whole answer may be a call
                        return
                if self.tool_parser == "hermes":
                    start = self._pending.find(_TOOL_CALL_OPEN)
                    if start != -1:
                        self._pending = self._pending[:start]
                        self._give("content", (), everything=True)
                        self._state = "held"  # calls are parsed once complete
                        return
                tags = (_TOOL_CALL_OPEN,) if self.tool_parser == "hermes" else ()
                self._give("content", tags)
                return
            else:
                return

    def _give(self, channel: str, tags: tuple[str, ...], everything: bool = False) -> bool:
        """Emit pending text on ``channel`` but a tail that may begin a tag or a stop string.

        Returns False when a stop string was found: the text ends there (held from then on).
        """
        pending = self._pending
        stops = [(pending.find(stop), stop) for stop in self.stop_strings if stop in pending]
        stopped = bool(stops)
        if stopped:
            pending = pending[: min(stops)[0]]
            keep = 0
        else:
            keep = 0 if everything else held_tail(pending, [*tags, *self.stop_strings])
        ready = pending[: len(pending) - keep]
        self._pending = "" if stopped else pending[len(ready) :]
        if stopped:
            self._state = "held"
        if ready:
            self._emit_delta({channel: ready})
            self.sent[channel] += ready
        return not stopped

    def _emit_delta(self, delta: dict[str, Any]) -> None:
        if self.first_delta_at is None:
            self.first_delta_at = time.monotonic()
        self.emit(self.chunk(delta))

    # ---- chunks --------------------------------------------------------------------------
    def chunk(self, delta: dict[str, Any], **choice: Any) -> dict[str, Any]:
        """A chunk of this stream with ``delta`` for choice 0."""
        fields = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **choice}
        return {**self.head, "choices": [fields]}

    def role_chunk(self) -> dict[str, Any]:
        """The first chunk: the assistant role, sent before generation starts."""
        return self.chunk({"role": "assistant", "content": ""})

    def closing_chunks(self, completion: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
        """What the finished ``completion`` adds to the chunks sent: text held back, tool calls,
        the finish reason with logprobs and token IDs, and the usage chunk when asked for."""
        choice = completion["choices"][0]
        message = choice["message"]
        chunks = []
        for channel in ("reasoning_content", "content"):
            final, sent = message.get(channel) or "", self.sent[channel]
            if final.startswith(sent) and len(final) > len(sent):
                chunks.append(self.chunk({channel: final[len(sent) :]}))
        for index, call in enumerate(message.get("tool_calls") or []):
            delta_call = {
                "index": index,
                "id": call["id"],
                "type": call["type"],
                "function": call["function"],
            }
            chunks.append(self.chunk({"tool_calls": [delta_call]}))
        extras = {key: value for key, value in choice.items() if key not in _CHOICE_FIELDS}
        last = self.chunk({}, finish_reason=choice["finish_reason"], logprobs=choice["logprobs"], **extras)
        last.update({key: value for key, value in completion.items() if key not in _COMPLETION_FIELDS})
        chunks.append(last)
        if include_usage:
            chunks.append({**self.head, "choices": [], "usage": completion.get("usage")})
        return chunks


# ---- the routes' streams ------------------------------------------------------------------
async def stream_chat_completion_live(server: LocalHFModel, body: dict[str, Any]) -> Response:
    """``/v1/chat/completions`` with ``stream: true``: chunks sent as the tokens are generated."""
    from responses_api_models.local_hf_model.app import ChatRequest

    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    request = ChatRequest(without_stream(body), server)
    live, items, cancel = await start_generation(server, request)

    async def events() -> AsyncIterator[bytes]:
        yield sse_bytes(live.role_chunk(), named=False)
        async for batch in items:
            out = []
            for kind, value in batch:
                if kind == "chunk":
                    out.append(sse_bytes(value, named=False))
                elif kind == "done":
                    out += [
                        sse_bytes(chunk, named=False) for chunk in live.closing_chunks(value, include_usage)
                    ]
                    out.append(b"data: [DONE]\n\n")
                else:
                    error = error_event(f"generation failed: {value}", "server_error")
                    out.append(sse_bytes(error, named=False))
            yield b"".join(out)

    return EventStreamResponse(events(), cancel)


async def stream_responses_live(server: LocalHFModel, body: dict[str, Any]) -> Response:
    """``/v1/responses`` with ``stream: true``: events sent as the tokens are generated, the last
    one carrying the response converted from the whole completion (as without streaming)."""
    from responses_api_models.local_hf_model.app import ChatRequest

    params = without_stream(body)
    request = ChatRequest(server.bridge.chat_request(params), server)
    try:
        live, items, cancel = await start_generation(server, request)
    except HTTPError as exc:
        if is_context_length_error(exc.status_code, exc.message):
            return stream_responses(server.bridge.context_exceeded_response(params, exc.message))
        raise
    stream = ResponsesEventStream(params, model=server.served_model_name)

    async def events() -> AsyncIterator[bytes]:
        yield b"".join(sse_bytes(event, named=True) for event in stream.start())
        async for batch in items:
            out = []
            for kind, value in batch:
                if kind == "chunk":
                    out += stream.feed(value)
                elif kind == "done":
                    for chunk in live.closing_chunks(value, include_usage=False):
                        out += stream.feed(chunk)
                    out += stream.finish(server.bridge.response(value, params))
                else:
                    out += stream.fail(f"generation failed: {value}", "server_error")
            if out:
                yield b"".join(sse_bytes(event, named=True) for event in out)

    return EventStreamResponse(events(), cancel)


async def start_generation(
    server: LocalHFModel, request: ChatRequest
) -> tuple[LiveChat, AsyncIterator[list[tuple[str, Any]]], Callable[[], None]]:
    """Prepare ``request`` (its errors raised here, before any event) and start generating it.

    Returns the live chunk maker, the items the generation thread sends in batches (all that
    arrived since the last batch: ``("chunk", c)`` as tokens arrive, then ``("done",
    completion)`` or ``("error", text)``), and the function that stops the generation (for a
    client that went away).
    """
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(server.executor, request.prepare)
    channel = ThreadToLoop(loop)
    cancelled = threading.Event()

    def put(item: tuple[str, Any]) -> None:
        if not channel.put(item):
            cancelled.set()  # the server's loop is gone: nobody reads this any more

    live = LiveChat(request, lambda chunk: put(("chunk", chunk)))
    live.skip_ids = request.stop_ids

    def work() -> None:
        if cancelled.is_set():
            put(("error", "cancelled"))
            return
        try:
            put(("done", request.generate(on_token=live.on_token, cancelled=cancelled)))
        except Exception as exc:  # noqa: BLE001 - sent to the client as the stream's error event
            logger.exception("streamed generation failed")
            put(("error", f"{type(exc).__name__}: {exc}"))

    server.requests_served += 1
    loop.run_in_executor(server.executor, work)

    async def batches() -> AsyncIterator[list[tuple[str, Any]]]:
        while True:
            batch = await channel.get_all()
            yield batch
            if batch[-1][0] != "chunk":
                return

    return live, batches(), cancelled.set


class ThreadToLoop:
    """Items from one producer thread to a coroutine on ``loop``, woken once per batch.

    The thread's :meth:`put` wakes the loop only when the reader is not already due to run, so a
    fast generator costs one wake-up (a write to the loop's self-pipe) per batch of tokens the
    loop takes at once, not one per token.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._wake_due = False
        self._ready = asyncio.Event()

    def put(self, item: Any) -> bool:
        """Add ``item`` (from the producer thread); False when the loop is closed."""
        with self._lock:
            self._items.append(item)
            if self._wake_due:
                return True
            self._wake_due = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            return False
        return True

    def _wake(self) -> None:
        with self._lock:
            self._wake_due = False
        self._ready.set()

    async def get_all(self) -> list[Any]:
        """Every item put so far and not yet taken (waits for at least one)."""
        while True:
            with self._lock:
                if self._items:
                    items = list(self._items)
                    self._items.clear()
                    return items
                self._ready.clear()
            await self._ready.wait()
