"""NeMo Gym's server-class style on our server base: FastAPI apps from ``setup_webserver()``.

NeMo Gym environments build their app by calling the parent's ``setup_webserver()`` and adding
routes (``app.post("/tool")(self.tool)``); FastAPI binds each route's body, ``Request`` and
other parameters from the method's annotations. This module holds the pieces of that style:

- :func:`default_app`: the app a base class's ``setup_webserver()`` returns: session
  middleware (``request.session[SESSION_ID_KEY]``, also what ``self.session`` reads), the
  server kind's own routes, and any ``@tool`` methods;
- :func:`add_liveness`, :func:`add_exception_handling`: ``setup_liveness(app)`` and
  ``setup_exception_middleware(app)`` (our error shapes and failure classification);
- :func:`finish_app`: what serving a NeMo Gym-style class adds before the request guard,
  prefix stripping and auth wrap it, as NeMo Gym's launcher adds liveness and error handling.

FastAPI is imported only by classes that use this style: our own servers never load it.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.serving.error_answers import error_response, json_response, validation_error_body
from nemo_gym.serving.protocol import SESSION_COOKIE, SESSION_SCOPE_KEY
from nemo_gym.serving.request_context import _current_session_id
from nemo_gym.serving.request_guard import HTTPError

if TYPE_CHECKING:
    from fastapi import FastAPI

SESSION_ID_KEY = SESSION_COOKIE
_LIVENESS_PATHS = ("/", "/health", "/healthz", "/livez", "/readyz")


class SessionIdMiddleware:
    """ASGI middleware inside starlette's ``SessionMiddleware``: every request gets a session id.

    The id is kept in the signed session cookie under ``SESSION_ID_KEY`` (NeMo Gym's
    ``request.session[SESSION_ID_KEY]``) and made the current session for ``self.session``.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session = scope["session"]
        # Assigned every time (not setdefault): starlette re-sends the cookie only for a
        # session marked modified, and a caller without a cookie jar needs it each answer.
        # An in-process call (an MCP tool call run through the tool's own route) names its
        # session in the scope, which nothing from the wire can set.
        session[SESSION_ID_KEY] = (
            scope.get(SESSION_SCOPE_KEY) or session.get(SESSION_ID_KEY) or uuid.uuid4().hex
        )
        token = _current_session_id.set(session[SESSION_ID_KEY])
        try:
            await self.app(scope, receive, send)
        finally:
            _current_session_id.reset(token)


def add_session_middleware(server: Any, app: FastAPI) -> None:
    """Per-rollout session ids in a signed cookie named by ``get_session_middleware_key()``."""
    from starlette.middleware.sessions import SessionMiddleware

    if getattr(app.state, "nemo_gym_session_middleware_installed", False):
        return
    app.state.nemo_gym_session_middleware_installed = True
    app.add_middleware(SessionIdMiddleware)
    # The signing key is random per process: a client cannot forge another rollout's cookie.
    app.add_middleware(
        SessionMiddleware,
        secret_key=secrets.token_hex(32),
        session_cookie=server.get_session_middleware_key(),  # type: ignore[attr-defined]
        same_site="strict",
    )


def new_app(server: Any) -> FastAPI:
    """An empty FastAPI app with the session middleware, as a base ``setup_webserver()`` starts."""
    from fastapi import FastAPI

    app = FastAPI(title=server.name)
    add_session_middleware(server, app)
    return app


def add_liveness(app: FastAPI) -> None:
    """``GET /`` (and ``/health``, ``/healthz``, ``/livez``, ``/readyz``) answering ``{"status": "ok"}``."""
    taken = {getattr(route, "path", None) for route in app.router.routes}

    async def liveness() -> dict[str, str]:
        return {"status": "ok"}

    for path in _LIVENESS_PATHS:
        if path not in taken:
            app.get(path, include_in_schema=False)(liveness)


