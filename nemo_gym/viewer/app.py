"""The viewer's web app and ``ng_viewer``: JSON APIs for each page plus the static page itself.

``ng_viewer +input=<rollouts.jsonl>[,<more.jsonl>] [+port=0] [+host=127.0.0.1]
[+tokenizer=<HF tokenizer>] [+turn_end_token_ids=[...]] [+solved_threshold=1.0]``

Routes (``c`` is the collection's position in ``+input``):

- ``GET /`` the page (``static/index.html``; plots are inline SVG drawn by ``static/app.js``)
- ``GET /api/collections``, ``GET /api/overview?c=``, ``GET /api/tasks?c=&agent=&min=&max=
  &status=&q=&sort=&offset=&limit=``, ``GET /api/rollout?c=&row=``, ``GET /api/tokens?c=&row=``,
  ``GET /api/compare?a=&b=&show=&offset=&limit=``

Auth follows every nemo_gym server: when ``NEMO_GYM_AUTH_TOKEN`` is set, every request must
carry it. A browser cannot add an ``Authorization`` header to a page load, so the viewer also
accepts it once as ``?token=`` on the page (answered with an HttpOnly same-site cookie and a
redirect that drops it from the address bar) and from that cookie afterwards.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, load_config
from nemo_gym.serving.access_guard import AccessGuard
from nemo_gym.serving.protocol import AUTH_HEADER, auth_token
from nemo_gym.viewer.collection import Collection, ViewerInputError
from nemo_gym.viewer.compare import compare
from nemo_gym.viewer.tokens import TokenDecoder, load_tokenizer, token_view

__all__ = ["TOKEN_COOKIE", "Viewer", "build_app", "ng_viewer"]

TOKEN_COOKIE = "ng_viewer_token"
_SERVER_NAME = "ng_viewer"
_STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css"}
# Refresh a growing file at most this often (each refresh is one stat, plus the new lines).
_REFRESH_EVERY_S = 0.5


def _json(value: Any, status_code: int = 200) -> Response:
    def default(obj: Any) -> Any:
        if isinstance(obj, float) and math.isnan(obj):
            return None
        raise TypeError

    return Response(
        orjson.dumps(value, default=default, option=orjson.OPT_NON_STR_KEYS),
        status_code=status_code,
        media_type="application/json",
    )


def _error(message: str, status_code: int) -> Response:
    return _json({"error": message, "server": _SERVER_NAME}, status_code)


@dataclass
class Viewer:
    """The viewer's state: the open collections and the optional tokenizer."""

    collections: list[Collection]
    tokenizer: TokenDecoder | None = None
    turn_end_token_ids: list[int] = field(default_factory=list)
    _refreshed_at: dict[int, float] = field(default_factory=dict)

    def collection(self, request: Request, name: str = "c") -> Collection:
        """The collection a query parameter names (default 0), refreshed if it grew."""
        number = _int_param(request, name, 0)
        if not 0 <= number < len(self.collections):
            raise ViewerInputError(
                f"{name}={number}: no such collection (there are {len(self.collections)}, numbered from 0)",
                404,
            )
        return self.get(number)

    def get(self, number: int) -> Collection:
        """Collection ``number``, refreshed if its file grew (at most every half second)."""
        collection = self.collections[number]
        now = time.monotonic()
        if now - self._refreshed_at.get(number, 0.0) >= _REFRESH_EVERY_S:
            collection.refresh()
            self._refreshed_at[number] = now
        return collection


