"""The server base: turns a server class into a starlette app run by uvicorn.

Every nemo_gym server (resources, model, agent) is a ``BaseServer`` subclass. The base gives it:
liveness ``GET /``, JSON error bodies naming the server, 422 answers with field paths, a body
size limit, the ``/ng-rollout/<id>`` prefix stripped, an optional shared auth token, per-rollout
session cookies with a TTL store, and start-up that binds a socket first and registers the port
it really got with the head server (no bind-then-release race).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import sys
import typing
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.serving import local_socket
from nemo_gym.serving.access_guard import AccessGuard
from nemo_gym.serving.answered_errors import AnswerThenRaise, KeepAnsweredErrors
from nemo_gym.serving.cpu_scheduling import batch_scheduling_for_serving
from nemo_gym.serving.direct_routes import DirectRoutes, read_body, session_cookie

# The pieces of a server that live in their own modules are re-exported here: servers, tests and
# scripts import them from nemo_gym.serving.server.
from nemo_gym.serving.disconnect import ClientGone, until_disconnect  # noqa: F401
from nemo_gym.serving.error_answers import (  # noqa: F401 - part of this module's API
    CALLER_FAULT_STATUSES,
    JSONAnswer,
    dumps,
    error_response,
    json_error_handlers,
    json_response,
    validation_error_body,
)
from nemo_gym.serving.gc_tuning import tune_gc_for_serving
from nemo_gym.serving.launch_payload import LAUNCH_PAYLOAD_WAIT_S, LaunchPayload, read_launch_payload  # noqa: F401
from nemo_gym.serving.launched_config import install_launched_global_config
from nemo_gym.serving.process_hooks import LIVENESS_METRICS, SHUTDOWN_CLEANUPS  # noqa: F401

# The shared wire names are re-exported here: servers and tests import them from nemo_gym.serving.server.
from nemo_gym.serving.protocol import (  # noqa: F401
    AUTH_HEADER,
    ENV_AUTH_TOKEN,
    ENV_HEAD_URL,
    ENV_INSTANCE_NAME,
    ENV_LAUNCH_PAYLOAD,
    ENV_NODE_ID,
    ENV_NODE_IP,
    ENV_SERVER_CONFIG,
    REGISTRATION_SECRET_HEADER,
    ROLLOUT_PREFIX,
    SESSION_COOKIE,
    TOKEN_CAPTURE_PATH_SEGMENT,
    auth_headers,
    auth_token,
    raise_fd_limit,
    registration_secret,
    set_process_secrets,
)
from nemo_gym.serving.registration import register_with_head  # noqa: F401
from nemo_gym.serving.request_context import (  # noqa: F401
    PlainBodies,
    _current_rollout_id,
    _current_session_id,
    plain_bodies_in_effect,
)
from nemo_gym.serving.request_guard import (  # noqa: F401 - HTTPError is part of this module's API
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    HTTPError,
    RequestGuard,
    header_timeout_protocol,
    parse_json_object,
)
from nemo_gym.serving.rollout_prefix import TOKEN_CAPTURE_SCOPE_KEY, StripRolloutPrefix  # noqa: F401
from nemo_gym.serving.secrets import remember_secret_values, secret_values
from nemo_gym.serving.server_gate import ServerGate
from nemo_gym.serving.server_logging import configure_logging
from nemo_gym.serving.sessions import SessionStore
from nemo_gym.serving.sockets import bind_socket, bind_socket_in_range
from nemo_gym.serving.uvicorn_factory import loop_factory, make_uvicorn_server

logger = logging.getLogger("nemo_gym")

# An /aggregate_metrics body of millions of rows streams for minutes: its own deadline.
AGGREGATE_BODY_TIMEOUT_S = 3600.0


class ServerRef(BaseModel):
    """A reference to another configured server instance by kind and name."""

    type: str
    name: str


class ModelServerRef(ServerRef):
    """A reference to a model server instance (``nemo_gym.config_types.ModelServerRef``)."""

    type: Literal["responses_api_models"] = "responses_api_models"


class BaseServerConfig(BaseModel):
    """Fields every server accepts. Unknown fields are kept (server-specific settings)."""

    model_config = ConfigDict(extra="allow")

    name: str = ""
    host: str = "127.0.0.1"
    port: int = 0
    entrypoint: str = "app.py"
    domain: str | None = None
    # Bodies are parsed in memory: the limit bounds what one request can make a server hold
    # (counted while reading, so a larger body is refused before it is buffered).
    max_body_bytes: int = 64 * 1024 * 1024
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    session_ttl_s: float = 3600.0
    max_sessions: int = 1_000_000
    # Bounds for the port this server picks when ``port`` is 0 (NeMo Gym's port_range_low/high).
    port_range_low: int | None = None
    port_range_high: int | None = None
    # Host names (besides its addresses, localhost and this machine's name) this server answers
    # to; any other Host header is refused (DNS rebinding). ["*"] accepts any.
    allowed_hosts: list[str] = []
    # NeMo Gym's uvicorn worker count. A server here is one process (scale out with replicas);
    # the field is kept so that configs and servers that read or check it work unchanged.
    num_workers: int | None = None


def body_model(handler: Callable[..., Any]) -> type[BaseModel] | None:
    """The pydantic model a handler takes as its body, from its type hints (None → plain JSON).

    An override without annotations inherits the body model of the method it overrides, so
    ``async def verify(self, body)`` still gets a validated ``BaseVerifyRequest``.
    """
    owner = getattr(handler, "__self__", None)
    func = getattr(handler, "__func__", handler)
    candidates = [func]
    if owner is not None:
        candidates += [vars(k)[func.__name__] for k in type(owner).__mro__ if func.__name__ in vars(k)]
    for candidate in candidates:
        try:
            hints = typing.get_type_hints(candidate)
        except Exception:  # noqa: BLE001 - unresolvable forward refs: try the next candidate
            continue
        params = [p for p in inspect.signature(candidate).parameters.values() if p.name != "self"]
        # A ``Request`` parameter (NeMo Gym's FastAPI style) is not the body.
        params = [
            p
            for p in params
            if not (inspect.isclass(hints.get(p.name)) and issubclass(hints[p.name], Request))
        ]
        hint = hints.get(params[0].name) if params else None
        if inspect.isclass(hint) and issubclass(hint, BaseModel):
            return hint
        if params and params[0].name in hints:
            return None  # explicitly annotated as something else (dict, Any): plain JSON
    return None


class BaseServer(BaseModel):
    """Base of every nemo_gym server: a pydantic model with ``config`` and ``server_client``.

    Two ways to write a server, on this one base:

    - ours: declare ``config: <their config class>`` and extend :meth:`routes`. Handlers take
      one body argument (a pydantic model, validated, or anything else for plain JSON) and
      return a JSON-ready value or a pydantic model. Served by a lean starlette app.
    - NeMo Gym's: override ``setup_webserver()``, call the parent's and add FastAPI routes
      (``app.post("/tool")(self.tool)``), bodies typed by annotation. Served by that FastAPI app.

    Either way the app is wrapped by the same request guard, rollout-prefix stripping, auth
    token check, error shapes and failure classification.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    server_type: ClassVar[str] = "server"
    # Responses API fields of bodies stay plain dicts in handlers (see plain_bodies_in_effect).
    plain_bodies: ClassVar[bool] = True
    # NeMo Gym's switch for starting Ray in the server process; the launcher decides here.
    ray_enabled: ClassVar[bool | None] = None
    # WebSocket handshakes are refused unless a server sets this (then Host, Origin and the
    # token are checked for them as for HTTP: serving/access_guard.py).
    serves_websocket: ClassVar[bool] = False
    config: BaseServerConfig
    server_client: Any = None
    if typing.TYPE_CHECKING:
        sessions: SessionStore  # set in model_post_init, not a field

    def __init__(self, config: Any = None, server_client: Any = None, /, **data: Any) -> None:
        config = data.pop("config", config)
        server_client = data.pop("server_client", server_client)
        config_class = type(self).config_class()
        if isinstance(config, BaseModel) and not isinstance(config, config_class):
            config = config.model_dump()  # a parent config class's instance: revalidate its fields
        super().__init__(config=config if config is not None else {}, server_client=server_client, **data)
        # Here rather than in model_post_init: NeMo Gym servers override that without calling
        # the parent's.
        object.__setattr__(
            self, "sessions", SessionStore(self.config.session_ttl_s, self.config.max_sessions)
        )
        if self.server_client is None:
            # A server built without a client gets one for ng_run's head server.
            from nemo_gym.serving.nemo_gym_client import NeMoGymServerClient

            object.__setattr__(self, "server_client", NeMoGymServerClient.from_env())

    def __setattr__(self, name: str, value: Any) -> None:
        # Attributes a server sets on itself (pools, caches) are plain instance attributes, as
        # on any class; declared fields keep pydantic's handling.
        if name in type(self).model_fields or name.startswith("_"):
            super().__setattr__(name, value)
        else:
            object.__setattr__(self, name, value)

    # ---- what subclasses use -------------------------------------------------------------
    @classmethod
    def config_class(cls) -> type[BaseModel]:
        """The config model, read from the subclass's ``config:`` annotation."""
        field = cls.model_fields.get("config")
        hint = field.annotation if field is not None else None
        return hint if inspect.isclass(hint) and issubclass(hint, BaseModel) else BaseServerConfig

    @property
    def name(self) -> str:
        """This instance's configured name (used in errors and logs)."""
        return self.config.name or type(self).__name__

    @property
    def session_id(self) -> str | None:
        """The session id of the request being handled (from the ``session_id`` cookie)."""
        return _current_session_id.get()

    @property
    def rollout_id(self) -> str | None:
        """The rollout id from an ``/ng-rollout/<id>`` path prefix, if the caller sent one."""
        return _current_rollout_id.get()

    @property
    def session(self) -> dict[str, Any]:
        """The per-rollout state dict of the request being handled (created on first use)."""
        session_id = _current_session_id.get()
        if session_id is None:
            raise RuntimeError("server.session is only available while handling a request")
        state = self.sessions.get(session_id)
        assert state is not None
        return state

    def routes(self) -> list[Route]:
        """The routes of this server. Extend with ``super().routes() + [self.route(...)]``."""
        return [Route("/", self._liveness, methods=["GET"])]

    def route(
        self,
        path: str,
        handler: Callable[[Any], Awaitable[Any]],
        methods: tuple[str, ...] = ("POST",),
        body_model_of: Callable[..., Any] | None = None,
    ) -> Route:
        """Wrap a body-taking handler as a starlette route with validation and JSON errors.

        The body model is read from ``body_model_of``'s type hints (default: the handler's).
        """
        return Route(path, self.endpoint(handler, body_model_of), methods=list(methods))

    # ---- NeMo Gym's app-building style (FastAPI; see nemo_gym.serving.fastapi_app) ------------
    def setup_webserver(self) -> Any:
        """The FastAPI app serving this server; override, call the parent's and add routes.

        ``app = super().setup_webserver(); app.post("/tool")(self.tool); return app``: bodies
        and ``Request`` parameters are bound from the method's annotations. The base app holds
        the session middleware and this server's own routes.
        """
        from nemo_gym.serving.fastapi_app import new_app

        app = new_app(self)
        app.router.routes.extend(r for r in self.routes() if getattr(r, "path", None) != "/")
        return app

    setup_webserver._ng_default_app = True  # type: ignore[attr-defined]

    def setup_liveness(self, app: Any) -> None:
        """Add ``GET /`` (and ``/health``, ``/healthz``, ``/livez``, ``/readyz``) to a FastAPI app."""
        from nemo_gym.serving.fastapi_app import add_liveness

        add_liveness(app)

    def setup_exception_middleware(self, app: Any) -> None:
        """Answer a FastAPI app's failures as our classified JSON errors naming this server."""
        from nemo_gym.serving.fastapi_app import add_exception_handling

        add_exception_handling(self, app)

    def setup_cancellation_middleware(self, app: Any) -> None:
        """Cancel a FastAPI app's request handler when its client disconnects (NeMo Gym's name)."""
        from nemo_gym.serving.fastapi_app import DisconnectCancellation

        app.add_middleware(DisconnectCancellation)

    def setup_session_middleware(self, app: Any) -> None:
        """Per-rollout session ids (``request.session[SESSION_ID_KEY]``, ``self.session``) on a FastAPI app."""
        from nemo_gym.serving.fastapi_app import add_session_middleware

        add_session_middleware(self, app)

    def get_session_middleware_key(self) -> str:
        """The session cookie's name: unique per server class and instance name."""
        return f"{type(self).__name__}___{self.config.name}"

    async def on_startup(self) -> None:
        """Called once in the server process before it accepts requests (start pools, load data)."""

    async def on_shutdown(self) -> None:
        """Called once when the server stops (stop worker processes, flush files)."""

    # ---- machinery -----------------------------------------------------------------------
    async def _liveness(self, request: Request) -> Response:
        body: dict[str, Any] = {"status": "ok", "server": self.name}
        if not getattr(self, "_embedded", True):  # process-wide numbers: only when this is the process
            for key, metrics in LIVENESS_METRICS.items():
                body[key] = metrics()
        return json_response(body)

    def endpoint(
        self, handler: Callable[[Any], Awaitable[Any]], body_model_of: Callable[..., Any] | None = None
    ) -> Callable[[Request], Awaitable[Response]]:
        """The starlette endpoint for a handler: parse, validate, call, serialize, catch.

        Its ASGI form, the same steps without a starlette ``Request``, is ``endpoint._ng_asgi``:
        what :class:`~nemo_gym.serving.direct_routes.DirectRoutes` serves the route's path with.
        The steps after reading the body are ``endpoint._ng_asgi._ng_answer``: what the lean
        protocol's direct routes (:mod:`nemo_gym.serving.direct_serve`) call, with no ``scope``
        and ``receive`` (that protocol cancels the handler itself when its caller hangs up).
        """
        model = body_model(body_model_of or handler)
        # pydantic's own model_validate is its validator's validate_python: called straight
        # (one Python call less per request) unless the model overrides it.
        validator_direct = model is not None and getattr(model.model_validate, "__func__", None) is getattr(
            BaseModel.model_validate, "__func__", None
        )
        server_name = self.name
        plain = self.plain_bodies
        sessions = self.sessions
        opened = sessions.holds

        async def answer(
            raw: bytes,
            incoming: str | None,
            method: str,
            path: str,
            scope: Scope | None,
            receive: Receive | None,
        ) -> Response:
            try:
                data = parse_json_object(raw)
            except HTTPError as exc:
                return json_response(
                    {"error": exc.message, "server": server_name, **exc.extra}, exc.status_code
                )
            session_id = incoming or sessions.new_id()
            token = _current_session_id.set(session_id)
            # A plain-bodies request gets its own record of the dicts already checked.
            plain_token = plain_bodies_in_effect.set(PlainBodies() if plain else False)
            try:
                body: Any
                try:
                    if model is None:
                        body = data
                    elif validator_direct:
                        body = model.__pydantic_validator__.validate_python(data)
                    else:
                        body = model.model_validate(data)
                except ValidationError as exc:  # the caller's body: a 422, nothing raised on
                    return error_response(exc, server_name, method, path)
                if receive is None:  # a direct route of the lean protocol, which cancels it itself
                    result = await handler(body)
                else:
                    result = await until_disconnect(receive, handler(body), scope)
            except ClientGone:
                return Response(status_code=499)  # nobody is left to read it
            except HTTPError as exc:  # the handler's deliberate answer
                return error_response(exc, server_name, method, path)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a JSON error naming the server
                # Answered, then raised on as starlette's error middleware does (answered_errors).
                return AnswerThenRaise(error_response(exc, server_name, method, path), exc)
            else:
                # A handler may answer with a ready response (a model server's event stream).
                try:
                    response = result if isinstance(result, Response) else JSONAnswer(dumps(result))
                except (TypeError, orjson.JSONEncodeError) as exc:
                    logger.exception("%s: %s %s: answer not serializable", server_name, method, path)
                    return json_response(
                        {
                            "error": f"the answer could not be serialized as JSON: {exc}",
                            "server": server_name,
                        },
                        500,
                    )
                # Only a handler that opened state needs the cookie: stateless hops (model calls,
                # stateless tools) skip building a Set-Cookie header.
                if incoming is None and opened(session_id):
                    response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict")
                return response
            finally:
                if receive is not None:  # a direct route's context (receive None) ends with its task
                    plain_bodies_in_effect.reset(plain_token)
                    _current_session_id.reset(token)

        async def run(request: Request) -> Response:
            # The body limit and deadline are enforced while reading by RequestGuard.
            raw = await request.body()
            incoming = request.cookies.get(SESSION_COOKIE) if "cookie" in request.headers else None
            return await answer(
                raw, incoming, request.method, request.url.path, request.scope, request.receive
            )

        async def run_asgi(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                raw = await read_body(receive)
            except (
                HTTPError
            ) as exc:  # too large or too slow (RequestGuard): answered as starlette's handler does
                response = json_response(
                    {"error": exc.message, "server": server_name, **exc.extra}, exc.status_code
                )
            else:
                if raw is None:
                    return  # the caller hung up before its body was read: nobody to answer
                response = await answer(
                    raw, session_cookie(scope), scope["method"], scope["path"], scope, receive
                )
            await response(scope, receive, send)

        run.__name__ = getattr(handler, "__name__", "endpoint")
        run._ng_asgi = run_asgi  # type: ignore[attr-defined]
        run_asgi._ng_answer = answer  # type: ignore[attr-defined]
        return run

    def uses_setup_webserver(self) -> bool:
        """Whether this class builds its app NeMo Gym's way (it overrides ``setup_webserver``)."""
        own = getattr(type(self), "setup_webserver", None)
        return own is not None and getattr(own, "_ng_default_app", False) is False

    def build_app(self) -> ASGIApp:
        """The ASGI app: routes behind the request guard, prefix stripping and the access guard
        (Host, Origin, auth token, JSON bodies: :mod:`nemo_gym.serving.access_guard`).

        A class that overrides ``setup_webserver`` is served by the FastAPI app it builds (with
        liveness and our error handling added, as NeMo Gym's launcher adds them); any other by
        a lean starlette app of :meth:`routes`.
        """
        app: ASGIApp
        direct: DirectRoutes | None = None
        if self.uses_setup_webserver():
            from nemo_gym.serving.fastapi_app import finish_app

            app = finish_app(self, self.setup_webserver())  # type: ignore[attr-defined]
        else:
            routes = self.routes()
            app = direct = DirectRoutes(
                Starlette(routes=routes, exception_handlers=json_error_handlers(self.name)), routes
            )
        app = KeepAnsweredErrors(app)  # a handler's exception, once answered, stops here
        path_limits = {}
        path_body_timeouts = {}
        spooled = getattr(self.config, "max_aggregate_metrics_body_bytes", None)
        if isinstance(spooled, int):
            path_limits["/aggregate_metrics"] = spooled  # spooled to disk, not held in memory
            path_body_timeouts["/aggregate_metrics"] = max(
                self.config.body_timeout_s, AGGREGATE_BODY_TIMEOUT_S
            )
        app = RequestGuard(
            app,
            self.name,
            self.config.max_body_bytes,
            body_timeout_s=self.config.body_timeout_s,
            path_limits=path_limits,
            path_body_timeouts=path_body_timeouts,
        )
        from nemo_gym.serving.memory_release import ReleaseMemoryAfterBurst, release_enabled

        # Outermost: a request from the wrong Host/Origin, without the token (handed on stdin to
        # launched servers, so auth_token(), not the environment) or with a non-JSON body never
        # reaches a route. Then the requests in flight are counted (RSS settles back after
        # thousands in flight) and the rollout prefix is stripped: one layer for all three.
        access = AccessGuard(
            app,
            self.name,
            token=auth_token(),
            hosts=[self.config.host, getattr(self, "bound_host", None)],
            allowed_hosts=self.config.allowed_hosts,
            websocket=self.serves_websocket,
        )
        memory = ReleaseMemoryAfterBurst(app) if release_enabled() else None
        return ServerGate(app, access, memory, direct)

    # ---- process entry -------------------------------------------------------------------
    @classmethod
    def from_env(cls) -> BaseServer:
        """An instance configured the way ``ng_run`` starts a server process.

        The config and secrets come as JSON on stdin when ``NEMO_GYM_LAUNCH_PAYLOAD=stdin`` (what
        the launcher does: nothing secret in the environment), else from ``NEMO_GYM_SERVER_CONFIG``.
        The payload's ``global_config`` becomes the process's global config.
        Every secret value is remembered, so error answers and logs hide it.
        """
        if os.environ.get(ENV_LAUNCH_PAYLOAD) == "stdin":
            payload = read_launch_payload()
            config = payload.server_config
            set_process_secrets(payload.auth_token, payload.registration_secret)
            if payload.global_config is not None:
                # The run's config (other servers' secrets redacted by the launcher): what
                # get_global_config_dict() and server_client.global_config_dict answer here.
                install_launched_global_config(payload.global_config)
        else:
            raw = os.environ.get(ENV_SERVER_CONFIG)
            config = orjson.loads(raw) if raw else {}
        remember_secret_values({*secret_values(config), auth_token(), registration_secret()})
        config.setdefault("name", os.environ.get(ENV_INSTANCE_NAME, cls.__name__))
        return cls(config)

    @classmethod
    def run_webserver(cls) -> None:
        """Start this server as a process: configure from env, bind, register, serve until stopped."""
        configure_logging()
        try:
            server = cls.from_env()
        except ValidationError as exc:
            # A config mistake: one line per problem naming the server and the field, no traceback.
            name = os.environ.get(ENV_INSTANCE_NAME, cls.__name__)
            for error in exc.errors():
                loc = error["loc"][1:] if error["loc"][:1] == ("config",) else error["loc"]
                where = ".".join(str(p) for p in loc)
                message = str(error["msg"]).removeprefix("Value error, ")
                sys.stderr.write(f"config error: {name}: {where + ': ' if where else ''}{message}\n")
            sys.exit(2)
        tune_gc_for_serving()  # this process is the server: start-up objects frozen, fewer collections
        batch_scheduling_for_serving()  # a hop's answer does not preempt the server that sent it
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(server.serve())

    async def serve(
        self, sock: socket.socket | None = None, register: bool = True, embedded: bool = False
    ) -> None:
        """Serve on ``sock`` (or a fresh socket on the configured host/port) until stopped.

        ``embedded`` leaves signal handling to the host process (a trainer, a test, ``ng_run``).
        """
        raise_fd_limit()
        if sock is None:
            low, high = self.config.port_range_low, self.config.port_range_high
            if self.config.port == 0 and low is not None and high is not None:
                sock = bind_socket_in_range(self.config.host, low, high)
            else:
                sock = bind_socket(self.config.host, self.config.port)
        host, port = sock.getsockname()[:2]
        self.bound_host = host
        uv_server = make_uvicorn_server(
            self.build_app(), embedded=embedded, header_timeout_s=self.config.header_timeout_s
        )
        self.uvicorn_server = uv_server
        self._embedded = embedded
        await self.on_startup()
        local = local_socket.bind(host, port)  # same-host hops skip TCP (serving/local_socket.py)
        sockets = [sock] if local is None else [sock, local.sock]
        if local is not None:  # a SIGTERM ends the process in uvicorn's shutdown, before `finally`
            SHUTDOWN_CLEANUPS[local.path] = local.unlink
        serve_task = asyncio.create_task(uv_server.serve(sockets=sockets))
        try:
            head_url = os.environ.get(ENV_HEAD_URL)
            if register and head_url:
                while not uv_server.started and not serve_task.done():
                    await asyncio.sleep(0.005)
                if uv_server.started:
                    await register_with_head(head_url, self.name, self.server_type, host, port)
            await serve_task
        finally:
            if local is not None:
                SHUTDOWN_CLEANUPS.pop(local.path, None)
                local.unlink()
            try:
                await self.on_shutdown()
            finally:
                close = getattr(self.server_client, "close", None)
                if close is not None and inspect.iscoroutinefunction(close):
                    await close()
