"""The agent-server contract: the harness loop behind ``/run`` and ``/v1/responses``.

Override :meth:`SimpleResponsesAPIAgent.run` (one dataset row → the verified rollout) and
:meth:`SimpleResponsesAPIAgent.responses` (the loop as a Responses API "model", no verify).
``/aggregate_metrics`` forwards to the agent's resources server when it has one.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.config_types import (
    ROLLOUT_PATH_PREFIX,
    TOKEN_CAPTURE_PATH_SEGMENT,
    AggregateMetrics,
    AggregateMetricsRequest,
)
from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.failure_classes import UNREACHABLE
from nemo_gym.global_config import (
    OBSERVABILITY_ENABLED_KEY_NAME,
    TOKEN_ID_CAPTURE_BLOCK,
    get_first_server_config_dict,
)
from nemo_gym.rollout_correlation import current_rollout_id, maybe_rollout_id_from_run_body
from nemo_gym.server_utils import apply_rollout_prefix, rollout_path_prefix
from nemo_gym.serving.served_names import served_name
from nemo_gym.serving.server import (
    TOKEN_CAPTURE_SCOPE_KEY,
    BaseServer,
    BaseServerConfig,
    HTTPError,
    ServerRef,
    auth_headers,
    json_response,
    validation_error_body,
)
from nemo_gym.serving.server_client import Rollout, ServerCallError
from nemo_gym.tool_access import ToolAccess

__all__ = [
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "BaseResponsesAPIAgent",
    "BaseResponsesAPIAgentConfig",
    "SimpleResponsesAPIAgent",
    "row_create_params",
]


class _CreateParamsShape(BaseModel):
    """The parts of a Responses create request an agent loop relies on (other fields pass through)."""

    model_config = ConfigDict(extra="allow")

    input: str | list[dict[str, Any]] = []
    tools: list[dict[str, Any]] | None = None
    instructions: str | None = None


def row_create_params(row: dict[str, Any]) -> dict[str, Any]:
    """A row's ``responses_create_params``, checked: a malformed row is a 422 naming the field, never a 500."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise HTTPError(
            422, "invalid body: responses_create_params: field required (a Responses create request)"
        )
    if _plainly_valid(params):
        return params  # the common shape, checked without building a model on every rollout
    try:
        _CreateParamsShape.model_validate(params)
    except ValidationError as exc:
        detail = validation_error_body(exc, "", "responses_create_params")
        fields = [{**d, "field": f"responses_create_params.{d['field']}"} for d in detail["detail"]]
        summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields[:5])
        raise HTTPError(422, f"invalid body: {summary}", detail=fields) from exc
    return params


def _plainly_valid(params: dict[str, Any]) -> bool:
    """Whether ``params`` passes :class:`_CreateParamsShape` by plain type checks alone."""
    items = params.get("input", "")
    tools = params.get("tools")
    instructions = params.get("instructions")
    return (
        (type(items) is str or (type(items) is list and all(type(item) is dict for item in items)))
        and (tools is None or (type(tools) is list and all(type(tool) is dict for tool in tools)))
        and (instructions is None or type(instructions) is str)
    )


class BaseResponsesAPIAgentConfig(BaseServerConfig):
    """Config of an agent server: the servers it drives."""

    resources_server: ServerRef | None = None
    model_server: ServerRef | None = None
    # An /aggregate_metrics body sent one verify response per line goes to a temporary file.
    max_aggregate_metrics_body_bytes: int = 64 * 1024**3
    # NeMo Gym's agent fields.
    skip_verification: bool = False
    skip_verification_reward: float = 0.0
    session_close_retry_window_seconds: float = Field(default=300, gt=0, allow_inf_nan=False)
    token_id_capture: bool = False
    # Tools every agent session may use; a session's own grants replace them by name.
    tool_accesses: list[ToolAccess] = Field(default_factory=list)

    @field_validator("tool_accesses")
    @classmethod
    def _unique_tool_names(cls, accesses: list[ToolAccess]) -> list[ToolAccess]:
        return _unique_access_names(accesses, "configured tool access names must be unique")