def _int_param(request: Request, name: str, default: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ViewerInputError(f"query parameter {name!r} is required")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ViewerInputError(f"query parameter {name}={raw!r} must be an integer") from None


def _float_param(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ViewerInputError(f"query parameter {name}={raw!r} must be a number") from None
    if math.isnan(value):
        raise ViewerInputError(f"query parameter {name} must be a number, not NaN")
    return value


def _api(handler: Callable[[Request], Any]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return _json(handler(request))
        except ViewerInputError as exc:
            return _error(str(exc), exc.status_code)
        except FileNotFoundError as exc:
            return _error(f"the rollouts file went away: {exc}", 410)

    return endpoint


# Rollouts are untrusted text: the page loads nothing but its own files, and images only from
# data: URLs, so no row can make the browser fetch a remote URL or run a script.
_PAGE_CSP = (
    "default-src 'self'; img-src 'self' data:; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; media-src 'none'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


def _static(name: str) -> Response:
    data = resources.files("nemo_gym.viewer").joinpath("static", name).read_bytes()
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    if name == "index.html":
        headers["Content-Security-Policy"] = _PAGE_CSP
    return Response(data, media_type=_STATIC_TYPES[Path(name).suffix], headers=headers)


def build_app(
    viewer: Viewer, token: str | None = None, host: str | None = None, allowed_hosts: list[str] | None = None
) -> ASGIApp:
    """The viewer's ASGI app; ``token`` (default: ``NEMO_GYM_AUTH_TOKEN``) guards every route.

    Behind the access guard too: a Host other than the viewer's own names (``host``, loopback,
    ``allowed_hosts``) is refused (DNS rebinding would otherwise read every rollout), and so is a
    cross-site Origin.
    """

    def collections(request: Request) -> Any:
        return {"collections": [viewer.get(n).summary() for n in range(len(viewer.collections))]}

    def overview(request: Request) -> Any:
        return viewer.collection(request).overview()

    def tasks(request: Request) -> Any:
        params = request.query_params
        return viewer.collection(request).tasks(
            agent=params.get("agent") or None,
            min_reward=_float_param(request, "min"),
            max_reward=_float_param(request, "max"),
            status=params.get("status") or "any",
            search=params.get("q") or "",
            sort=params.get("sort") or "task",
            offset=_int_param(request, "offset", 0),
            limit=_int_param(request, "limit", 100),
        )

    def rollout(request: Request) -> Any:
        return viewer.collection(request).rollout(_int_param(request, "row"))

    def tokens(request: Request) -> Any:
        collection = viewer.collection(request)
        row = _int_param(request, "row")
        page = collection.rollout(row)
        data = page["data"]
        view = token_view(data, tokenizer=viewer.tokenizer, turn_end_token_ids=viewer.turn_end_token_ids)
        return {"row": row, "task": page["task"], "repeats": page["repeats"], **view}

    def compare_page(request: Request) -> Any:
        a = viewer.collection(request, "a")
        b = viewer.collection(request, "b")
        return compare(
            a,
            b,
            show=request.query_params.get("show") or "all",
            offset=_int_param(request, "offset", 0),
            limit=_int_param(request, "limit", 100),
        )

    async def page(request: Request) -> Response:
        return _static("index.html")

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ("app.js", "style.css"):
            return _error(f"no static file {name!r}", 404)
        return _static(name)

    async def no_route(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        what = "no route" if status == 404 else "method not allowed for"
        return _error(f"{what} {request.method} {request.url.path}", status)

    routes = [
        Route("/", page),
        Route("/static/{name}", asset),
        Route("/api/collections", _api(collections)),
        Route("/api/overview", _api(overview)),
        Route("/api/tasks", _api(tasks)),
        Route("/api/rollout", _api(rollout)),
        Route("/api/tokens", _api(tokens)),
        Route("/api/compare", _api(compare_page)),
    ]
    app: ASGIApp = Starlette(routes=routes, exception_handlers={404: no_route, 405: no_route})
    token = token if token is not None else auth_token()
    if token:
        app = ViewerAuth(app, token)
    return AccessGuard(app, _SERVER_NAME, hosts=[host], allowed_hosts=allowed_hosts or ())


class ViewerAuth:
    """ASGI middleware: the shared token as ``Authorization: Bearer``, the viewer's cookie, or
    (on ``GET /`` only) ``?token=``, which sets the cookie and redirects to the bare page."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token
        self.bearer = f"Bearer {token}"

    def _accepted(self, request: Request) -> bool:
        header = request.headers.get(AUTH_HEADER, "")
        cookie = request.cookies.get(TOKEN_COOKIE, "")
        return hmac.compare_digest(header.encode(), self.bearer.encode()) or hmac.compare_digest(
            cookie.encode(), self.token.encode()
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if self._accepted(request):
            await self.app(scope, receive, send)
            return
        offered = request.query_params.get("token", "")
        if request.url.path == "/" and offered and hmac.compare_digest(offered.encode(), self.token.encode()):
            response: Response = RedirectResponse("/", status_code=303)
            response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict")
        else:
            response = _error(
                "missing or wrong auth token: open the URL ng_viewer printed (it carries ?token=), "
                "or send Authorization: Bearer $NEMO_GYM_AUTH_TOKEN",
                401,
            )
        await response(scope, receive, send)


def _inputs(config: dict[str, Any]) -> list[Path]:
    raw = config.get("input") or config.get("input_jsonl_fpath")
    if not raw:
        raise ConfigError("+input=<rollouts.jsonl>[,<more.jsonl>] is required (the collection's output file)")
    items = raw if isinstance(raw, list) else str(raw).split(",")
    paths = [Path(str(item).strip()) for item in items if str(item).strip()]
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"+input: {path} is not a file (pass the rollouts JSONL a collection wrote)")
    return paths


def _main(argv: list[str]) -> int:
    """Serve the viewer over ``+input``; its options are in ``ng_viewer --help``."""
    from nemo_gym.serving.server import bind_socket, make_uvicorn_server

    config = load_config(argv)
    paths = _inputs(config)
    threshold = config.get("solved_threshold", 1.0)
    if not isinstance(threshold, int | float) or isinstance(threshold, bool):
        raise ConfigError(f"+solved_threshold must be a number, got {threshold!r}")
    turn_end = config.get("turn_end_token_ids") or []
    if not isinstance(turn_end, list) or not all(isinstance(t, int) for t in turn_end):
        raise ConfigError(f"+turn_end_token_ids must be a list of integer token IDs, got {turn_end!r}")
    tokenizer = None
    if config.get("tokenizer"):
        try:
            tokenizer = load_tokenizer(str(config["tokenizer"]))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    collections = []
    for path in paths:
        started = time.perf_counter()
        collection = Collection.open(path, solved_threshold=float(threshold))
        print(
            f"Opened {path}: {len(collection.index)} rollouts, {len(collection.tasks_by_key)} tasks "
            f"in {time.perf_counter() - started:.2f}s",
            flush=True,
        )
        collections.append(collection)
    viewer = Viewer(collections=collections, tokenizer=tokenizer, turn_end_token_ids=list(turn_end))
    host, port = str(config.get("host", "127.0.0.1")), int(config.get("port", 0))
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        raise ConfigError(str(exc)) from None
    bound_port = sock.getsockname()[1]
    token = auth_token()
    url = f"http://{host}:{bound_port}/" + (f"?token={quote(token)}" if token else "")
    print(f"Viewer: {url}  (Ctrl-C to stop)", flush=True)
    extra = config.get("allowed_hosts") or []
    extra = extra.split(",") if isinstance(extra, str) else [str(h) for h in extra]
    server = make_uvicorn_server(build_app(viewer, token, host=host, allowed_hosts=extra))
    asyncio.run(server.serve(sockets=[sock]))
    return 0


ng_viewer = console_command(_main, "ng_viewer")


if __name__ == "__main__":
    ng_viewer(sys.argv[1:])
