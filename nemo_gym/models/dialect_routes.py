"""Anthropic Messages and Gemini routes for every model server, over its own Responses handler.

Agent CLIs speak their vendor's dialect: Claude Code the Anthropic Messages API
(``POST /v1/messages?beta=true``, always streaming), Gemini CLI Google's Gemini API
(``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent?alt=sse``).
:class:`DialectRoutes` serves both on any model server: the request is converted to Responses
create-params (:mod:`nemo_gym.models.anthropic_messages`, :mod:`nemo_gym.models.gemini_api`), answered by
the server's own :meth:`responses` (so the engine, the chat template, the token-ID splice and
``return_token_id_information`` are exactly the Responses path's), and the answer converted back,
whole or as the dialect's event stream.

- **Any model name.** A CLI sends its own model name (``claude-opus-4-8``, ``gemini-2.5-pro``);
  a name the server does not serve is mapped to the server's first model, and the answer
  reports the name the client asked for.
- **Token IDs.** A dialect answer is one model call, so the call's ``prompt_token_ids``,
  ``generation_token_ids``, ``generation_log_probs`` (and ``token_ids_contiguous: false`` when the
  splice was refused) sit on the answer object (streaming: on the last data event). Clients drop
  them when they echo the conversation; :class:`~nemo_gym.models.token_memory.TokenIdMemory`
  puts them back on the echoed items, per rollout (``/ng-rollout/<id>``), so turn k+1's prompt
  extends turn k's prompt + generation.
- **Streaming.** The answer is computed whole, then sent as the dialect's events; while it is
  computed the stream carries SSE comment lines (every ``chat_keepalive_s``), which clients skip.
  A request that fails fast is answered with its HTTP status; one that fails after the stream
  started ends with the dialect's error event.
- **Gemini's JSON side calls.** Gemini CLI asks for JSON under a schema for its own bookkeeping
  (the model router's ``complexity_score``, the next-speaker check). Those are answered with the
  schema's plainest instance (:func:`~nemo_gym.models.gemini_api.schema_default_instance`)
  without calling the engine: they are not turns of the agent, and carry no token IDs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.models.anthropic_messages import (
    messages_request_to_responses_params,
    messages_response_events,
    response_to_messages_response,
)
from nemo_gym.models.fastapi_dispatch import event_stream
from nemo_gym.models.gemini_api import (
    gemini_request_to_responses_params,
    gemini_stream_chunks,
    json_answer,
    json_schema_request,
    response_to_gemini_response,
    schema_default_instance,
)
from nemo_gym.models.streaming import SSE_KEEPALIVE, sse_response
from nemo_gym.models.token_memory import TokenIdMemory
from nemo_gym.serving.server import HTTPError

logger = logging.getLogger(__name__)

# Headers by which a client names its conversation when it sends no rollout id.
SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id")
GEMINI_ACTIONS = ("generateContent", "streamGenerateContent", "countTokens")


@dataclass(frozen=True)
class DialectCall:
    """What the route of the request being served saw besides its body."""

    target: str
    query: dict[str, str]
    session: str | None


_CALL: ContextVar[DialectCall | None] = ContextVar("nemo_gym_dialect_call", default=None)


class ModelServer(Protocol):
    """What :class:`DialectRoutes` needs of a model server (its ``chat_keepalive_s`` too)."""

    @property
    def name(self) -> str: ...

    @property
    def rollout_id(self) -> str | None: ...

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def captured_responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """:meth:`responses`, the call's training tokens captured when it is being captured."""
        ...

    def model_ids(self) -> list[str]: ...

    async def count_input_tokens(self, body: dict[str, Any]) -> int: ...

    def route(
        self,
        path: str,
        handler: Callable[[Any], Awaitable[Any]],
        methods: tuple[str, ...] = ("POST",),
        body_model_of: Callable[..., Any] | None = None,
    ) -> Route: ...


