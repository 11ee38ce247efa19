"""Classify the outcome of one hop of a rollout (a model call, a tool call, seed or verify).

An infrastructure fault in any hop fails the whole rollout with a failure class; it is never
handed to the model as text and never verified into a reward. The classes:

- ``unreachable``: no connection (refused, reset before an answer, no such server registered);
- ``timeout``: no answer within the hop's deadline, or the server answered 504 / 408;
- ``rate_limited``: 429 after the server's own retries;
- ``upstream_auth``: 401 / 403 (a credential is wrong; retrying cannot help);
- ``upstream_5xx``: any other 5xx (a failure class the server put in its body wins, e.g.
  ``judge_failed``);
- ``bad_upstream_body``: a 2xx whose body is not what the hop returns (not JSON; for a model
  call, not a Responses object: ``{}``, ``{"error": ...}``, ``output`` not a list of items;
  behind a model server, an upstream answer that is not a Responses or Chat Completions object).

A 4xx a tool answers because of the model's own arguments (400, 404, 422, ...) is not a fault:
the model sees it as the tool's output.
"""

from __future__ import annotations

from typing import Any, cast

import orjson

from nemo_gym.failure_classes import (
    BAD_UPSTREAM_BODY,
    HOP_FAULT,
    RATE_LIMITED,
    TIMEOUT,
    UNREACHABLE,
    UPSTREAM_5XX,
    UPSTREAM_AUTH,
    UPSTREAM_ERROR,
    FailureClass,
    failure_class_of_call,
)
from nemo_gym.response_items import output_shape_fine, response_shape_errors
from nemo_gym.serving.server_client import ServerCallError, ServerResponse

_BODY_PREVIEW_CHARS = 300


class HopFault(ServerCallError):
    """An infrastructure fault in one hop; the rollout fails with ``failure_class``.

    A :class:`ServerCallError` whose body carries ``failure_class``: escaping an agent's handler,
    it becomes a 502 naming the class, which the collector files as a failure row.
    """

    def __init__(
        self,
        failure_class: FailureClass | str,
        server: str,
        path: str,
        message: str,
        status: int | None = None,
    ) -> None:
        super().__init__(
            HOP_FAULT,
            server,
            path,
            message,
            status,
            body={"failure_class": failure_class, "error": f"{server}{path}: {message}"},
        )
        self.failure_class = failure_class


def from_call_error(exc: ServerCallError) -> HopFault:
    """The fault for a call that got no HTTP answer (``unreachable``, ``timeout``, ``not_found``)."""
    if isinstance(exc, HopFault):
        return exc
    cls = failure_class_of_call(exc.kind, default=UNREACHABLE)
    message = str(exc).removeprefix(f"{exc.server}{exc.path}: ")
    return HopFault(cls, exc.server, exc.path, message, exc.status)


def status_failure_class(status: int, body: Any = None) -> str | None:
    """The infrastructure class of an HTTP status, or None when it is not an infrastructure fault.

    2xx and the 4xx a caller's input can cause are None. For a 5xx, a ``failure_class`` the
    server named in its JSON body wins (a judge that failed, a server further down that timed out).
    """
    if status in (408, 504):
        return TIMEOUT
    if status == 429:
        return RATE_LIMITED
    if status in (401, 403, 407):
        return UPSTREAM_AUTH
    if status >= 500:
        named = body.get("failure_class") if isinstance(body, dict) else None
        return named if isinstance(named, str) and named and named != UPSTREAM_ERROR else UPSTREAM_5XX
    return None


def parse_body(resp: ServerResponse) -> Any:
    """The JSON body, or the raw text when it is not JSON."""
    try:
        return resp.json()
    except orjson.JSONDecodeError:
        return resp.body.decode(errors="replace")


def preview(value: Any) -> str:
    """A short printable form of a body for error messages."""
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return text if len(text) <= _BODY_PREVIEW_CHARS else text[:_BODY_PREVIEW_CHARS] + "..."


def error_text(body: Any) -> str:
    """The error message in a JSON error body (``{"error": "..."}`` or OpenAI's ``{"error": {"message"}}``)."""
    if isinstance(body, dict) and "error" in body:
        error = body["error"]
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        return error if isinstance(error, str) else preview(error)
    return preview(body)


def check_status(resp: ServerResponse, server: str, path: str) -> Any:
    """The parsed body; raises :class:`HopFault` for an infrastructure status (see
    :func:`status_failure_class`) and for a 2xx whose body is not JSON. Other 4xx are returned
    to the caller to decide (see :func:`nemo_gym.agents.agent_hops.call_json`)."""
    if 200 <= resp.status < 300 and resp.body:
        # The usual answer: a 2xx with a JSON body (a JSON string is "not JSON" below, as parse_body
        # cannot tell it from text).
        try:
            parsed = orjson.loads(resp.body)
        except orjson.JSONDecodeError:
            pass
        else:
            if parsed.__class__ is not str:
                return parsed
    body = parse_body(resp)
    cls = status_failure_class(resp.status, body)
    if cls is not None:
        raise HopFault(cls, server, path, f"HTTP {resp.status}: {error_text(body)}", resp.status)
    if resp.ok and isinstance(body, str):
        raise HopFault(
            BAD_UPSTREAM_BODY,
            server,
            path,
            f"HTTP {resp.status} with a body that is not JSON: {preview(body)}",
        )
    return body


def responses_object_problem(body: Any) -> str | None:
    """What makes ``body`` not a Responses API object (an object with an ``output`` list of
    items), or None when it is one."""
    if not isinstance(body, dict):
        return f"not a Responses object but {type(body).__name__}: {preview(body)}"
    if "error" in body and body.get("error") is not None and "output" not in body:
        return f"an error object instead of a response: {error_text(body)}"
    if not isinstance(body.get("output"), list):
        return f"'output' that is not a list of items: {preview(body)}"
    errors = response_shape_errors(body)
    return "; ".join(errors[:3]) if errors else None


def chat_completion_problem(body: Any) -> str | None:
    """What makes ``body`` not a Chat Completions object (an object with a ``choices`` list of
    objects whose ``message``, when present, is an object), or None when it is one."""
    if not isinstance(body, dict):
        return f"not a chat completion but {type(body).__name__}: {preview(body)}"
    if "error" in body and body.get("error") is not None and "choices" not in body:
        return f"an error object instead of a chat completion: {error_text(body)}"
    choices = body.get("choices")
    if not isinstance(choices, list):
        return f"'choices' that is not a list: {preview(body)}"
    for index, choice in enumerate(choices):
        if not isinstance(choice, dict):
            return f"choices.{index} that is not an object: {preview(choice)}"
        message = choice.get("message")
        if message is not None and not isinstance(message, dict):
            return f"choices.{index}.message that is not an object: {preview(message)}"
    return None


def check_responses_object(body: Any, server: str, path: str) -> dict[str, Any]:
    """``body`` if it is a Responses API object (see :func:`responses_object_problem`); else
    :class:`HopFault` ``bad_upstream_body`` naming what is wrong."""
    if body.__class__ is dict:
        output = body.get("output")
        if output.__class__ is list and output_shape_fine(output):
            answer: dict[str, Any] = body
            return answer  # the usual answer: what responses_object_problem passes
    problem = responses_object_problem(body)
    if problem is None:
        return cast(dict[str, Any], body)
    raise HopFault(BAD_UPSTREAM_BODY, server, path, f"HTTP 200 with {problem}")
