"""The agent-server contract: the harness loop behind ``/run`` and ``/v1/responses``.

Override :meth:`SimpleResponsesAPIAgent.run` (one dataset row → the verified rollout) and
:meth:`SimpleResponsesAPIAgent.responses` (the loop as a Responses API "model", no verify).
``/aggregate_metrics`` forwards to the agent's resources server when it has one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.config_types import TOKEN_CAPTURE_PATH_SEGMENT, AggregateMetrics, AggregateMetricsRequest
from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.global_config import (
    OBSERVABILITY_ENABLED_KEY_NAME,
    TOKEN_ID_CAPTURE_BLOCK,
    get_first_server_config_dict,
)
from nemo_gym.rollout_correlation import current_rollout_id, maybe_rollout_id_from_run_body
from nemo_gym.server_utils import apply_rollout_prefix, rollout_path_prefix
from nemo_gym.serving.server import (
    BaseServer,
    BaseServerConfig,
    HTTPError,
    ServerRef,
    auth_headers,
    json_response,
    validation_error_body,
)
from nemo_gym.serving.server_client import ServerCallError

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
    session_close_retry_window_seconds: float = 300
    token_id_capture: bool = False


class SimpleResponsesAPIAgent(BaseServer):
    """Base of every agent server."""

    server_type: ClassVar[str] = "responses_api_agents"
    config: BaseResponsesAPIAgentConfig

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """Run one rollout for a dataset row and return the resources server's verify answer."""
        raise HTTPError(404, f"{type(self).__name__} does not serve /run")

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """Run the loop for a Responses API create request and return the final response object."""
        raise HTTPError(404, f"{type(self).__name__} does not serve /v1/responses")

    async def aggregate_metrics(self, body: dict[str, Any]) -> dict[str, Any]:
        """Metrics over verify answers: the resources server's own, or the default ones."""
        if self.config.resources_server is not None:
            return await self.server_client.post_json(
                self.config.resources_server.name, "/aggregate_metrics", body
            )
        from nemo_gym.collection.metrics import compute_aggregate_metrics

        return compute_aggregate_metrics(body.get("verify_responses", []))

    # ---- rollout correlation: NeMo Gym's helpers for the calls an agent makes ----------------
    def _global_config(self) -> Mapping[str, Any]:
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
        token_capture = isinstance(path, str) and f"/{TOKEN_CAPTURE_PATH_SEGMENT}/" in path
        return rollout_path_prefix(rollout_id, token_capture=token_capture) + url_path

    def resolve_model_base_url(self, model_server_name: str, rollout_id: str | None = None) -> str:
        """``http://host:port[/ng-rollout/<id>]/v1`` of a configured model server (from the
        global config), for harnesses that call it with their own OpenAI client."""
        server_config = get_first_server_config_dict(self._global_config(), model_server_name)
        base_url = self.server_client._build_server_base_url(server_config)
        prefixed = apply_rollout_prefix(base_url, rollout_id, token_capture=self._token_id_capture_enabled())
        return f"{prefixed}/v1"

    def routes(self) -> list[Route]:
        """Liveness, ``/run``, ``/v1/responses`` and ``/aggregate_metrics``."""
        return super().routes() + [
            self.route("/run", self.run),
            self.route("/v1/responses", self.responses),
            self._aggregate_metrics_route(),
        ]

    def _aggregate_metrics_route(self) -> Route:
        if type(self).aggregate_metrics is not SimpleResponsesAPIAgent.aggregate_metrics:
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
                        "failure_class": "unreachable",
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
    tool_accesses: list[Any] = Field(default_factory=list)
    sandbox_access: Any = None


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


BaseResponsesAPIAgent = SimpleResponsesAPIAgent


def __getattr__(name: str) -> Any:
    # FastAPI's Body, which NeMo Gym agents import from here: loaded only when asked for, so
    # our own agents never import FastAPI.
    if name == "Body":
        from fastapi import Body

        return Body
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
