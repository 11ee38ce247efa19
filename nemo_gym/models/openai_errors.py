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
    else (event streams included) passes through untouched. The lean HTTP protocol's direct
    routes (``ng_direct``: the wrapped server gate's, shaping with :func:`openai_shaped`) skip
    this layer and shape their error answers themselves.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        inner = getattr(app, "ng_direct", None)
        self.ng_direct = inner.shaped_by(openai_shaped) if inner is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def shaping_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                if message["status"] >= 400 and _is_json(message.get("headers") or []):
                    held["start"] = message
                    return
            elif message["type"] == "http.response.body" and "start" in held:
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                start = held["start"]
                headers, body = _shaped(start["status"], start.get("headers") or [], b"".join(chunks))
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            await send(message)

        await self.app(scope, receive, shaping_send)


def _is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    return dict(headers).get(b"content-type", b"").startswith(b"application/json")


def openai_shaped(
    status: int, headers: list[tuple[bytes, bytes]], raw: bytes
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """An error answer (status >= 400) in OpenAI's shape when its body is JSON, else unchanged:
    the headers and body :class:`OpenAIErrorBodies` sends instead."""
    if not _is_json(headers):
        return headers, raw
    return _shaped(status, headers, raw)


def _shaped(
    status: int, headers: list[tuple[bytes, bytes]], raw: bytes
) -> tuple[list[tuple[bytes, bytes]], bytes]:
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
    headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(raw)).encode()))
    if isinstance(server, str):
        headers.append((SERVER_HEADER, server.encode()))
    return headers, raw


def openai_error_body(
    message: str, status: int, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object for ``message`` answered with HTTP ``status`` (``code``: a string
    such as ``context_length_exceeded``, or null as OpenAI sends for most errors)."""
    error_type = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
