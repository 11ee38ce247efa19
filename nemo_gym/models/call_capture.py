"""Capture of a model server's calls, per rollout: the ASGI middleware NeMo Gym's model servers carry.

A caller correlates a model call with a rollout by prefixing its path with ``/ng-rollout/<id>``
(``/ng-rollout/<id>/training-token-capture`` asks for training-token capture too). The
middleware always strips that prefix and makes the id the request's rollout; with a
:class:`~nemo_gym.models.call_records.CaptureStore` it also keeps a copy of the request and the
answer of ``/v1/responses``, ``/v1/chat/completions`` and ``/v1/messages`` and appends one
exchange per call (failures included). Answers pass through unchanged as they are produced
(event streams included); only the last event of a stream, or the last piece of a JSON answer,
is held until the exchange is on disk, so a client that saw the answer end can read its record.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym.models.call_records import CaptureStore, exchange_for, store_exchange
from nemo_gym.models.streaming import SSE_KEEPALIVE
from nemo_gym.serving.protocol import ROLLOUT_PATH_SEGMENT, TOKEN_CAPTURE_PATH_SEGMENT
from nemo_gym.serving.request_context import _current_rollout_id

logger = logging.getLogger(__name__)

# The routes whose calls are captured, and the dialect each speaks.
OBSERVED_PATHS = {"/v1/responses": "responses", "/v1/chat/completions": "chat", "/v1/messages": "messages"}
# A client may name its own session (an agent harness's id) so its calls can be joined to it.
CLIENT_SESSION_HEADER = b"x-session-id"
EXECUTION_STATE_KEY = "nemo_gym_model_execution"

_PREFIX = re.compile(
    rf"^/{re.escape(ROLLOUT_PATH_SEGMENT)}/(?P<rollout_id>[^/]+)"
    rf"(?P<token_capture>/{re.escape(TOKEN_CAPTURE_PATH_SEGMENT)})?(?P<rest>/.*)$"
)
# The event lines that end a stream in each dialect, and how it ended.
_STREAM_ENDS: dict[str, dict[bytes, str]] = {
    "responses": {
        b"event: response.completed": "complete",
        b"event: response.incomplete": "incomplete",
        b"event: response.failed": "error",
        b"event: error": "error",
    },
    "chat": {b"data: [DONE]": "complete", b"event: error": "error"},
    "messages": {b"event: message_stop": "complete", b"event: error": "error"},
}


def split_rollout_prefix(path: str) -> tuple[str | None, bool, str]:
    """``(rollout id or None, token capture asked for, path without the prefix)``."""
    match = _PREFIX.match(path)
    if match is None:
        return None, False, path
    return match["rollout_id"], match["token_capture"] is not None, match["rest"]


def error_category_for_status(status: int) -> str | None:
    """The capture record's ``error_category`` of an HTTP status (None for a success).

    NeMo Gym's model-call capture vocabulary, not a rollout's failure class (:mod:`nemo_gym.failure_classes`).
    """
    if status < 400:
        return None
    named = {408: "timeout", 504: "timeout", 429: "rate_limit", 401: "auth", 403: "auth", 404: "not_found"}
    return named.get(status, "client_error" if status < 500 else "upstream_error")


def error_category_for_exception(exc: BaseException) -> str:
    """The capture record's ``error_category`` of an exception raised while a call was served."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    name = type(exc).__name__.lower()
    if isinstance(exc, TimeoutError) or "timeout" in name:
        return "timeout"
    return "connection" if "conn" in name else "exception"


def _exception_status_and_body(exc: BaseException) -> tuple[int | None, bytes]:
    """The HTTP status and body an exception carries (aiohttp's, httpx's and openai's errors do)."""

    def attr(obj: Any, name: str) -> Any:
        try:
            return getattr(obj, name, None)
        except Exception:  # noqa: BLE001 - a property of a broken response may raise anything
            return None

    response = attr(exc, "response")
    status = next(
        (
            s
            for s in (attr(exc, "status"), attr(exc, "status_code"), attr(response, "status_code"))
            if isinstance(s, int)
        ),
        None,
    )
    body = attr(exc, "response_content")
    if body is None and response is not None:
        body = attr(response, "content")
        if body is None:
            body = attr(response, "text")
    if isinstance(body, str):
        body = body.encode()
    return status, bytes(body) if isinstance(body, bytes | bytearray) else b""