class SimpleResponsesAPIAgent(BaseServer):
    """Base of every agent server.

    A handler whose body is a request model (``BaseRunRequest``) reads
    ``body.responses_create_params`` as NeMo Gym's typed model, which also answers ``.get``,
    ``[]`` and ``in`` as the plain dict did; ``plain_bodies = True`` keeps it a plain dict (the
    faster path for an agent written that way). A handler taking ``dict`` gets the JSON as sent.
    """

    server_type: ClassVar[str] = "responses_api_agents"
    plain_bodies: ClassVar[bool] = False
    config: BaseResponsesAPIAgentConfig

    @property
    def _agent_sessions(self) -> dict[str, _AgentSessionRecord]:
        # Created on first use, not in model_post_init: NeMo Gym agents override that without
        # calling the parent's.
        return self.__dict__.setdefault("_ng_agent_sessions", {})  # type: ignore[no-any-return]

    @property
    def _closed_agent_sessions(self) -> OrderedDict[str, _AgentSessionRecord]:
        return self.__dict__.setdefault("_ng_closed_agent_sessions", OrderedDict())  # type: ignore[no-any-return]

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """Run one rollout for a dataset row and return the resources server's verify answer."""
        raise HTTPError(404, f"{type(self).__name__} does not serve /run")

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """Run the loop for a Responses API create request and return the final response object."""
        raise HTTPError(404, f"{type(self).__name__} does not serve /v1/responses")

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> Any:
        """Metrics over verify answers: the resources server's own, or the default ones.

        An agent that defines NeMo Gym's hooks (``compute_metrics(tasks)``, ``get_key_metrics``)
        computes them itself. Called directly with an ``AggregateMetricsRequest`` (as NeMo Gym
        agents' tests do), it answers an ``AggregateMetrics``.
        """
        typed = isinstance(body, BaseModel)  # our own callers may pass the plain JSON body
        rows = body.verify_responses if typed else body.get("verify_responses", [])  # type: ignore[attr-defined]
        if self._own_metrics_hooks():
            from nemo_gym.collection.nemo_gym_compat import task_grouped_metrics

            metrics = task_grouped_metrics(
                rows,
                self.compute_metrics,
                lambda agent, _: self.get_key_metrics(agent),
                compute_repeat_metrics=getattr(self, "compute_repeat_metrics", None),
            )
        elif self.config.resources_server is not None:
            metrics = await self.server_client.post_json(
                self.config.resources_server.name,
                "/aggregate_metrics",
                body.model_dump(mode="json") if typed else body,
            )
        else:
            from nemo_gym.collection.metrics import compute_aggregate_metrics

            metrics = compute_aggregate_metrics(rows)
        return AggregateMetrics.model_validate(metrics) if typed else metrics

    def compute_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """Extra agent metrics over verify answers grouped by task (NeMo Gym's hook; override).
        ``per_task_metrics`` (by task index) go into each task's group metrics. Default: none."""
        return {}

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        """The metrics printed at the end of a collection (NeMo Gym's hook). Default: every ``mean/``."""
        return {k: v for k, v in agent_metrics.items() if k.startswith("mean/")}

    def _own_metrics_hooks(self) -> bool:
        cls = type(self)
        return (
            cls.compute_metrics is not SimpleResponsesAPIAgent.compute_metrics
            or cls.get_key_metrics is not SimpleResponsesAPIAgent.get_key_metrics
        )

    # ---- rollout correlation: NeMo Gym's helpers for the calls an agent makes ----------------
    def _global_config(self) -> Mapping[str, Any]:
        plain = getattr(self.server_client, "plain_global_config", None)
        if callable(plain):  # our client: no OmegaConf config built just to read two flags
            config = plain()
            if isinstance(config, Mapping):  # (a test's client mock answers a mock)
                return config
        config = getattr(self.server_client, "global_config_dict", None)
        return config if isinstance(config, Mapping) else {}

    def _model_call_capture_enabled(self) -> bool:
        """Whether the run records every model call for observability (``observability_enabled``)."""
        return bool(self._global_config().get(OBSERVABILITY_ENABLED_KEY_NAME, False))

    def _token_id_capture_enabled(self) -> bool:
        """Whether this agent's model calls go through training token-ID capture: the run's
        ``token_id_capture.enabled`` and either ``token_id_capture.all_agents`` or this agent's
        own ``token_id_capture`` field."""
        block = self._global_config().get(TOKEN_ID_CAPTURE_BLOCK) or {}
        if not isinstance(block, Mapping) or not block.get("enabled", False):
            return False
        return bool(block.get("all_agents", False)) or bool(getattr(self.config, "token_id_capture", False))

    def _capture_correlation_enabled(self) -> bool:
        """Whether calls of a rollout carry its ``/ng-rollout/<id>`` prefix (either capture is on)."""
        return self._model_call_capture_enabled() or self._token_id_capture_enabled()

    def rollout_id_from_run(self, body: Any) -> str | None:
        """The rollout id of a ``/run`` body (its ``_ng_rollout_id``, else ``<task>-<rollout>``),
        or None when no capture is enabled or the body names no rollout."""
        if not self._capture_correlation_enabled():
            return None
        return maybe_rollout_id_from_run_body(body)

    def rollout_client(self, body: Any = None) -> Rollout:
        """This ``/run``'s per-rollout client (cookie jars, rollout prefix on every call).

        With training-token capture on for this agent, its calls carry the rollout id the run's
        body names (``<task>-<rollout>``, what a trainer looks the capture up by) and the
        ``/training-token-capture`` segment; otherwise the id this request came with.
        """
        capture = self._token_id_capture_enabled()
        rollout_id = (self.rollout_id_from_run(body) if capture else None) or self.rollout_id
        return self.server_client.rollout(rollout_id, token_capture=capture)

    def url_path_for_run(self, url_path: str, body: Any) -> str:
        """``url_path`` with this run's rollout prefix (unchanged without a rollout id)."""
        prefix = rollout_path_prefix(
            self.rollout_id_from_run(body), token_capture=self._token_id_capture_enabled()
        )
        return prefix + url_path

    def base_url_for_run(self, base_url: str, body: Any) -> str:
        """A model server's root URL with this run's rollout prefix (add ``/v1`` after)."""
        return apply_rollout_prefix(
            base_url, self.rollout_id_from_run(body), token_capture=self._token_id_capture_enabled()
        )

    def url_path_for_request(self, url_path: str, request: Any) -> str:
        """``url_path`` with the rollout prefix the inbound ``request`` came with.

        The id is the route's ``rollout_id`` path parameter or, as our servers strip the prefix
        before routing, the current request's rollout; a training-capture request keeps its
        capture segment. A request without a prefix leaves ``url_path`` unchanged.
        """
        path_params = getattr(request, "path_params", None)
        rollout_id = path_params.get("rollout_id") if isinstance(path_params, Mapping) else None
        if rollout_id is None and isinstance(request, Request):
            rollout_id = current_rollout_id()
        path = getattr(getattr(request, "url", None), "path", "")
        scope = getattr(request, "scope", None)  # a test's mock Request may have none
        captured = isinstance(scope, Mapping) and bool(scope.get(TOKEN_CAPTURE_SCOPE_KEY))
        token_capture = captured or (isinstance(path, str) and f"/{TOKEN_CAPTURE_PATH_SEGMENT}/" in path)
        return rollout_path_prefix(rollout_id, token_capture=token_capture) + url_path

    def resolve_model_base_url(self, model_server_name: str, rollout_id: str | None = None) -> str:
        """``http://host:port[/ng-rollout/<id>]/v1`` of a configured model server (from the
        global config), for harnesses that call it with their own OpenAI client."""
        server_config = get_first_server_config_dict(self._global_config(), model_server_name)
        if _has_address(server_config) or not hasattr(self.server_client, "registered_base_url"):
            base_url = self.server_client._build_server_base_url(server_config)
        else:  # started on port 0: the launch config has no address; the head server knows it
            base_url = self.server_client.registered_base_url(model_server_name)
        prefixed = apply_rollout_prefix(base_url, rollout_id, token_capture=self._token_id_capture_enabled())
        return f"{prefixed}/v1"

    # ---- NeMo Gym's app style ------------------------------------------------------------------
    def uses_setup_webserver(self) -> bool:
        """Served by FastAPI when ``setup_webserver`` is overridden or ``run``/``responses`` take
        parameters only FastAPI binds (``Request``, ``Response``, several parameters)."""
        from nemo_gym.serving.fastapi_app import needs_fastapi

        return super().uses_setup_webserver() or needs_fastapi(self.run) or needs_fastapi(self.responses)

    def setup_webserver(self) -> Any:
        """The FastAPI app: ``/run``, ``/v1/responses``, ``/aggregate_metrics`` and the agent-session
        routes; extend it with ``app = super().setup_webserver(); app.post(...)(...)``."""
        from nemo_gym.serving.fastapi_app import needs_fastapi, new_app

        app = new_app(self)
        # Served here, the rollout prefix is stripped before routing (the id kept in path_params);
        # the prefixed twins serve the app used on its own, as NeMo Gym's tests use it.
        prefixed = f"/{ROLLOUT_PATH_PREFIX}/{{rollout_id}}"
        responses_paths: tuple[str, ...] = ("/v1/responses", f"{prefixed}/v1/responses")
        responses_paths += (f"{prefixed}/{TOKEN_CAPTURE_PATH_SEGMENT}/v1/responses",)
        routes = [("/run", self.run), *((path, self.responses) for path in responses_paths)]
        for path, handler in routes:
            if needs_fastapi(handler):
                app.post(path)(handler)
            else:
                app.router.routes.append(self.route(path, handler))
        app.router.routes.append(self._aggregate_metrics_route())
        app.post("/v1/agent_sessions")(self.seed_agent_session)
        app.post("/v1/agent_sessions/close")(self.close_agent_session)
        return app

    setup_webserver._ng_default_app = True  # type: ignore[attr-defined]

    # ---- agent sessions: an environment server seeding this agent ---------------------------
    def effective_tool_accesses(self, request: AgentSeedSessionRequest) -> list[ToolAccess]:
        """The configured tool accesses with the session's own replacing them by name."""
        accesses = {access.name: access for access in self.config.tool_accesses}
        accesses.update((access.name, access) for access in request.tool_accesses)
        return list(accesses.values())

    @staticmethod
    def _agent_session_id_from_request(request: Any) -> str | None:
        """The agent session a request's cookie names (None without one); a malformed one is a 409."""
        try:
            session = request.session if request is not None else None
        except (AssertionError, AttributeError):
            return None
        if not isinstance(session, Mapping) or AGENT_SESSION_COOKIE_KEY not in session:
            return None
        marker = session[AGENT_SESSION_COOKIE_KEY]
        if not isinstance(marker, str) or not marker:
            raise _conflict("invalid agent session marker")
        return marker

    def _require_agent_session(self, agent_session_id: str) -> AgentSessionState:
        """The live state of a seeded session; a 409 for an unknown or closing one."""
        record = self._agent_sessions.get(agent_session_id)
        if record is None or record.state is None or record.closing:
            raise _conflict("unknown or closing agent_session_id")
        return record.state

    @asynccontextmanager
    async def _locked_agent_session(self, session_id: str) -> AsyncIterator[_AgentSessionRecord]:
        """The session's record, under its lock; closed records past their window are dropped first."""
        records, closed = self._agent_sessions, self._closed_agent_sessions
        now = time.monotonic()
        while closed and next(iter(closed.values())).expires_at <= now:
            key, _ = closed.popitem(last=False)
            records.pop(key, None)
        while True:
            record = records.setdefault(session_id, _AgentSessionRecord())
            async with record.lock:
                if records.get(session_id) is not record:
                    continue  # replaced while this waiter queued: never act on a stale record
                try:
                    yield record
                finally:
                    if record.state is None and record.close_response is None:
                        records.pop(session_id, None)
                return

    async def seed_agent_session(
        self, request: Request, body: AgentSeedSessionRequest
    ) -> AgentSeedSessionResponse:
        """Open agent state under the caller's ``agent_session_id``; the same seed again is a no-op,
        a different one (or a closed session) a 409."""
        if self.config.num_workers not in (None, 1):
            raise ValueError("agent sessions require num_workers=1")
        current = self._agent_session_id_from_request(request)
        if current is not None and current != body.agent_session_id:
            raise _conflict("agent_session_id does not match the session cookie")
        async with self._locked_agent_session(body.agent_session_id) as record:
            if record.close_response is not None:
                raise _conflict("agent session is already closed")
            if record.closing:
                raise _conflict("agent session is closing")
            if record.state is None:
                if current is not None:
                    raise _conflict("agent session cookie has expired")
                record.episode_id = body.episode_id
                try:
                    record.state = await self._seed_agent_session_state(body.model_copy(deep=True))
                except AgentSessionSetupError as failure:
                    record.state, record.closing = failure.state, True  # kept for close only
                    raise failure.error from None
            elif record.state.request != body:
                raise _conflict("agent_session_id is already bound to another seed request")
            request.session[AGENT_SESSION_COOKIE_KEY] = body.agent_session_id
            return AgentSeedSessionResponse(agent_session_id=body.agent_session_id)

    async def close_agent_session(
        self, request: Request, body: AgentCloseSessionRequest
    ) -> AgentCloseSessionResponse:
        """Close agent state and return its observations; a retried close within
        ``session_close_retry_window_seconds`` gets the same answer, and closing an unknown id
        keeps a late seed of it out. A failed cleanup keeps the state for another close."""
        if type(self)._close_agent_session_state is SimpleResponsesAPIAgent._close_agent_session_state:
            raise NotImplementedError(f"{type(self).__name__} does not implement agent sessions")
        current = self._agent_session_id_from_request(request)
        if current is not None and current != body.agent_session_id:
            raise _conflict("agent_session_id does not match the session cookie")
        async with self._locked_agent_session(body.agent_session_id) as record:
            if record.episode_id is not None and record.episode_id != body.episode_id:
                raise _conflict("episode_id does not match the seeded agent session")
            if record.close_response is not None:
                return record.close_response.model_copy(deep=True)
            if record.state is None:
                if current is not None:
                    raise _conflict("agent close receipt has expired")
                answer = AgentCloseSessionResponse(agent_session_id=body.agent_session_id)
            else:
                record.closing = True
                answer = await self._close_agent_session_state(record.state)
            record.state, record.episode_id = None, body.episode_id
            record.close_response = answer.model_copy(deep=True)
            record.expires_at = time.monotonic() + self.config.session_close_retry_window_seconds
            self._closed_agent_sessions[body.agent_session_id] = record
            # The marker stays: a late /v1/responses of this session must not run session-less.
            request.session[AGENT_SESSION_COOKIE_KEY] = body.agent_session_id
            return answer

    async def _seed_agent_session_state(self, body: AgentSeedSessionRequest) -> AgentSessionState:
        """Check the session's grants and build the harness's state (override). Raise
        :class:`AgentSessionSetupError` with the partial state when setup fails half-way."""
        raise NotImplementedError(f"{type(self).__name__} does not implement agent sessions")

    async def _close_agent_session_state(self, state: AgentSessionState) -> AgentCloseSessionResponse:
        """Release the harness's state (override); raise, keeping what another close needs, on failure."""
        raise NotImplementedError(f"{type(self).__name__} does not implement agent sessions")

    def routes(self) -> list[Route]:
        """Liveness, ``/run``, ``/v1/responses`` and ``/aggregate_metrics``."""
        return super().routes() + [
            self.route("/run", self.run),
            self.route("/v1/responses", self.responses),
            self._aggregate_metrics_route(),
        ]

    def _aggregate_metrics_route(self) -> Route:
        if (
            type(self).aggregate_metrics is not SimpleResponsesAPIAgent.aggregate_metrics
            or self._own_metrics_hooks()
        ):
            return self.route("/aggregate_metrics", self.aggregate_metrics)  # an agent's own
        from nemo_gym.collection.aggregate_endpoint import aggregate_endpoint, forward_aggregate_metrics
        from nemo_gym.collection.streaming_metrics import MetricsAccumulator

        local = aggregate_endpoint(
            server_name=lambda: self.name,
            max_stream_bytes=lambda: self.config.max_aggregate_metrics_body_bytes,
            max_whole_bytes=lambda: self.config.max_body_bytes,
            new_accumulator=MetricsAccumulator,
        )

        async def endpoint(request: Request) -> Response:
            # Rows and answer stream through: the agent never holds them (any number of rows).
            resources = self.config.resources_server
            if resources is None:
                return await local(request)  # type: ignore[no-any-return]
            try:
                base = await self.server_client.base_url(resources.name)
                return await forward_aggregate_metrics(
                    request, self.server_client.http(), base + "/aggregate_metrics", auth_headers()
                )
            except ServerCallError as exc:
                return json_response(
                    {
                        "error": str(exc),
                        "server": self.name,
                        "upstream": exc.server,
                        "failure_class": UNREACHABLE,
                    },
                    502,
                )
            except HTTPError as exc:
                return json_response(
                    {"error": exc.message, "server": self.name, **exc.extra}, exc.status_code
                )

        return Route("/aggregate_metrics", endpoint, methods=["POST"])


