"""Exact-path routes answered straight from ASGI, without starlette's per-request layers.

Every hop of a rollout (a model call, a tool call, ``/seed_session``, ``/verify``, ``/run``) is a
POST to a fixed path of a route built by :meth:`BaseServer.endpoint`, which already parses the
body, catches every failure and answers JSON itself. Starlette adds, per request, two exception
middlewares, the router's scan of every route, a ``Request`` object and two more wrappers around
each message sent: fixed work that is a good part of a small hop's CPU. :class:`DirectRoutes`
sends such requests to the endpoint's ASGI form (``endpoint._ng_asgi``) by a dictionary lookup
and leaves everything else (other methods, paths with parameters, mounts, 404/405) to the
starlette app, unchanged.

A route is taken only when no route before it (one with path parameters, a mount) could match
its path: starlette picks the first route that matches, and a direct route must never answer a
request starlette would have given to another route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.requests import cookie_parser
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.serving.protocol import SESSION_COOKIE

AsgiEndpoint = Callable[[Scope, Receive, Send], Awaitable[None]]


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the caller disconnected before sending all of it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def session_cookie(scope: Scope) -> str | None:
    """The session id the request's (first) ``Cookie`` header carries, as starlette reads it."""
    for name, value in scope["headers"]:
        if name == b"cookie":
            return cookie_parser(value.decode("latin-1")).get(SESSION_COOKIE)
    return None


def direct_endpoints(routes: Iterable[Any]) -> dict[tuple[str, str], AsgiEndpoint]:
    """``(method, path) -> ASGI endpoint`` for the exact-path routes that have one and that no
    route before them could take (starlette serves the first route that matches)."""
    found: dict[tuple[str, str], AsgiEndpoint] = {}
    patterns: list[Any] = []  # the paths of earlier routes with parameters, and of mounts
    for route in routes:
        if isinstance(route, Route) and not route.param_convertors:
            shadowed = any(pattern.match(route.path) for pattern in patterns)
            asgi = getattr(route.endpoint, "_ng_asgi", None)
            for method in route.methods or ():
                key = (method, route.path)
                if asgi is not None and method != "HEAD" and not shadowed:
                    found.setdefault(key, asgi)
                else:
                    # A plain route (or HEAD, or a path an earlier route may take) claims its
                    # path for this method: nothing later may take it.
                    found.setdefault(key, _UNTAKEN)
        elif isinstance(route, (Route, Mount)):
            patterns.append(route.path_regex)  # whatever its methods: a path it matches is not taken
        else:
            break  # a route matched by something else than its path (a host): nothing after is taken
    return {key: value for key, value in found.items() if value is not _UNTAKEN}


async def _untaken(scope: Scope, receive: Receive, send: Send) -> None:  # pragma: no cover - never called
    raise AssertionError("a placeholder endpoint was served")


_UNTAKEN: AsgiEndpoint = _untaken


class DirectRoutes:
    """ASGI app: requests for :func:`direct_endpoints` go straight to them, the rest to ``app``."""

    def __init__(self, app: ASGIApp, routes: Iterable[Any]) -> None:
        self.app = app
        self.endpoints = direct_endpoints(routes)
        # The same routes' steps after the body is read (``BaseServer.endpoint``'s), for the
        # lean protocol's direct serving (:mod:`nemo_gym.serving.direct_serve`).
        self.answers: dict[tuple[str, str], Callable[..., Awaitable[Any]]] = {
            key: asgi._ng_answer  # type: ignore[attr-defined]
            for key, asgi in self.endpoints.items()
            if hasattr(asgi, "_ng_answer")
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            endpoint = self.endpoints.get((scope["method"], scope["path"]))
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await self.app(scope, receive, send)