def add_exception_handling(server: Any, app: FastAPI) -> None:
    """Answer every failure as our JSON error naming the server, classified.

    A body that fails validation is a 422 listing each field (FastAPI's ``detail`` entries, each
    with our ``field``/``message`` added); a downstream server's failure is a 502 with its
    ``failure_class`` (an infrastructure failure, never a reward); an ``HTTPException`` an
    environment raises keeps its status and ``detail``; anything else is a JSON 500.
    """
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    name = server.name

    async def invalid_body(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        detail = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ())]
            field = ".".join(loc[1:] if loc[:1] == ["body"] else loc) or "body"
            detail.append({**_jsonable(err), "field": field, "message": err.get("msg", "")})
        summary = "; ".join(f"{d['field']}: {d['message']}" for d in detail[:5])
        return json_response({"error": f"invalid body: {summary}", "server": name, "detail": detail}, 422)

    async def http_exception(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code in (404, 405) and exc.detail in ("Not Found", "Method Not Allowed"):
            what = "no route" if exc.status_code == 404 else "method not allowed for"
            message = f"{what} {request.method} {request.url.path}"
        else:
            message = str(exc.detail)
        body = {"error": message, "server": name, "detail": exc.detail}
        return json_response(body, exc.status_code)

    async def any_error(request: Request, exc: Exception) -> Response:
        return error_response(exc, name, request.method, request.url.path)

    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(HTTPException, http_exception)
    if not getattr(app.state, "nemo_gym_error_middleware_installed", False):
        app.state.nemo_gym_error_middleware_installed = True
        app.add_middleware(CatchErrors, server_name=name)


class CatchErrors:
    """ASGI middleware: an exception a route let escape becomes our classified JSON answer.

    Inside the app's own exception middleware, so ``HTTPException`` handlers still apply;
    outside the routes, so a ``ServerCallError`` from a downstream call is a 502 with its
    failure class and a ``ValidationError`` raised in a handler a 422.
    """

    def __init__(self, app: ASGIApp, server_name: str) -> None:
        self.app = app
        self.server_name = server_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a JSON error naming the server
            from starlette.exceptions import HTTPException

            if started or isinstance(exc, HTTPException):
                raise
            response = error_response(exc, self.server_name, scope.get("method", ""), scope.get("path", ""))
            await response(scope, receive, send)


def needs_fastapi(handler: Any) -> bool:
    """Whether a route method takes what only FastAPI binds (a ``Request``, several parameters)."""
    import inspect
    import typing

    try:
        params = [p for p in inspect.signature(handler).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return False
    if len(params) > 1:
        return True
    try:
        hints = typing.get_type_hints(handler)
    except Exception:  # noqa: BLE001 - unresolvable annotations: judge by the parameter count
        return False
    return any(inspect.isclass(hints.get(p.name)) and issubclass(hints[p.name], Request) for p in params)


def finish_app(server: Any, app: FastAPI) -> FastAPI:
    """What serving a NeMo Gym-style app adds: liveness routes and our error handling."""
    add_liveness(app)
    add_exception_handling(server, app)
    return app


def verify_route(server: Any, call: Callable[..., Awaitable[Any]] | None = None) -> Any:
    """The ``/verify`` endpoint of a resources server's FastAPI app.

    Validates the body into the verify method's request model (dropping what verify itself
    produces, so a recorded rollout replayed through ``/verify`` is scored afresh), calls
    ``verify`` (or ``call``, given verify's arguments), and frees the rollout's ``self.session``
    state afterwards. A ready response (NeMo Gym's ``judge_failsafe`` answer) is sent as it is.
    """
    import inspect

    from nemo_gym.serving.request_guard import parse_json_object

    # A verify that also takes the ``Request`` (NeMo Gym's FastAPI binding) gets it first.
    params = [p for p in inspect.signature(server.verify).parameters.values() if p.name != "self"]
    takes_request = len(params) > 1

    verify = call or server.verify

    async def endpoint(request: Request) -> Response:
        raw = await request.body()
        data: dict[str, Any] | None
        try:
            data = parse_json_object(raw)
        except HTTPError as exc:
            data = _lenient_json(raw) if exc.status_code == 400 else None
            if data is None:
                return json_response(
                    {"error": exc.message, "server": server.name, **exc.extra}, exc.status_code
                )
        request_model, produced = server._verify_models()
        fresh = {k: v for k, v in data.items() if k not in produced}
        try:
            body = request_model.model_validate(fresh)
        except ValidationError as exc:
            return json_response(validation_error_body(exc, server.name), 422)
        try:
            result = await (verify(request, body) if takes_request else verify(body))
            return result if isinstance(result, Response) else json_response(result)
        finally:
            session_id = _current_session_id.get()
            if session_id is not None:
                server.sessions.free(session_id)

    endpoint.__name__ = "verify"
    return endpoint


def _lenient_json(raw: bytes) -> dict[str, Any] | None:
    """A JSON object orjson refused only for a lone surrogate escape (``\\udcff``), as FastAPI's
    parser accepts it: model text relayed by a client can carry one."""
    import json

    if b"\\ud" not in raw.lower():
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _jsonable(err: dict[str, Any]) -> dict[str, Any]:
    # pydantic puts the exception object in ``ctx`` for some errors: keep the text only.
    out = {k: v for k, v in err.items() if k not in ("ctx", "url", "input")}
    if "ctx" in err:
        out["ctx"] = {k: str(v) for k, v in err["ctx"].items()}
    return out


class DisconnectCancellation:
    """ASGI middleware: a request's handler is cancelled when its client disconnects (NeMo Gym's
    ``ClientDisconnectCancellationMiddleware``, added by ``setup_cancellation_middleware``), so
    an abandoned call stops its downstream work instead of finishing for nobody."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        import asyncio

        inbox: asyncio.Queue[Any] = asyncio.Queue()
        handler = asyncio.ensure_future(self.app(scope, inbox.get, send))
        disconnected = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                await inbox.put(message)
                if message["type"] == "http.disconnect":
                    disconnected.set()
                    handler.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            await handler
        except asyncio.CancelledError:
            if not disconnected.is_set():
                raise  # cancelled from outside, not by the client leaving
        finally:
            watcher.cancel()
