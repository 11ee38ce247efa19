"""Compatibility: NeMo Gym's ``nemo_gym.responses_streaming``: serve ``stream: true`` Responses clients from one answer.

A model server computes a Responses answer in one call; a streaming client (the Codex CLI, ...)
gets it as OpenAI's Responses events. The request side (:mod:`nemo_gym.models.stream_requests`)
drops streaming flags and unknown fields, flattens ``namespace`` tools into functions named
``<namespace>__<name>`` and hoists leading system messages into ``instructions``; the answer side
names flattened calls back and sends the full event sequence (:mod:`nemo_gym.models.streaming`):
``response.created``, ``response.in_progress``, each item added, filled and done, then
``response.completed`` (or ``response.incomplete``) carrying the whole response.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

from nemo_gym.models.stream_requests import (
    NAMESPACE_TOOL_DELIMITER,
    RESPONSES_REQUEST_FIELDS,
    NamespaceMap,
    flatten_namespace_tools,
    restore_namespace_calls,
    sanitize_responses_body,
)
from nemo_gym.models.streaming import response_events
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming

__all__ = [
    "NAMESPACE_TOOL_DELIMITER",
    "NamespaceMap",
    "flatten_namespace_tools",
    "restore_namespace_tool_calls",
    "sanitize_streaming_responses_body",
    "synthesize_responses_failure_sse",
    "synthesize_responses_sse",
    "validate_streaming_responses_params",
]

_KNOWN_FIELDS = (RESPONSES_REQUEST_FIELDS | set(NeMoGymResponseCreateParamsNonStreaming.model_fields)) - {
    "stream"
}


def sanitize_streaming_responses_body(body: dict[str, Any]) -> tuple[dict[str, Any], NamespaceMap]:
    """``(request ready for validation, map of flattened tool names)`` for a streaming Responses body.

    The body is not changed. Tools and input items the request types do not take are dropped
    with a warning rather than failing the rollout.
    """
    return sanitize_responses_body(body, _KNOWN_FIELDS)


def validate_streaming_responses_params(body: dict[str, Any]) -> NeMoGymResponseCreateParamsNonStreaming:
    """The sanitized body as a request model (fields newer than the ``openai`` types pass through)."""
    return NeMoGymResponseCreateParamsNonStreaming.model_validate(body)


def restore_namespace_tool_calls(items: list[Any], ns_map: NamespaceMap) -> list[Any]:
    """Output items with flattened function calls given their ``namespace`` and ``name`` back."""
    return restore_namespace_calls(items, ns_map)


def _sse_event(event: dict[str, Any]) -> str:
    """One event as an SSE frame (looked up at call time: NeMo Gym's tests replace it)."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def synthesize_responses_sse(
    response_json: dict[str, Any], ns_map: NamespaceMap | None = None
) -> Iterator[str]:
    """A finished Responses response as server-sent Responses events, namespaced calls restored."""
    output = restore_namespace_calls(list(response_json.get("output") or []), ns_map or {})
    for event in response_events({**response_json, "output": output}):
        yield _sse_event(event)


def synthesize_responses_failure_sse(message: str, *, code: str = "server_error") -> Iterator[str]:
    """The events that end a stream whose answer failed: ``response.created``, then ``response.failed``.

    Once a 200 event stream has begun, an error can no longer be an HTTP status; a client that
    sees ``response.failed`` reports a failed turn instead of a cut connection.
    """
    response = {
        "id": f"resp_{uuid4().hex}",
        "object": "response",
        "status": "failed",
        "output": [],
        "error": {"code": code, "message": message},
    }
    yield _sse_event(
        {"type": "response.created", "sequence_number": 0, "response": {**response, "status": "in_progress"}}
    )
    yield _sse_event({"type": "response.failed", "sequence_number": 1, "response": response})