# ---- rebuilding an answer from its event stream ---------------------------------------------
def sse_payloads(raw: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a stream's ``data:`` fields (``[DONE]`` and non-JSON skipped)."""
    payloads = []
    for block in re.split(r"\r?\n\r?\n", raw.decode("utf-8", errors="replace")):
        data = "\n".join(line[5:].lstrip() for line in block.splitlines() if line.startswith("data:"))
        if not data or data == "[DONE]":
            continue
        try:
            payload = json.loads(data)
        except ValueError:
            continue
        if isinstance(payload, dict):
            payloads.append(payload)
    return payloads


def _responses_from_events(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    # The final event of a Responses stream carries the whole response object.
    terminal = ("response.completed", "response.incomplete", "response.failed")
    ordered = [e for e in reversed(events) if e.get("type") in terminal] + list(reversed(events))
    return next((e["response"] for e in ordered if isinstance(e.get("response"), dict)), None)


def _chat_from_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any] | None:
    text: list[str] = []
    reasoning: list[str] = []
    refusal: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    head: dict[str, Any] = {
        "role": "assistant",
        "finish_reason": None,
        "model": None,
        "id": None,
        "usage": None,
    }
    any_choice = False
    for chunk in chunks:
        head["model"] = chunk.get("model") or head["model"]
        if isinstance(chunk.get("id"), str):
            head["id"] = chunk["id"]
        head["usage"] = chunk.get("usage") or head["usage"]
        for choice in (c for c in chunk.get("choices") or [] if isinstance(c, dict)):
            any_choice = True
            delta = choice.get("delta") or {}
            head["role"] = delta.get("role") or head["role"]
            text += [delta["content"]] if delta.get("content") else []
            refusal += [delta["refusal"]] if delta.get("refusal") else []
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            reasoning += [thought] if thought else []
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    piece.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = piece.get("id") or call["id"]
                function = piece.get("function") or {}
                call["function"]["name"] = function.get("name") or call["function"]["name"]
                call["function"]["arguments"] += function.get("arguments") or ""
            head["finish_reason"] = choice.get("finish_reason") or head["finish_reason"]
    if not any_choice:
        return None
    message: dict[str, Any] = {"role": head["role"], "content": "".join(text) or None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if refusal:
        message["refusal"] = "".join(refusal)
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    rebuilt: dict[str, Any] = {
        "object": "chat.completion",
        "model": head["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": head["finish_reason"]}],
    }
    if head["id"] is not None:
        rebuilt["id"] = head["id"]
    if head["usage"]:
        rebuilt["usage"] = head["usage"]
    return rebuilt


def _anthropic_from_events(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, str] = {}
    usage: dict[str, Any] = {}
    for event in events:
        kind = event.get("type")
        if kind == "message_start":
            start = event.get("message") or {}
            message = {
                k: start[k]
                for k in ("id", "type", "role", "model", "stop_reason")
                if start.get(k) is not None
            }
            usage.update(start.get("usage") or {})
        elif kind == "content_block_start":
            blocks[event.get("index", len(blocks))] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            index = event.get("index", 0)
            block = blocks.setdefault(index, {})
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                block.setdefault("type", "text")
                block["text"] = (block.get("text") or "") + (delta.get("text") or "")
            elif delta.get("type") == "thinking_delta":
                block.setdefault("type", "thinking")
                block["thinking"] = (block.get("thinking") or "") + (delta.get("thinking") or "")
            elif delta.get("type") == "input_json_delta":
                partial_json[index] = partial_json.get(index, "") + (delta.get("partial_json") or "")
        elif kind == "message_delta":
            usage.update(event.get("usage") or {})
            stop = (event.get("delta") or {}).get("stop_reason")
            if message is not None and stop:
                message["stop_reason"] = stop
    if message is None and not blocks:
        return None
    for index, block in blocks.items():
        if block.get("type") == "tool_use" and index in partial_json and not block.get("input"):
            try:
                block["input"] = json.loads(partial_json[index]) if partial_json[index] else {}
            except ValueError:
                block["input"] = {"_raw": partial_json[index]}
    rebuilt: dict[str, Any] = {
        **(message or {}),
        "type": "message",
        "content": [blocks[i] for i in sorted(blocks)],
    }
    if usage:
        rebuilt["usage"] = usage
    return rebuilt


def reconstruct_streamed_response(raw: bytes, dialect: str) -> dict[str, Any] | None:
    """The whole answer a stream of ``dialect`` (``responses``, ``chat``, ``messages``) carried."""
    events = sse_payloads(raw)
    if not events:
        return None
    if dialect == "messages":
        return _anthropic_from_events(events)
    if dialect == "responses":
        return _responses_from_events(events)
    return _chat_from_chunks(events)


def _stream_end(pending: bytearray, dialect: str) -> str | None:
    """How the stream ended, if a complete event in ``pending`` ends it (consumed events dropped)."""
    *blocks, rest = re.split(rb"\r?\n\r?\n", bytes(pending))
    pending[:] = rest
    ends = _STREAM_ENDS[dialect]
    for block in blocks:
        lines = block.splitlines()
        for line in lines:
            field, colon, value = line.partition(b":")
            normalized = field + b": " + value.lstrip() if colon else line
            if normalized in ends:
                return ends[normalized]
        if dialect == "chat":  # a chunk carrying an error object ends it too
            for line in (ln for ln in lines if ln.startswith(b"data:")):
                try:
                    payload = json.loads(line[5:].lstrip())
                except ValueError:
                    continue
                if isinstance(payload, dict) and payload.get("error") is not None:
                    return "error"
    return None


def _header(headers: Any, name: bytes) -> bytes:
    return next((v for k, v in headers or [] if k.lower() == name), b"")


def _single_header(headers: Any, name: bytes) -> str | None:
    values = {v.decode("latin-1") for k, v in headers or [] if k.lower() == name and v}
    return values.pop() if len(values) == 1 else None


class CaptureMiddleware:
    """ASGI middleware: strip ``/ng-rollout/<id>``, and record that rollout's model calls in ``store``.

    ``store`` None: only the prefix is handled (the id is still the request's rollout).
    """

    def __init__(
        self, app: ASGIApp, *, store: CaptureStore | None, model_server_name: str | None = None
    ) -> None:
        self.app = app
        self.store = store
        self.model_server_name = model_server_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rollout_id, _, path = split_rollout_prefix(scope.get("path", ""))
        if rollout_id is None:
            # Served by a nemo_gym process, the outer StripRolloutPrefix took the prefix (and a
            # token-capture segment) off already and kept the id.
            rollout_id = _current_rollout_id.get()
        if path != scope.get("path"):
            scope = {**scope, "path": path, "raw_path": path.encode()}
        dialect = OBSERVED_PATHS.get(path)
        token = _current_rollout_id.set(rollout_id)
        try:
            if self.store is None or rollout_id is None or dialect is None:
                await self.app(scope, receive, send)
            else:
                await self._capture(scope, receive, send, rollout_id, dialect, self.store)
        finally:
            _current_rollout_id.reset(token)

    async def _capture(
        self, scope: Scope, receive: Receive, send: Send, rollout_id: str, dialect: str, store: CaptureStore
    ) -> None:
        # Shared with the handler through request.state, even across scope copies.
        request_state = scope.setdefault("state", {})
        request_body = bytearray()
        answer = bytearray()
        held: list[Message] = []
        pending = bytearray()
        seen: dict[str, Any] = {"status": None, "streaming": False, "ttft_ms": None, "end": None}
        started_at, start = time.time(), time.perf_counter()

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                request_body.extend(message.get("body", b""))
            return message

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                seen["streaming"] = _header(message.get("headers"), b"content-type").startswith(
                    b"text/event-stream"
                )
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if chunk and chunk != SSE_KEEPALIVE and seen["ttft_ms"] is None:
                    seen["ttft_ms"] = (time.perf_counter() - start) * 1000.0
                answer.extend(chunk)
                if seen["streaming"] and chunk and not held:
                    pending.extend(chunk)
                    seen["end"] = _stream_end(pending, dialect)
                # From the stream's last event (or a JSON answer's last piece) on, hold the
                # rest until the exchange is stored.
                if held or seen["end"] is not None or not message.get("more_body", False):
                    held.append(message)
                    return
            await send(message)

        common: dict[str, Any] = {
            "dialect": dialect,
            "model_server_name": self.model_server_name,
            "model_call_id": uuid.uuid4().hex,
            "client_session_id": _single_header(scope.get("headers"), CLIENT_SESSION_HEADER),
            "started_at": started_at,
        }
        try:
            await self.app(scope, recording_receive, recording_send)
        except (Exception, asyncio.CancelledError) as exc:
            status, body = _exception_status_and_body(exc)
            status = seen["status"] or status
            body = bytes(answer) or body
            category = (error_category_for_status(status) if isinstance(status, int) else None) or (
                error_category_for_exception(exc)
            )
            exchange = exchange_for(
                **common,
                request_bytes=bytes(request_body),
                completed_at=time.time(),
                latency_ms=(time.perf_counter() - start) * 1000.0,
                ttft_ms=seen["ttft_ms"],
                status_code=status,
                error_category=category,
                response_body=None,
                response_raw=body.decode("utf-8", errors="replace") if body else None,
                execution=_execution(request_state),
            )
            try:
                await asyncio.to_thread(store_exchange, store, rollout_id, exchange)
            finally:
                for message in held:
                    await send(message)
            raise
        completed_at, latency_ms = time.time(), (time.perf_counter() - start) * 1000.0

        def parse_and_store() -> None:
            # Off the event loop; every failure here is caught: the answer is already on its way.
            body = bytes(answer)
            parsed: Any = None
            if body:
                try:
                    parsed = (
                        reconstruct_streamed_response(body, dialect)
                        if seen["streaming"]
                        else json.loads(body)
                    )
                except ValueError:
                    parsed = None
            response_body = parsed if isinstance(parsed, dict) else None
            status = seen["status"]
            category = error_category_for_status(status) if status is not None else None
            if category is None:
                category = {"error": "upstream_error", "incomplete": "incomplete"}.get(seen["end"])
            if category is None and seen["streaming"] and seen["end"] is None:
                category = "stream_truncated"
            if category is None and body and response_body is None:
                category = "capture_parse_error"  # a 2xx we could not read is not a clean success
            raw = (
                body.decode("utf-8", errors="replace")
                if body and (seen["streaming"] or response_body is None)
                else None
            )
            exchange = exchange_for(
                **common,
                request_bytes=bytes(request_body),
                completed_at=completed_at,
                latency_ms=latency_ms,
                ttft_ms=seen["ttft_ms"],
                status_code=status,
                error_category=category,
                response_body=response_body,
                response_raw=raw,
                execution=_execution(request_state),
            )
            store_exchange(store, rollout_id, exchange)

        try:
            await asyncio.to_thread(parse_and_store)
        except Exception:  # noqa: BLE001 - capture is best effort
            logger.warning("model-call capture: finishing a record failed", exc_info=True)
        finally:
            for message in held:
                await send(message)


def _execution(request_state: Any) -> Mapping[str, Any] | None:
    value = request_state.get(EXECUTION_STATE_KEY) if isinstance(request_state, Mapping) else None
    return value if isinstance(value, Mapping) else None
