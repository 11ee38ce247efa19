"""A resources server's tools over MCP (streamable HTTP), per rollout session.

With ``expose_tools_over_mcp: true`` in its config, a resources server also serves its tools at
``/mcp`` (the official ``mcp`` package's streamable HTTP transport), and ``/seed_session``
answers an ``mcp`` key as NeMo Gym does::

    {"mcp": {"server_name": "...", "url_path": "/mcp", "transport": "http",
             "headers": {"X-NeMo-Gym-Session-Token": "<signed token>"}}}

An MCP client that sends those headers calls the tools of that rollout's session: the token
names the session (signed by this server, so it cannot be forged), and each ``tools/call`` is
answered by the server's own ``POST /<tool>`` route, run in-process with that session's
cookie. An MCP tool call therefore sees exactly the state a plain ``POST /<tool>`` with the
cookie sees, validation and error answers included, and ``/verify`` scores both alike.

The route sits behind everything the server puts in front of its routes (the request guard's
size and time limits, the auth token, the ``/ng-rollout/<id>`` prefix).

What a caller gets when something is wrong, as an MCP error result (``isError``), never a
crash and never a lost session: an unknown tool (the text lists the tools), bad arguments (the
422's field list), a missing or forged token, a session already verified or expired (seed
again), a tool that failed (its HTTP status and error).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import importlib.metadata
import inspect
import json
import logging
import secrets
import typing
from collections.abc import Callable, MutableMapping
from typing import Any

import mcp.types as types
from mcp.server.lowlevel import Server as LowLevelServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Receive, Scope, Send

from nemo_gym.agents.hop_faults import status_failure_class
from nemo_gym.serving.answered_errors import KeepAnsweredErrors
from nemo_gym.serving.protocol import (
    MCP_FAILURE_CLASS_META,
    MCP_METADATA_KEY,
    MCP_SESSION_TOKEN_HEADER,
    MCP_URL_PATH,
    RESERVED_MCP_TOOL_NAMES,
    SESSION_COOKIE,
    SESSION_SCOPE_KEY,
    normalize_tool_name,
)
from nemo_gym.serving.server import body_model

logger = logging.getLogger("nemo_gym")

# NeMo Gym's names for the same wire constants.
NEMO_GYM_MCP_SESSION_TOKEN_HEADER = MCP_SESSION_TOKEN_HEADER
NEMO_GYM_MCP_METADATA_KEY = MCP_METADATA_KEY
TOKEN_HEADER = MCP_SESSION_TOKEN_HEADER
PERMISSIVE_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": True}
_NO_BROWSER_CHECKS = TransportSecuritySettings(enable_dns_rebinding_protection=False)
_TOOL_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

__all__ = [
    "CatchAll",
    "MCPTool",
    "McpExposure",
    "NEMO_GYM_MCP_METADATA_KEY",
    "NEMO_GYM_MCP_SESSION_TOKEN_HEADER",
    "TOKEN_HEADER",
    "install_auto_exposure",
    "maybe_auto_expose",
    "normalize_tool_name",
]


class MCPTool(BaseModel):
    """One tool as MCP advertises it (``tool``) and the route that answers it (``path``)."""

    model_config = {"arbitrary_types_allowed": True}

    name: str
    tool: types.Tool
    path: str


class _Token:
    """Signed per-rollout session tokens: ``base64url(json claims).base64url(hmac-sha256)``.

    The key is random per server process: a token is good for the process whose sessions it
    names (session state lives in that process too).
    """

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def mint(self, session_id: str, tools: list[str] | None) -> str:
        claims = _b64(json.dumps({"sid": session_id, "tools": tools}, separators=(",", ":")).encode())
        return f"{claims}.{self._sign(claims)}"

    def read(self, token: str) -> tuple[str, frozenset[str] | None]:
        """``(session id, allowed tools or None)``; ``ValueError`` for a malformed or forged token."""
        claims, _, signature = token.partition(".")
        if not claims or not hmac.compare_digest(signature, self._sign(claims)):
            raise ValueError(
                f"invalid {MCP_SESSION_TOKEN_HEADER} (not issued by this server's /seed_session)"
            )
        payload = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
        tools = payload.get("tools")
        return str(payload["sid"]), None if tools is None else frozenset(tools)

    def _sign(self, claims: str) -> str:
        return _b64(hmac.new(self._key, claims.encode(), hashlib.sha256).digest())


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _description(handler: Callable[..., Any]) -> str | None:
    doc = inspect.getdoc(handler)
    return doc.split("\n\n", 1)[0].strip() or None if doc else None


def harvest_tools(server: Any) -> list[MCPTool]:
    """The server's tools (methods marked ``@tool``), with their argument schemas and docstrings."""
    harvested = []
    for name, handler in server.tools().items():
        model = body_model(handler)
        schema = model.model_json_schema() if model is not None else dict(PERMISSIVE_SCHEMA)
        tool = types.Tool(name=name, description=_description(handler), inputSchema=schema)
        harvested.append(MCPTool(name=name, tool=tool, path=f"/{name}"))
    return harvested


