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

A streaming answer is sent once the policy's answer is complete (the proxy must see the whole
call to record it), as the event sequence that API sends for the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response

from nemo_gym.models.anthropic_messages import (
    messages_request_to_responses_params,
    messages_response_events,
    response_to_messages_response,
)
from nemo_gym.models.chat_tools import ConversionUnsupported
from nemo_gym.models.conversion import chat_request_to_responses_params, response_to_chat_completion
from nemo_gym.models.stream_requests import (
    CHAT_REQUEST_FIELDS,
    RESPONSES_REQUEST_FIELDS,
    NamespaceMap,
    restore_namespace_calls,
    sanitize_chat_body,
    sanitize_responses_body,
)
from nemo_gym.models.streaming import chat_completion_chunks, response_events, sse_body, sse_response

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

    def answer(self, response: dict[str, Any]) -> Response:
        """The client's answer for the policy's Responses ``response``, whole or streamed."""
        try:
            if self.dialect == "responses":
                return self._responses(response)
            if self.dialect == "chat":
                return self._chat(response)
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


def read_request(dialect: str, body: dict[str, Any]) -> DialectCall:
    """Read a client's request body in ``dialect``; raises :class:`DialectError` naming what is wrong."""
    stream = body.get("stream") is True
    model = str(body.get("model") or "")
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


def _json(body: dict[str, Any]) -> Response:
    import orjson

    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")
