"""JSON answers of every server: serialization and the classified error bodies.

Every error is a JSON object naming the server (``{"error": ..., "server": ...}``): a validation
error lists each field, a downstream failure keeps its ``failure_class`` so the collector files
the rollout as an infrastructure failure rather than scoring it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from nemo_gym.failure_classes import HTTP_ERROR, UPSTREAM_ERROR, failure_class_of_call
from nemo_gym.serving.request_guard import HTTPError
from nemo_gym.serving.server_client import ServerCallError

logger = logging.getLogger("nemo_gym")


def dumps(value: Any) -> bytes:
    """Serialize a JSON answer; pydantic models are dumped first, by their fields' wire names
    (aliases) as FastAPI answers them (``_ng_rollout_index`` for ``rollout_index``)."""
    if isinstance(value, BaseModel):
        if type(value).model_dump is _MODEL_DUMP:
            # What pydantic's own model_dump calls, without that call in between.
            value = value.__pydantic_serializer__.to_python(value, mode="json", by_alias=True)
        else:
            parts = getattr(type(value), "__ng_json_parts__", None)
            if parts is not None and (json_form := parts(value)) is not None:
                # A model holding plain dicts received as JSON (a verify answer's ``response``):
                # orjson writes them as they are, instead of pydantic rebuilding them first.
                # Only plain JSON values are written so (anything else is refused, and the
                # model is dumped by pydantic below), so the bytes say what pydantic's form says.
                try:
                    return orjson.dumps(json_form, option=_PLAIN_JSON_ONLY, default=_not_plain_json)
                except orjson.JSONEncodeError:
                    pass
            value = value.model_dump(mode="json", exclude_unset=False, by_alias=True)
    try:
        # Without options first: string keys and no numpy (the usual answer) are written ~40%
        # faster so, and to the same bytes; anything else is refused and written below.
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return orjson.dumps(value, option=_DUMP_OPTIONS)


_MODEL_DUMP = BaseModel.model_dump
_PLAIN_JSON_ONLY = (
    orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def _not_plain_json(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not plain JSON")


_DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


class JSONAnswer(Response):
    """A starlette ``Response`` of JSON bytes, built without the general constructor's steps
    (media type and header rendering): the same attributes and headers, in the same order."""

    media_type = "application/json"

    def __init__(self, body: bytes, status_code: int = 200) -> None:
        self.status_code = status_code
        self.media_type = "application/json"
        self.background = None
        self.body = body
        if status_code < 200 or status_code in (204, 304):
            self.raw_headers = [(b"content-type", b"application/json")]
        else:
            self.raw_headers = [
                (b"content-length", b"%d" % len(body)),
                (b"content-type", b"application/json"),
            ]


def json_response(value: Any, status_code: int = 200) -> Response:
    """A JSON response serialized with orjson."""
    return JSONAnswer(dumps(value), status_code)


# Statuses from a downstream server that mean the request it got was malformed (the caller's
# input passed through), answered as such instead of as an infrastructure 502.
CALLER_FAULT_STATUSES = frozenset({400, 413, 422})


def validation_error_body(exc: ValidationError, server: str, where: str = "body") -> dict[str, Any]:
    """A 422 body listing each invalid field by its path."""
    errors = [
        {"field": ".".join(str(p) for p in err["loc"]) or where, "message": err["msg"], "type": err["type"]}
        for err in exc.errors()
    ]
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    return {"error": f"invalid {where}: {summary}", "server": server, "detail": errors}


def error_response(exc: Exception, server_name: str, method: str = "", path: str = "") -> Response:
    """The JSON answer for an exception a handler raised, classified.

    A validation error is a 422 listing the fields; an :class:`HTTPError` keeps its status; a
    downstream server refusing what the caller sent is a 4xx naming it; any other downstream
    failure is a 502 carrying its ``failure_class`` (so the collector files the rollout as an
    infrastructure failure, never a reward); anything else is a JSON 500 naming the server.
    """
    if isinstance(exc, ValidationError):
        return json_response(validation_error_body(exc, server_name), 422)
    if isinstance(exc, HTTPError):
        return json_response({"error": exc.message, "server": server_name, **exc.extra}, exc.status_code)
    if isinstance(exc, ServerCallError):
        if exc.kind == HTTP_ERROR and exc.status in CALLER_FAULT_STATUSES:
            # The server downstream refused what the caller sent (a bad parameter passed
            # through): the caller's mistake, so a 4xx naming the upstream, not a 502.
            upstream_error = exc.body.get("error") if isinstance(exc.body, dict) else None
            if isinstance(upstream_error, dict):
                upstream_error = upstream_error.get("message")
            return json_response(
                {
                    "error": f"{exc.server} rejected the request: {upstream_error or exc}",
                    "server": server_name,
                    "upstream": exc.server,
                    "upstream_status": exc.status,
                },
                exc.status or 400,
            )
        # A server this one depends on failed: answer 502 and keep its failure class, so
        # the collector files the rollout correctly instead of as this server's bug.
        upstream = exc.body.get("failure_class") if isinstance(exc.body, dict) else None
        failure_class = upstream or failure_class_of_call(exc.kind)
        body = {
            "error": str(exc),
            "server": server_name,
            "upstream": exc.server,
            "failure_class": failure_class,
        }
        return json_response(body, 502)
    if isinstance(exc, aiohttp.ClientResponseError):
        # A NeMo Gym-style call to another endpoint answered with an error status.
        body = {
            "error": f"an upstream call failed: HTTP {exc.status}: {exc.message}",
            "server": server_name,
            "failure_class": UPSTREAM_ERROR,
        }
        return json_response(body, 502)
    logger.error("%s: %s %s failed", server_name, method, path, exc_info=exc)
    return json_response({"error": f"{type(exc).__name__}: {exc}", "server": server_name}, 500)


def json_error_handlers(server_name: str) -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    """Starlette exception handlers that answer every error as JSON naming the server.

    404/405 name the method and path; an :class:`HTTPError` (a body too large or too slow, from
    the request guard) keeps its status; anything else is a JSON 500, never plain text.
    """

    async def no_such_route(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        what = "no route" if status == 404 else "method not allowed for"
        return json_response(
            {"error": f"{what} {request.method} {request.url.path}", "server": server_name}, status
        )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPError)
        return json_response({"error": exc.message, "server": server_name, **exc.extra}, exc.status_code)

    async def internal_error(request: Request, exc: Exception) -> Response:
        return json_response({"error": f"{type(exc).__name__}: {exc}", "server": server_name}, 500)

    return {404: no_such_route, 405: no_such_route, HTTPError: http_error, Exception: internal_error}