def harvest_app_tools(app: Any) -> list[MCPTool]:
    """A FastAPI app's tools: its POST routes with a fixed path, other than the built-in ones,
    each with its body model's JSON Schema (any JSON object for a ``dict`` body)."""
    from fastapi.routing import APIRoute

    harvested = []
    for route in app.router.routes:
        if not isinstance(route, APIRoute) or "POST" not in (route.methods or ()) or "{" in route.path:
            continue
        name = route.path.lstrip("/")
        if name in RESERVED_MCP_TOOL_NAMES or route.path == MCP_URL_PATH:
            continue
        model = _body_model_of(route.endpoint)
        schema = model.model_json_schema() if model is not None else dict(PERMISSIVE_SCHEMA)
        description = (route.description or route.summary or "").strip().split("\n\n", 1)[0] or None
        tool = types.Tool(name=name, description=description, inputSchema=schema)
        harvested.append(MCPTool(name=name, tool=tool, path=route.path))
    return harvested


class CatchAll:
    """The one ``POST /{name}`` route of a FastAPI app, handed to ``mcp_tools(harvested, catchall)``.

    ``catchall.tool(name, input_schema, description)`` makes a tool that route answers (NeMo
    Gym's dispatcher servers keep their per-tool schemas in data): a call posts to ``/<name>``.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def of(cls, app: Any, server: Any) -> CatchAll | None:
        """The app's catch-all route, if it has exactly one (two are ambiguous: an error)."""
        from fastapi.routing import APIRoute

        paths = [
            r.path
            for r in app.router.routes
            if isinstance(r, APIRoute)
            and "POST" in (r.methods or ())
            and "{" in r.path
            and "/" not in r.path[1:]
        ]
        if len(paths) > 1:
            raise ValueError(
                f"{type(server).__name__} has several catch-all routes {sorted(paths)}; MCP cannot tell which "
                "answers a tool: keep one, or set expose_tools_over_mcp: false"
            )
        return cls(paths[0]) if paths else None

    def tool(
        self, name: str, input_schema: dict[str, Any] | None = None, description: str | None = None
    ) -> MCPTool:
        """A tool named ``name`` answered by the catch-all route."""
        schema = input_schema or dict(PERMISSIVE_SCHEMA)
        return MCPTool(
            name=name,
            tool=types.Tool(name=name, description=description, inputSchema=schema),
            path=f"/{name}",
        )


def _body_model_of(endpoint: Callable[..., Any]) -> type[BaseModel] | None:
    try:
        hints = typing.get_type_hints(endpoint)
    except Exception:  # noqa: BLE001 - unresolvable annotations: any JSON object
        return None
    for name in inspect.signature(endpoint).parameters:
        hint = hints.get(name)
        if inspect.isclass(hint) and issubclass(hint, BaseModel):
            return hint
    return None


def _checked(server: Any, selected: list[MCPTool] | None) -> dict[str, MCPTool]:
    tools: dict[str, MCPTool] = {}
    owner = type(server).__name__
    for tool in selected or []:
        if not tool.name or not set(tool.name) <= _TOOL_NAME_CHARS:
            raise ValueError(
                f"{owner}: tool name {tool.name!r} cannot be served over MCP (use letters, digits, _ and -), "
                "or set expose_tools_over_mcp: false"
            )
        if tool.name in RESERVED_MCP_TOOL_NAMES:
            raise ValueError(
                f"{owner}: tool name {tool.name!r} clashes with a built-in route; rename the tool"
            )
        if tool.name in tools:
            raise ValueError(f"{owner}: two MCP tools are named {tool.name!r}")
        tools[tool.name] = tool
    return tools


