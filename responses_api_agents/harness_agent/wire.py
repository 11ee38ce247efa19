"""The API dialects the capture proxy speaks to a harness program, each over the Responses API.

Every dialect maps a client's request onto Responses create-params (the one call the proxy
forwards to the policy model, token IDs included) and the Responses answer back onto the
client's answer, whole or as that API's server-sent events. The mappings themselves live in
``nemo_gym.models`` (one converter per pair of APIs); this module only picks them per dialect:

| dialect | route under ``/r/<token>`` | who speaks it |
|---|---|---|
| ``responses`` | ``POST /v1/responses`` | Codex, the ``openai`` client |
| ``chat`` | ``POST /v1/chat/completions`` | OpenCode, the ``openai`` client |
| ``messages`` | ``POST /v1/messages`` | Claude Code |
| ``gemini`` | ``POST /v1beta/models/<model>:generateContent`` / ``:streamGenerateContent`` | Gemini CLI |

Gemini CLI's own bookkeeping requests (JSON under a response schema: its routing and
next-speaker checks) are not turns of the agent: they are answered here with the schema's
default instance, as the model servers do (:mod:`nemo_gym.models.gemini_api`), and not forwarded.

A streaming answer is sent once the policy's answer is complete (the proxy must see the whole
call to record it), as the event sequence that API sends for the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response

from nemo_gym.base_responses_api_model import (
    CHAT_REQUEST_FIELDS,
    GEMINI_ACTIONS,
    RESPONSES_REQUEST_FIELDS,
    ConversionUnsupported,
    NamespaceMap,
    chat_completion_chunks,
    chat_request_to_responses_params,
    gemini_request_to_responses_params,
    gemini_stream_chunks,
    json_answer,
    json_schema_request,
    messages_request_to_responses_params,
    messages_response_events,
    response_events,
    response_to_chat_completion,
    response_to_gemini_response,
    response_to_messages_response,
    restore_namespace_calls,
    sanitize_chat_body,
    sanitize_responses_body,
    schema_default_instance,
    sse_body,
    sse_response,
)

# Fields a client sets that the proxy decides instead: the policy model serves one model, the
# proxy stores nothing, and streaming is the proxy's business with its client.
PROXY_OWNED_FIELDS = ("model", "stream", "stream_options", "store")
# Responses fields of our own a harness may echo (token IDs ride on items, not here).
_RESPONSES_FIELDS = RESPONSES_REQUEST_FIELDS - set(PROXY_OWNED_FIELDS)


class DialectError(ValueError):
    """A request the dialect cannot map onto the Responses API (the client gets a 400)."""


@dataclass
class DialectCall:
    """One client request read in its dialect: the Responses params to forward and how to answer."""

    dialect: str
    params: dict[str, Any]
    stream: bool
    model: str = ""
    include_usage: bool = False
    namespaces: NamespaceMap = field(default_factory=dict)
    local_answer: dict[str, Any] | None = None
    """An answer the proxy gives itself (a client's bookkeeping request), not forwarded."""

    def answer(self, response: dict[str, Any]) -> Response:
        """The client's answer for the policy's Responses ``response``, whole or streamed."""
        try:
            if self.dialect == "responses":
                return self._responses(response)
            if self.dialect == "chat":
                return self._chat(response)
            if self.dialect == "gemini":
                return self._gemini(response_to_gemini_response(response, model=self.model))
            return self._messages(response)
        except (ConversionUnsupported, ValueError) as exc:
            raise DialectError(f"the policy's answer has no {self.dialect} form: {exc}") from None

    def _responses(self, response: dict[str, Any]) -> Response:
        output = restore_namespace_calls(list(response.get("output") or []), self.namespaces)
        answer = {**response, "output": output}
        if self.stream:
            return sse_response(sse_body(response_events(answer), named=True, done_marker=False))
        return _json(answer)

    def _chat(self, response: dict[str, Any]) -> Response:
        completion = response_to_chat_completion(response)
        if self.stream:
            chunks = chat_completion_chunks(completion, self.include_usage)
            return sse_response(sse_body(chunks, named=False, done_marker=True))
        return _json(completion)

    def _messages(self, response: dict[str, Any]) -> Response:
        answer = response_to_messages_response(response, model=self.model or str(response.get("model") or ""))
        if self.stream:
            events = [{**data, "type": name} for name, data in messages_response_events(answer)]
            return sse_response(sse_body(events, named=True, done_marker=False))
        return _json(answer)

    def _gemini(self, answer: dict[str, Any]) -> Response:
        if self.stream:
            return sse_response(
                b"".join(b"data: " + _dumps(chunk) + b"\n\n" for chunk in gemini_stream_chunks(answer))
            )
        return _json(answer)

    def answer_locally(self) -> Response | None:
        """The answer to a bookkeeping request the proxy answers itself (None: forward it)."""
        return None if self.local_answer is None else self._gemini(self.local_answer)


def read_request(dialect: str, body: dict[str, Any], target: str = "") -> DialectCall:
    """Read a client's request body in ``dialect`` (``target``: Gemini's ``<model>:<action>``);
    raises :class:`DialectError` naming what is wrong."""
    stream = body.get("stream") is True
    model = str(body.get("model") or "")
    if dialect == "gemini":
        return _read_gemini(body, target)
    try:
        if dialect == "responses":
            params, namespaces = sanitize_responses_body(body, _RESPONSES_FIELDS)
            return DialectCall(dialect, params, stream, model, namespaces=namespaces)
        if dialect == "chat":
            cleaned, include_usage = sanitize_chat_body(body, CHAT_REQUEST_FIELDS)
            params = chat_request_to_responses_params(cleaned)
            return DialectCall(dialect, params, stream, model, include_usage=include_usage)
        if dialect == "messages":
            return DialectCall(dialect, messages_request_to_responses_params(body), stream, model)
    except (ConversionUnsupported, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DialectError(f"cannot read the {dialect} request: {type(exc).__name__}: {exc}") from None
    raise DialectError(f"unknown dialect {dialect!r}")


def _read_gemini(body: dict[str, Any], target: str) -> DialectCall:
    model, _, action = target.rpartition(":")
    if action not in GEMINI_ACTIONS or not model:
        raise DialectError(
            f"no Gemini action {target!r}: the proxy answers models/<model>:{{{','.join(GEMINI_ACTIONS)}}}"
        )
    stream = action == "streamGenerateContent"
    schema = json_schema_request(body)
    if schema is not None:
        answer = json_answer(schema_default_instance(schema), model=model)
        return DialectCall("gemini", {}, stream, model, local_answer=answer)
    try:
        params = gemini_request_to_responses_params(body)
    except (ConversionUnsupported, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DialectError(f"cannot read the generateContent request: {type(exc).__name__}: {exc}") from None
    return DialectCall("gemini", params, stream, model)


def _dumps(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _json(body: dict[str, Any]) -> Response:
    return Response(_dumps(body), media_type="application/json")