# ---- NeMo Gym's agent-session names (an Environment Server seeding an agent) -----------------

AGENT_SESSION_COOKIE_KEY = "agent_session_id"


class AgentSeedSessionRequest(BaseModel):
    """Open agent state under a caller-chosen ``agent_session_id`` (seeding it again returns it)."""

    model_config = ConfigDict(extra="forbid")

    agent_session_id: str = Field(min_length=1)
    episode_id: EpisodeId
    task_id: TaskId
    tool_accesses: list[ToolAccess] = Field(default_factory=list)
    sandbox_access: Any = None

    @field_validator("tool_accesses")
    @classmethod
    def _unique_tool_names(cls, accesses: list[ToolAccess]) -> list[ToolAccess]:
        return _unique_access_names(accesses, "tool access names must be unique within an agent session")


class AgentSeedSessionResponse(BaseModel):
    """The seeded ``agent_session_id``."""

    model_config = ConfigDict(extra="forbid")

    agent_session_id: str


class AgentCloseSessionRequest(BaseModel):
    """Close agent state."""

    model_config = ConfigDict(extra="forbid")

    agent_session_id: str
    episode_id: EpisodeId


class AgentCloseSessionResponse(BaseModel):
    """The closed session, with what the agent observed."""

    model_config = ConfigDict(extra="forbid")

    agent_session_id: str
    agent_observations: Any = None
    resources_cookies: dict[str, str] | None = None