class McpExposure:
    """The ``/mcp`` endpoint of one resources server and the tokens its ``/seed_session`` hands out.

    Built by the server base when ``expose_tools_over_mcp`` is set. ``routes()`` are added to
    the server's routes; ``seed_answer()`` adds the ``mcp`` key to a ``/seed_session`` answer.
    """

    def __init__(self, server: Any) -> None:
        self.server = server
        self._token = _Token()
        self._app: Any = None
        self._tools: dict[str, MCPTool] | None = None
        self._mcp = self._build_mcp_server()
        self._max_body_bytes = max(1, int(getattr(server.config, "max_body_bytes", 64 << 20)))

    @property
    def tools(self) -> dict[str, MCPTool]:
        """The exposed tools by name: the ``@tool`` methods, or on a FastAPI app (NeMo Gym's
        style) its typed POST routes as they are when first asked (every route added by then)."""
        if self._tools is None:
            catchall = None
            if self._app is not None:
                harvested, catchall = harvest_app_tools(self._app), CatchAll.of(self._app, self.server)
            else:
                harvested = harvest_tools(self.server)
            hook = getattr(self.server, "mcp_tools", None)
            self._tools = _checked(self.server, hook(harvested, catchall) if hook is not None else harvested)
        return self._tools

    # ---- /seed_session ----------------------------------------------------------------
    def metadata(self, session_id: str, seed_body: dict[str, Any]) -> dict[str, Any]:
        """The ``mcp`` value of a ``/seed_session`` answer for this session (NeMo Gym's shape)."""
        allowed_hook = getattr(self.server, "mcp_allowed_tools_for_session", None)
        allowed = allowed_hook(seed_body) if allowed_hook is not None else None
        return {
            "server_name": self.server.name,
            "url_path": MCP_URL_PATH,
            "transport": "http",
            "headers": {MCP_SESSION_TOKEN_HEADER: self._token.mint(session_id, allowed)},
        }

    def seed_answer(self, answer: Any, seed_body: Any) -> Any:
        """``answer`` (a seed_session result) with the ``mcp`` key added, the session opened."""
        session_id = self.server.session_id
        self.server.session  # noqa: B018 - opens the state, so the cookie is set and the token's session exists
        if isinstance(answer, BaseModel):
            answer = answer.model_dump(mode="json")
        if answer is None:
            answer = {}
        if not isinstance(answer, dict) or MCP_METADATA_KEY in answer:
            return answer
        body = seed_body.model_dump(mode="json") if isinstance(seed_body, BaseModel) else seed_body
        return {**answer, MCP_METADATA_KEY: self.metadata(session_id, body if isinstance(body, dict) else {})}

    # ---- /verify ----------------------------------------------------------------------
    def bare_tool_names(self, verify: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
        """``verify`` scoring function calls by their bare names.

        An MCP-native agent records this server's tools as ``mcp__<server>__<tool>``; verifiers
        compare bare names. The call is scored with bare names and the answer keeps the names
        the model emitted (matched by ``call_id``).
        """

        async def verify_bare(body: dict[str, Any]) -> Any:
            response = body.get("response")
            output = response.get("output") if isinstance(response, dict) else None
            emitted: dict[Any, str] = {}
            bare_output = []
            for item in output if isinstance(output, list) else []:
                name = (
                    item.get("name")
                    if isinstance(item, dict) and item.get("type") == "function_call"
                    else None
                )
                if isinstance(name, str) and normalize_tool_name(name, self.server.name) != name:
                    emitted[item.get("call_id")] = name
                    item = {**item, "name": normalize_tool_name(name, self.server.name)}
                bare_output.append(item)
            if not emitted:
                return await verify(body)
            assert isinstance(response, dict)
            answer = await verify({**body, "response": {**response, "output": bare_output}})
            if isinstance(answer, BaseModel):
                answer = answer.model_dump(mode="json")
            answered = answer.get("response") if isinstance(answer, dict) else None
            for item in answered.get("output") or [] if isinstance(answered, dict) else []:
                if (
                    isinstance(item, dict)
                    and item.get("type") == "function_call"
                    and item.get("call_id") in emitted
                ):
                    item["name"] = emitted[item["call_id"]]
            return answer

        return verify_bare

    # ---- a FastAPI app (NeMo Gym's style) ---------------------------------------------
    def install_on_app(self, app: Any) -> None:
        """Serve ``/mcp`` on the FastAPI app a ``setup_webserver()`` builds, and wrap its
        ``/seed_session`` route so the answer carries the ``mcp`` key.

        The tools are the app's POST routes when the first MCP request arrives, so routes a
        subclass adds after calling the parent's ``setup_webserver()`` are served too.
        """
        from fastapi.routing import APIRoute

        if any(getattr(route, "path", None) == MCP_URL_PATH for route in app.router.routes):
            raise ValueError(
                f"{type(self.server).__name__} already serves {MCP_URL_PATH}; set expose_tools_over_mcp: false"
            )
        self._app = app
        for index, route in enumerate(app.router.routes):
            if isinstance(route, APIRoute) and route.path == "/seed_session":
                app.post("/seed_session")(self._seed_endpoint(route.endpoint))
                app.router.routes[index] = app.router.routes.pop()  # same place, before any catch-all
                break
        # At the front: a catch-all POST /{name} route of the app must not shadow /mcp.
        app.router.routes[:0] = self.routes()

    def _seed_endpoint(self, endpoint: Callable[..., Any]) -> Callable[..., Any]:
        from fastapi.encoders import jsonable_encoder
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        # functools.wraps keeps the endpoint's signature, which FastAPI binds the body and
        # Request from; the answer is a ready response, so the route's response model (the
        # seed answer's own type) does not filter the ``mcp`` key out.
        @functools.wraps(endpoint)
        async def seed_session(*args: Any, **kwargs: Any) -> Any:
            if inspect.iscoroutinefunction(endpoint):
                result = await endpoint(*args, **kwargs)
            else:
                result = await run_in_threadpool(endpoint, *args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            body = next((v for v in kwargs.values() if isinstance(v, (BaseModel, dict))), {})
            answer = self.seed_answer(jsonable_encoder(result) if result is not None else {}, body)
            return JSONResponse(jsonable_encoder(answer))

        return seed_session

    # ---- /mcp -------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        """``/mcp`` (exact) and ``/mcp/...``, both answered by the MCP transport."""
        return [Route(MCP_URL_PATH, self, methods=["GET", "POST", "DELETE"]), Mount(MCP_URL_PATH, app=self)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Stateless transport: every MCP request is complete in itself (the rollout session is
        # the token's, not the transport's), so one manager per request runs for that request
        # only. Nothing outlives it, however the server is hosted (our serve(), a FastAPI app
        # under uvicorn, a test client), and nothing needs lifespan hooks to start or stop.
        manager = StreamableHTTPSessionManager(
            app=self._mcp,
            json_response=True,
            stateless=True,
            # The request guard in front bounds bodies; the SDK's own 4 MiB would refuse tool
            # arguments the same tool takes over plain HTTP.
            max_request_body_size=self._max_body_bytes,
            # Callers reach this port server-to-server by whatever host name routes there; the
            # server's own auth token and Host checks guard it, not a browser allowlist.
            security_settings=_NO_BROWSER_CHECKS,
        )
        async with manager.run():
            await manager.handle_request(scope, receive, send)

    def _build_mcp_server(self) -> LowLevelServer[Any, Any]:
        # A version given here spares every stateless request the SDK's default, a read of the
        # mcp package's metadata from disk (~1.5 ms a request, measured).
        mcp_server: LowLevelServer[Any, Any] = LowLevelServer(self.server.name, version=_nemo_gym_version())

        def claims(required: bool) -> tuple[str | None, frozenset[str] | None]:
            request = mcp_server.request_context.request
            token = request.headers.get(MCP_SESSION_TOKEN_HEADER) if request is not None else None
            if not token:
                if required:
                    raise ValueError(
                        f"missing {MCP_SESSION_TOKEN_HEADER} header: send the headers of the 'mcp' "
                        "answer of POST /seed_session"
                    )
                return None, None
            try:
                return self._token.read(token)
            except (ValueError, KeyError, json.JSONDecodeError) as exc:
                if required:
                    raise ValueError(
                        str(exc) if isinstance(exc, ValueError) else "malformed session token"
                    ) from None
                return None, None

        @mcp_server.list_tools()
        async def list_tools() -> list[types.Tool]:
            _, allowed = claims(required=False)
            return [t.tool for t in self.tools.values() if allowed is None or t.name in allowed]

        @mcp_server.call_tool(validate_input=False)
        async def call_tool(name: str, arguments: dict[str, Any]) -> Any:
            tool = self.tools.get(name)
            if tool is None:
                return _error(f"unknown tool {name!r}; this server's tools: {sorted(self.tools)}")
            session_id, allowed = claims(required=True)
            assert session_id is not None
            if allowed is not None and name not in allowed:
                return _error(f"tool {name!r} is not allowed in this session; allowed: {sorted(allowed)}")
            if session_id not in self.server.sessions:
                return _error(
                    "this rollout's session is closed (verified, expired or never opened): "
                    "POST /seed_session again for a new one"
                )
            request = mcp_server.request_context.request
            app = request.scope.get("app") if request is not None else None
            if app is None:
                raise RuntimeError("MCP request has no app in its scope")
            status, payload = await call_route(app, tool.path, session_id, arguments)
            if status == 422 and isinstance(payload, dict):
                return _error(f"invalid arguments for {name!r}: {payload.get('error', payload)}", payload)
            if not 200 <= status < 300:
                detail = payload.get("error", payload) if isinstance(payload, dict) else payload
                failed = _error(f"tool {name!r} failed (HTTP {status}): {detail}", payload)
                failure_class = status_failure_class(status, payload)
                if failure_class is not None:
                    # An infrastructure fault behind the tool, not the model's doing: named so an
                    # agent fails the rollout with this class, as for the same call over HTTP.
                    failed.meta = {MCP_FAILURE_CLASS_META: failure_class, "http_status": status}
                return failed
            text = payload if isinstance(payload, str) else json.dumps(payload)
            content = [types.TextContent(type="text", text=text)]
            return (content, payload) if isinstance(payload, dict) else content

        return mcp_server


def _nemo_gym_version() -> str:
    try:
        return importlib.metadata.version("nemo_gym")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _error(text: str, structured: Any = None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structuredContent=structured if isinstance(structured, dict) else None,
        isError=True,
    )


async def call_route(app: Any, path: str, session_id: str, arguments: dict[str, Any]) -> tuple[int, Any]:
    """``POST path`` with ``arguments`` to ``app`` in-process, in session ``session_id``.

    Exactly what a plain HTTP ``POST /<tool>`` carrying the session cookie runs (same route,
    validation, handler and error answers), without a socket. Returns ``(status, JSON or text)``.
    """
    raw = json.dumps(arguments).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
            (b"cookie", f"{SESSION_COOKIE}={session_id}".encode()),
        ],
        "client": ("127.0.0.1", 0),
        "server": ("mcp-in-process", 80),
        "state": {},
        # Only in-process callers can put keys in a scope: the session middleware of a FastAPI
        # app (NeMo Gym's style) takes the session from here, our own routes from the cookie.
        SESSION_SCOPE_KEY: session_id,
    }
    delivered = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await never.wait()  # the caller never disconnects; the MCP request's own cancel ends it
        return {"type": "http.disconnect"}

    status = 500
    chunks: list[bytes] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    # A handler's exception is answered (status and JSON error) like any other call's.
    await KeepAnsweredErrors(app)(scope, receive, send)
    body = b"".join(chunks)
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, body.decode(errors="replace")


def exposure_of(server: Any) -> McpExposure:
    """The server's :class:`McpExposure`, built on first use (one token key per server object)."""
    exposure = getattr(server, "_ng_mcp_exposure", None)
    if exposure is None:
        exposure = McpExposure(server)
        object.__setattr__(server, "_ng_mcp_exposure", exposure)
    return exposure


def install_auto_exposure(server: Any, app: Any = None) -> dict[str, MCPTool]:
    """Serve the server's tools over MCP; returns the tool map.

    ``app``: a FastAPI app from ``setup_webserver()`` (NeMo Gym's style) gets ``/mcp`` and the
    wrapped ``/seed_session`` unless it has them already; without an app, our server base adds
    ``/mcp`` to the routes it builds.
    """
    exposure = exposure_of(server)
    if app is not None and hasattr(app, "router") and exposure._app is not app:
        exposure.install_on_app(app)
    return exposure.tools


def maybe_auto_expose(server: Any, app: Any = None) -> dict[str, MCPTool] | None:
    """The tool map when the server's config sets ``expose_tools_over_mcp``, else ``None``."""
    if not getattr(getattr(server, "config", None), "expose_tools_over_mcp", False):
        return None
    return install_auto_exposure(server, app)
