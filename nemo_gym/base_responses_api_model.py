"""The model-server contract: an OpenAI Responses API endpoint in front of an engine.

Override :meth:`SimpleResponsesAPIModel.responses` (``POST /v1/responses``) and
:meth:`SimpleResponsesAPIModel.chat_completions` (``POST /v1/chat/completions``). Bodies are
plain dicts shaped as the ``openai`` package's types, so large token-ID arrays are not
re-validated on every hop.

The base speaks the rest of OpenAI's dialect for every model server: ``stream=true`` (the
answer sent as OpenAI's streaming events, see :mod:`nemo_gym.models.streaming`), ``GET /v1/models``,
error bodies shaped as OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (``code`` a
string or null; nemo_gym's own fields such as ``failure_class`` or ``detail`` may follow at the top
level, the server's name is in the ``X-NeMo-Gym-Server`` header), and a 400 naming the field for
a request whose shape is wrong (a message whose ``content`` is a number, no ``input``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym.models.openai_request_checks import check_chat_request, check_responses_request
from nemo_gym.models.streaming import stream_chat_completion, stream_responses
from nemo_gym.serving.server import BaseServer, BaseServerConfig, HTTPError


class BaseResponsesAPIModelConfig(BaseServerConfig):
    """Config of a model server; adapters subclass it."""


class SimpleResponsesAPIModel(BaseServer):
    """Base of every model server."""

    server_type: ClassVar[str] = "responses_api_models"
    config: BaseResponsesAPIModelConfig

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer a Responses API create request with a Responses API response object."""
        raise HTTPError(404, f"{type(self).__name__} does not serve /v1/responses")

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer a Chat Completions request with a chat completion object."""
        raise HTTPError(404, f"{type(self).__name__} does not serve /v1/chat/completions")

    def model_ids(self) -> list[str]:
        """The model names ``GET /v1/models`` lists (default: the config's model name, else the server's)."""
        extra = self.config.model_extra or {}
        for field in ("served_model_name", "model_name", "openai_model", "model"):
            value = getattr(self.config, field, None) or extra.get(field)
            if isinstance(value, str) and value:
                return [value]
        return [self.name]

    async def models(self, body: Any) -> dict[str, Any]:
        """``GET /v1/models``: OpenAI's model list."""
        data = [
            {"id": model, "object": "model", "created": 0, "owned_by": "nemo_gym"}
            for model in self.model_ids()
        ]
        return {"object": "list", "data": data}

    def routes(self) -> list[Route]:
        """Liveness, ``/v1/responses``, ``/v1/chat/completions`` and ``/v1/models``."""
        return super().routes() + [
            self.route("/v1/responses", self._serve_responses, body_model_of=self.responses),
            self.route(
                "/v1/chat/completions", self._serve_chat_completions, body_model_of=self.chat_completions
            ),
            self.route("/v1/models", self.models, methods=("GET",)),
        ]

    def build_app(self) -> ASGIApp:
        """The server's app with every error answer in OpenAI's shape (no route, auth, body limits too)."""
        return OpenAIErrorBodies(super().build_app())

    async def responses_stream(self, body: dict[str, Any]) -> Response:
        """Answer a Responses request that asked for ``stream: true`` with an event stream.

        The default computes the whole answer with :meth:`responses` and sends it as OpenAI's
        events; servers whose engine produces the answer in pieces override this to send events
        as they are produced. Raise ``HTTPError`` before the stream starts for a refused request.
        """
        return stream_responses(await self.responses(without_stream(body)))

    async def chat_completions_stream(self, body: dict[str, Any]) -> Response:
        """Answer a Chat Completions request with ``stream: true`` (see :meth:`responses_stream`)."""
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return stream_chat_completion(await self.chat_completions(without_stream(body)), include_usage)

    async def _serve_responses(self, body: Any) -> dict[str, Any] | Response:
        check_responses_request(body)
        if body.get("stream") is True:
            return await self.responses_stream(body)
        return await self.responses(body)

    async def _serve_chat_completions(self, body: Any) -> dict[str, Any] | Response:
        check_chat_request(body)
        if body.get("stream") is True:
            return await self.chat_completions_stream(body)
        return await self.chat_completions(body)


def without_stream(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without ``stream`` and ``stream_options`` (the request a whole answer needs)."""
    return {key: value for key, value in body.items() if key not in ("stream", "stream_options")}


# ---- OpenAI-shaped errors -------------------------------------------------------------------
# The server that answered an error (OpenAI's body has no place for it).
SERVER_HEADER = b"x-nemo-gym-server"
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class OpenAIErrorBodies:
    """ASGI middleware: a JSON error answer ``{"error": "<text>", ...}`` becomes OpenAI's shape.

    Only answers with status >= 400 and a JSON body are held back and rewritten; everything
    else (event streams included) passes through untouched.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def shaping_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if message["status"] >= 400 and headers.get(b"content-type", b"").startswith(
                    b"application/json"
                ):
                    held["start"] = message
                    return
            elif message["type"] == "http.response.body" and "start" in held:
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                await _send_shaped(send, held["start"], b"".join(chunks))
                return
            await send(message)

        await self.app(scope, receive, shaping_send)


async def _send_shaped(send: Send, start: Message, raw: bytes) -> None:
    status = start["status"]
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    server = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        extra = {k: v for k, v in body.items() if k not in ("error", "server", "code", "param")}
        code, param = body.get("code"), body.get("param")
        shaped = openai_error_body(
            body["error"],
            status,
            param=param if isinstance(param, str) else None,
            code=code if isinstance(code, str) else None,
        )
        server = body.get("server")
        raw = orjson.dumps({**shaped, **extra})
    headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(raw)).encode()))
    if isinstance(server, str):
        headers.append((SERVER_HEADER, server.encode()))
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": raw, "more_body": False})


def openai_error_body(
    message: str, status: int, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object for ``message`` answered with HTTP ``status`` (``code``: a string
    such as ``context_length_exceeded``, or null as OpenAI sends for most errors)."""
    error_type = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def __getattr__(name: str) -> Any:
    # FastAPI's Body, which NeMo Gym model adapters import from here: loaded only when asked
    # for, so our own model servers never import FastAPI.
    if name == "Body":
        from fastapi import Body

        return Body
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
