"""Server-sent events in and out: an upstream's stream cut into events, and event streams sent.

- :class:`SSEParser` cuts an upstream's server-sent events out of the bytes as they arrive, and
  :func:`relay_events` passes them on one whole event at a time (``openai_model``, and
  ``vllm_model``'s Chat Completions), ending with an error event if the upstream breaks off.
- :class:`EventStreamResponse` sends an async iterator of bytes and always runs its cleanup
  (closing the upstream connection, stopping a generation) when the client goes away.
- :func:`error_event` is the event that ends a stream that failed after it started (its HTTP
  status, 200, is already sent).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from starlette.responses import StreamingResponse
from starlette.types import Send

from nemo_gym.failure_classes import BAD_UPSTREAM_BODY
from nemo_gym.serving.secrets import redact_text
from nemo_gym.serving.upstream import UpstreamError, UpstreamResponse

# One event larger than this (no blank line for 64 MiB) is an upstream fault, not an event.
MAX_EVENT_BYTES = 64 * 1024 * 1024
_FINAL_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})


@dataclass
class SSEEvent:
    """One server-sent event: its ``event:`` name (or None), its data, and its bytes as received."""

    name: str | None
    data: str
    raw: bytes

    def json(self) -> Any:
        """The data parsed as JSON (raises ``orjson.JSONDecodeError``)."""
        return orjson.loads(self.data)


class SSEParser:
    """Cuts complete server-sent events out of a byte stream fed in arbitrary pieces."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events completed by ``chunk`` (comment-only blocks are skipped)."""
        self._buffer = (self._buffer + chunk).replace(b"\r\n", b"\n")
        events = []
        while (end := self._buffer.find(b"\n\n")) != -1:
            block, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            event = _parse_block(block)
            if event is not None:
                events.append(event)
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise ValueError(f"a server-sent event passed {MAX_EVENT_BYTES} bytes without ending")
        return events

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet complete."""
        return self._buffer


def _parse_block(block: bytes) -> SSEEvent | None:
    name: str | None = None
    data: list[str] = []
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        key, _, value = line.partition(b":")
        text = value[1:] if value.startswith(b" ") else value
        if key == b"event":
            name = text.decode(errors="replace")
        elif key == b"data":
            data.append(text.decode(errors="replace"))
    if not data:
        return None
    return SSEEvent(name, "\n".join(data), block + b"\n\n")


def sse_bytes(event: dict[str, Any], named: bool) -> bytes:
    """One event as server-sent-event bytes (``event: <type>`` line when ``named``)."""
    head = f"event: {event['type']}\n".encode() if named else b""
    return head + b"data: " + orjson.dumps(event, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n"


def error_event(message: str, failure_class: str, sequence_number: int | None = None) -> dict[str, Any]:
    """An error event that ends a stream: Responses' ``error`` shape plus the ``error`` object
    that the ``openai`` client raises as an ``APIError`` (it does so for chat streams too).

    Secrets in ``message`` (an upstream may echo credentials) are hidden, as in error answers.
    """
    message = redact_text(message)
    event: dict[str, Any] = {
        "type": "error",
        "code": failure_class,
        "message": message,
        "param": None,
        "error": {"message": message, "type": "server_error", "code": failure_class},
    }
    if sequence_number is not None:
        event["sequence_number"] = sequence_number
    return event


async def relay_events(answer: UpstreamResponse, responses_api: bool) -> AsyncIterator[bytes]:
    """An upstream's event stream passed on as it arrives, one whole event at a time.

    When the upstream breaks off (connection lost, deadline, the stream ends before its final
    event), a last error event names the upstream and the failure class (``timeout``,
    ``unreachable`` or ``bad_upstream_body``), so the client sees a failed stream, not a short answer.
    """
    parser = SSEParser()
    last: SSEEvent | None = None
    finished = False
    try:
        async for chunk in answer.chunks():
            for event in parser.feed(chunk):
                last = event
                finished = finished or _is_final(event, responses_api)
                yield event.raw
        problem = None if finished else (BAD_UPSTREAM_BODY, "the stream ended before its final event")
    except UpstreamError as exc:
        problem = (exc.kind, str(exc))
    except ValueError as exc:
        problem = (BAD_UPSTREAM_BODY, str(exc))
    if problem is not None:
        failure_class, detail = problem
        message = f"upstream {answer.url} stream failed: {detail}"
        number = _next_sequence_number(last) if responses_api else None
        yield sse_bytes(error_event(message, failure_class, number), named=responses_api)


def _is_final(event: SSEEvent, responses_api: bool) -> bool:
    if not responses_api:
        return event.data.strip() == "[DONE]"
    if event.name is not None:
        return event.name in _FINAL_TYPES
    try:
        value = event.json()
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict) and value.get("type") in _FINAL_TYPES


def _next_sequence_number(last: SSEEvent | None) -> int:
    try:
        number = last.json().get("sequence_number") if last is not None else None
    except (orjson.JSONDecodeError, AttributeError):
        number = None
    return number + 1 if isinstance(number, int) else 0


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` answer from an async iterator of bytes.

    ``cleanup`` (synchronous: it must run even while the stream is being cancelled) is called
    exactly once when the stream ends, fails, or the client disconnects.
    """

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[], None] | None = None) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._content = content
        self._cleanup = cleanup

    async def stream_response(self, send: Send) -> None:
        """Send the events; then close the iterator and clean up, whatever happened."""
        try:
            await super().stream_response(send)
        finally:
            try:
                # Shielded: on a disconnect this runs inside a cancelled scope.
                with anyio.CancelScope(shield=True):
                    aclose = getattr(self._content, "aclose", None)
                    if aclose is not None:
                        await aclose()
            finally:
                if self._cleanup is not None:
                    cleanup, self._cleanup = self._cleanup, None
                    cleanup()