class DialectRoutes:
    """``POST /v1/messages`` and ``POST /v1beta/models/{model}:{action}`` for one model server."""

    def __init__(self, server: ModelServer, memory: TokenIdMemory | None = None) -> None:
        self.server = server
        self.memory = memory if memory is not None else TokenIdMemory()

    @property
    def keepalive_s(self) -> float:
        """Seconds between keep-alive comments of a stream whose answer is still being computed."""
        return float(getattr(self.server, "chat_keepalive_s", 15.0))

    def routes(self) -> list[Route]:
        """The dialect routes (the server's route wrapper: body limits, JSON errors, sessions)."""
        messages = self.server.route("/v1/messages", self.messages, body_model_of=self.server.responses)
        gemini = self.server.route(
            "/v1beta/models/{target}", self.gemini, body_model_of=self.server.responses
        )
        count = self.server.route(
            "/v1/messages/count_tokens", self.count_tokens, body_model_of=self.server.responses
        )
        return [
            Route("/v1/messages", _with_call(messages.endpoint), methods=["POST"]),
            Route("/v1/messages/count_tokens", _with_call(count.endpoint), methods=["POST"]),
            # Gemini CLI calls v1beta; the google-genai SDK given a base URL calls v1.
            Route("/v1beta/models/{target}", _with_call(gemini.endpoint), methods=["POST"]),
            Route("/v1/models/{target}", _with_call(gemini.endpoint), methods=["POST"]),
        ]

    # ---- the shared middle: params in, Responses answer out -----------------------------
    def scope(self) -> str:
        """The conversation the call belongs to: its rollout, else the client's session, else the server."""
        rollout = self.server.rollout_id
        if rollout:
            return f"rollout:{rollout}"
        call = _CALL.get()
        if call is not None and call.session:
            return f"session:{call.session}"
        return "server"

    def served_model(self, asked: Any) -> str:
        """The client's model name if the server serves it, else the server's own first name."""
        served = self.server.model_ids()
        return asked if isinstance(asked, str) and asked in served else served[0]

    async def respond(self, params: dict[str, Any]) -> dict[str, Any]:
        """The server's Responses answer to ``params``, token IDs restored before and remembered after."""
        scope = self.scope()
        params["input"] = self.memory.restore(scope, params.get("input") or [])
        response = await self.server.captured_responses(params)
        self.memory.remember(scope, response)
        return response

    # ---- Anthropic Messages ---------------------------------------------------------------
    async def messages(self, body: dict[str, Any]) -> Any:
        """``POST /v1/messages``: a Messages request answered through the server's Responses path."""
        try:
            params = messages_request_to_responses_params(body)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise HTTPError(400, f"cannot read the Messages request: {exc}") from exc
        asked = str(body.get("model") or "")
        params["model"] = self.served_model(asked)

        async def answer() -> dict[str, Any]:
            response = await self.respond(params)
            return response_to_messages_response(response, model=asked or str(response.get("model") or ""))

        if body.get("stream") is not True:
            return await answer()

        def events(message: dict[str, Any]) -> list[bytes]:
            return [_named_event(name, data) for name, data in messages_response_events(message)]

        def failed(message: str) -> bytes:
            return _named_event(
                "error", {"type": "error", "error": {"type": "api_error", "message": message}}
            )

        return await self._stream(answer(), events, failed)

    async def count_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/messages/count_tokens``: the prompt's length in the served model's tokens."""
        try:
            params = messages_request_to_responses_params(body)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise HTTPError(400, f"cannot read the Messages request: {exc}") from exc
        params["model"] = self.served_model(body.get("model"))
        return {"input_tokens": await self.server.count_input_tokens(params)}

    # ---- Gemini ---------------------------------------------------------------------------
    async def gemini(self, body: dict[str, Any]) -> Any:
        """``POST /v1beta/models/{model}:generateContent`` (or ``:streamGenerateContent``, ``:countTokens``)."""
        call = _CALL.get()
        target = call.target if call is not None else ""
        model, _, action = target.rpartition(":")
        if action not in GEMINI_ACTIONS or not model:
            raise HTTPError(
                404,
                f"no Gemini action {target!r}: this server answers models/<model>:{{{','.join(GEMINI_ACTIONS)}}}",
            )
        if action == "countTokens":
            # Either {contents, ...} or the whole request under generateContentRequest.
            request = body.get("generateContentRequest") or body
            try:
                params = gemini_request_to_responses_params(request)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise HTTPError(400, f"cannot read the countTokens request: {exc}") from exc
            params["model"] = self.served_model(model)
            return {"totalTokens": await self.server.count_input_tokens(params)}
        try:
            schema = json_schema_request(body)
        except ValueError as exc:
            raise HTTPError(400, f"cannot read the generateContent request: {exc}") from exc
        if schema is not None:
            # Not a turn of the agent: the CLI's own bookkeeping (see the module docstring).
            result = json_answer(schema_default_instance(schema), model=model)
            if action == "streamGenerateContent":
                return sse_response(_data_event(result))
            return result
        try:
            params = gemini_request_to_responses_params(body)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise HTTPError(400, f"cannot read the generateContent request: {exc}") from exc
        params["model"] = self.served_model(model)

        async def answer() -> dict[str, Any]:
            return response_to_gemini_response(await self.respond(params), model=model)

        if action == "generateContent":
            return await answer()

        def chunks(result: dict[str, Any]) -> list[bytes]:
            return [_data_event(chunk) for chunk in gemini_stream_chunks(result)]

        def failed(message: str) -> bytes:
            return _data_event({"error": {"code": 500, "message": message, "status": "INTERNAL"}})

        return await self._stream(answer(), chunks, failed)

    # ---- streaming ------------------------------------------------------------------------
    async def _stream(
        self,
        answer: Awaitable[dict[str, Any]],
        events: Callable[[dict[str, Any]], list[bytes]],
        failed: Callable[[str], bytes],
    ) -> Response:
        pending = asyncio.ensure_future(answer)
        try:
            # A quick answer (or a quick failure, answered with its HTTP status) is sent whole.
            done, _ = await asyncio.wait({pending}, timeout=self.keepalive_s)
        except BaseException:
            pending.cancel()
            raise
        if done:
            # One body with a length: the events in one write, not a chunk (and segment) each.
            return sse_response(b"".join(events(pending.result())))

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield SSE_KEEPALIVE
                while not (await asyncio.wait({pending}, timeout=self.keepalive_s))[0]:
                    yield SSE_KEEPALIVE
                try:
                    result = pending.result()
                except Exception as exc:  # noqa: BLE001 - the stream has started: its last event says why
                    logger.exception("%s: a streamed dialect call failed", self.server.name)
                    message = getattr(exc, "message", None) or str(exc)
                    yield failed(f"{type(exc).__name__}: {message}")
                    return
                for event in events(result):
                    yield event
            finally:
                pending.cancel()

        return event_stream(stream())


def _with_call(
    endpoint: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        session = next((request.headers[h] for h in SESSION_HEADERS if h in request.headers), None)
        call = DialectCall(str(request.path_params.get("target") or ""), dict(request.query_params), session)
        token = _CALL.set(call)
        try:
            return await endpoint(request)
        finally:
            _CALL.reset(token)

    run.__name__ = getattr(endpoint, "__name__", "dialect")
    return run


def _named_event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _data_event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"
