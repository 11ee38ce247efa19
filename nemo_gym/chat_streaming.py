"""Compatibility: NeMo Gym's ``nemo_gym.chat_streaming``: serve ``stream: true`` Chat Completions clients from one answer.

A model server computes a chat completion in one call; a streaming client (OpenClaw, ...) is
answered by sending that completion as ``chat.completion.chunk`` events ending in
``data: [DONE]``. :func:`sanitize_streaming_chat_body` prepares the request
(:mod:`nemo_gym.models.stream_requests`), :func:`synthesize_chat_completion_sse` sends the answer
(:mod:`nemo_gym.models.streaming`: role, reasoning and content in word-sized deltas, one chunk
per tool call, a last chunk with the finish reason and the engine's token IDs, then usage when
the client asked for it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from nemo_gym.models.stream_requests import CHAT_REQUEST_FIELDS, sanitize_chat_body
from nemo_gym.models.streaming import chat_completion_chunks
from nemo_gym.openai_utils import CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS

__all__ = ["sanitize_streaming_chat_body", "synthesize_chat_completion_sse"]

# Provider extensions (chat_template_kwargs, ...) are for one-shot requests; streaming harnesses'
# copies of them never reach the engine.
_KNOWN_FIELDS = CHAT_REQUEST_FIELDS - CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS


def sanitize_streaming_chat_body(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``(request without stream, stream_options and unknown fields, whether a usage chunk was asked for)``.

    The body is not changed; the returned request is a copy.
    """
    return sanitize_chat_body(body, _KNOWN_FIELDS)


def _sse_data(payload: dict[str, Any]) -> str:
    """One chunk as an SSE ``data:`` frame (looked up at call time: NeMo Gym's tests replace it)."""
    return f"data: {json.dumps(payload)}\n\n"


def synthesize_chat_completion_sse(completion: dict[str, Any], include_usage: bool = False) -> Iterator[str]:
    """A finished chat completion as server-sent ``chat.completion.chunk`` events, then ``data: [DONE]``.

    A usage chunk (no choices) comes last when ``include_usage`` and the completion has usage.
    """
    with_usage = include_usage and completion.get("usage") is not None
    for chunk in chat_completion_chunks(completion, include_usage=with_usage):
        yield _sse_data(chunk)
    yield "data: [DONE]\n\n"