@dataclass
class AgentSessionState:
    """A harness's own state for one agent session, bound to the seed request."""

    request: AgentSeedSessionRequest


class AgentSessionSetupError(Exception):
    """Setup failed part-way: the state kept for close, and the original error."""

    def __init__(self, state: AgentSessionState, *, error: BaseException) -> None:
        super().__init__(str(error))
        self.state = state
        self.error = error


@dataclass
class _AgentSessionRecord:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    state: AgentSessionState | None = None
    closing: bool = False
    episode_id: EpisodeId | None = None
    close_response: AgentCloseSessionResponse | None = None
    expires_at: float = float("inf")


def _unique_access_names(accesses: list[ToolAccess], message: str) -> list[ToolAccess]:
    names = [access.name for access in accesses]
    if len(names) != len(set(names)):
        raise ValueError(message)
    return accesses


def _conflict(message: str) -> Exception:
    # FastAPI's HTTPException, as NeMo Gym's agents raise and their tests expect (agent
    # sessions are served by FastAPI; our error handling keeps it a 409).
    from fastapi import HTTPException

    return HTTPException(409, message)


BaseResponsesAPIAgent = SimpleResponsesAPIAgent


def __getattr__(name: str) -> Any:
    # FastAPI's Body, which NeMo Gym agents import from here: loaded only when asked for, so
    # our own agents never import FastAPI.
    if name == "Body":
        from fastapi import Body

        return Body
    return served_name(name, __name__)


def _has_address(block: Any) -> bool:
    """Whether a server's config block says where it listens (a host and a non-zero port)."""
    if isinstance(block, Mapping):
        host, port = block.get("host"), block.get("port")
    else:
        host, port = getattr(block, "host", None), getattr(block, "port", None)
    return bool(host) and bool(port)
