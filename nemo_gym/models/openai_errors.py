"""OpenAI's error shape for a model server's answers: ``{"error": {"message", "type", "param", "code"}}``.

A model server's failures are first answered in our own JSON error shape (the server's name,
``failure_class``, ...); :class:`OpenAIErrorBodies` rewrites them into OpenAI's, so OpenAI's
clients report the message, keeping our extra fields at the top level and the server's name in
the ``X-NeMo-Gym-Server`` header.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
                if message["status"] >= 400 and dict(message.get("headers") or []).get(
                    b"content-type", b""
                ).startswith(b"application/json"):
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
