"""The environment contract: subclass ``SimpleResourcesServer``, add tools, implement ``verify``.

What a resources server does, route by route:

- ``POST /seed_session`` (:meth:`SimpleResourcesServer.seed_session`): the whole dataset row;
  open per-rollout state in ``self.session``. Returns ``{}``.
- ``POST /<tool>`` (methods marked with :func:`tool`): tool arguments → tool result.
- ``POST /verify`` (:meth:`SimpleResourcesServer.verify`): row + ``response`` → row + ``response``
  + ``reward`` (+ diagnostics). The session is freed afterwards.
- ``POST /aggregate_metrics`` (:meth:`SimpleResourcesServer.compute_metrics`): metrics over many
  verify answers.

A minimal environment::

    class WeatherServer(SimpleResourcesServer):
        config: BaseResourcesServerConfig

        @tool
        async def get_weather(self, body: GetWeatherRequest) -> dict:
            return {"city": body.city, "weather": "sunny"}

        async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
            return BaseVerifyResponse(**body.model_dump(), reward=1.0)

    if __name__ == "__main__":
        WeatherServer.run_webserver()
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.routing import Route

from nemo_gym.response_items import create_params_shape_errors, response_shape_errors
from nemo_gym.serving.protocol import MCP_METADATA_KEY, MCP_SESSION_TOKEN_HEADER, RESERVED_MCP_TOOL_NAMES  # noqa: F401
from nemo_gym.serving.server import BaseServer, BaseServerConfig, body_model

F = TypeVar("F", bound=Callable[..., Any])

# NeMo Gym's names: the /seed_session answer's MCP key and the session-token header it carries.
NEMO_GYM_MCP_METADATA_KEY = MCP_METADATA_KEY
NEMO_GYM_MCP_SESSION_TOKEN_HEADER = MCP_SESSION_TOKEN_HEADER


class BaseResourcesServerConfig(BaseServerConfig):
    """Config of a resources server; environments subclass it for their own fields.

    ``max_aggregate_metrics_body_bytes`` bounds an ``/aggregate_metrics`` body sent one verify
    response per line (it goes to a temporary file, not to memory); a body in another layout
    is parsed whole and bounded by ``max_body_bytes``.

    ``expose_tools_over_mcp`` also serves the tools over MCP at ``/mcp``, per rollout session
    (see :mod:`nemo_gym.mcp_auto_exposure`).
    """

    max_aggregate_metrics_body_bytes: int = 64 * 1024**3
    expose_tools_over_mcp: bool = False


class BaseRunRequest(BaseModel):
    """A dataset row: ``responses_create_params`` plus any task fields (kept as they are)."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("responses_create_params")
    @classmethod
    def _create_params_shape(cls, value: dict[str, Any]) -> dict[str, Any]:
        # input/tools of the wrong type are the caller's mistake: a 422 naming the field.
        errors = create_params_shape_errors(value)
        if errors:
            raise ValueError("; ".join(errors[:5]))
        return value


class BaseSeedSessionRequest(BaseRunRequest):
    """The row sent to ``/seed_session``."""


class BaseSeedSessionResponse(BaseModel):
    """The answer to ``/seed_session`` (empty unless an environment adds fields)."""

    model_config = ConfigDict(extra="allow")


class BaseVerifyRequest(BaseRunRequest):
    """The row plus the agent's final ``response`` (a Responses API response object).

    ``response`` is required, as in NeMo Gym: a body without it is a client's mistake (a 422
    naming the field), never a rollout scored 0 on an empty answer.
    """

    response: dict[str, Any]

    @field_validator("response")
    @classmethod
    def _response_shape(cls, value: dict[str, Any]) -> dict[str, Any]:
        # A malformed output (an item that is a string, say) is the caller's mistake: a 422
        # naming the field, never a verifier crashing on it with a 500.
        errors = response_shape_errors(value)
        if errors:
            raise ValueError("; ".join(errors[:5]))
        return value


class BaseVerifyResponse(BaseVerifyRequest):
    """The verify request plus ``reward`` and optional ``reward_components`` and diagnostics."""

    reward: float
    reward_components: dict[str, float] | None = None


class AggregateMetricsRequest(BaseModel):
    """``{verify_responses: [...]}``: verify answers, heavy fields usually stripped."""

    model_config = ConfigDict(extra="allow")

    verify_responses: list[dict[str, Any]] = Field(default_factory=list)


def tool(fn: F | None = None, *, name: str | None = None) -> Any:
    """Mark a method as a tool served at ``POST /<name>`` (default: the method's name).

    The method takes one body argument: a pydantic model (validated; bad arguments get a 422
    naming the field, which the agent hands back to the model as text) or a plain dict.
    """

    def mark(func: F) -> F:
        func._ng_tool_name = name or func.__name__  # type: ignore[attr-defined]
        return func

    return mark(fn) if fn is not None else mark


class SimpleResourcesServer(BaseServer):
    """Base of every environment. Override :meth:`verify`; add tools with :func:`tool`.

    ``answer_field`` names a verify-answer field to use for ``majority@k`` in metrics.
    """

    server_type: ClassVar[str] = "resources_servers"
    answer_field: ClassVar[str | None] = None
    config: BaseResourcesServerConfig

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        """Open per-rollout state from the row (store it in ``self.session``). Default: nothing."""
        return BaseSeedSessionResponse()

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        """Score the rollout: return the request plus ``reward`` (and any diagnostics)."""
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")

    def compute_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """Aggregate metrics over verify answers: ``{agent_metrics, key_metrics, group_level_metrics}``."""
        from nemo_gym.collection.metrics import compute_aggregate_metrics

        metrics = compute_aggregate_metrics(verify_responses, answer_field=self.answer_field)
        metrics["key_metrics"] = self.get_key_metrics(metrics["agent_metrics"], metrics["key_metrics"])
        return metrics

    def get_key_metrics(self, agent_metrics: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
        """The few metrics printed at the end of a collection. Default: mean reward and pass@k."""
        return default

    def tools(self) -> dict[str, Callable[[Any], Any]]:
        """Every method marked with :func:`tool`, by tool name."""
        found = {}
        for attr in dir(type(self)):
            member = getattr(type(self), attr, None)
            tool_name = getattr(member, "_ng_tool_name", None)
            if tool_name:
                found[tool_name] = getattr(self, attr)
        return found

    def routes(self) -> list[Route]:
        """Liveness, ``/seed_session``, ``/verify``, ``/aggregate_metrics`` and one route per tool."""
        seed: Callable[[Any], Any] = self.seed_session
        verify: Callable[[Any], Any] = self._verify_and_free
        mcp = None
        if self.config.expose_tools_over_mcp:
            from nemo_gym.mcp_auto_exposure import exposure_of

            mcp = exposure_of(self)
            seed, verify = self._seed_session_with_mcp, mcp.bare_tool_names(verify)
        routes = super().routes() + [
            self.route("/seed_session", seed, body_model_of=self.seed_session),
            self.route("/verify", verify),
            Route("/aggregate_metrics", self._aggregate_metrics_endpoint(), methods=["POST"]),
        ]
        reserved = {"seed_session", "verify", "aggregate_metrics", ""}
        for tool_name, handler in self.tools().items():
            if tool_name in reserved:
                raise ValueError(
                    f"{type(self).__name__}: tool name {tool_name!r} clashes with a built-in route"
                )
            routes.append(self.route(f"/{tool_name}", handler))
        return routes + (mcp.routes() if mcp is not None else [])  # type: ignore[operator]

    def mcp_tools(self, harvested: list[Any], catchall: Any) -> list[Any] | None:
        """The tools served over MCP (default: every tool). Override to leave some out."""
        return harvested

    def mcp_allowed_tools_for_session(self, seed_body: dict[str, Any]) -> list[str] | None:
        """Tool names one rollout's MCP token may list and call (default ``None``: all)."""
        return None

    async def _seed_session_with_mcp(self, body: Any) -> Any:
        from nemo_gym.mcp_auto_exposure import exposure_of

        return exposure_of(self).seed_answer(await self.seed_session(body), body)

    async def _verify_and_free(self, body: dict[str, Any]) -> Any:
        request_model, produced = self._verify_models()
        # A recorded rollout replayed through /verify still carries the previous verdict
        # (reward, diagnostics); drop what verify itself produces so it is computed afresh.
        fresh = {k: v for k, v in body.items() if k not in produced}
        try:
            return await self.verify(request_model.model_validate(fresh))  # type: ignore[arg-type]
        finally:
            if self.session_id is not None:
                self.sessions.free(self.session_id)

    def _verify_models(self) -> tuple[type[BaseModel], frozenset[str]]:
        cached = getattr(self, "_verify_models_cache", None)
        if cached is None:
            request_model = body_model(self.verify) or BaseVerifyRequest
            hints = typing.get_type_hints(type(self).verify)
            response_model = hints.get("return", BaseVerifyResponse)
            if not (inspect.isclass(response_model) and issubclass(response_model, BaseModel)):
                response_model = BaseVerifyResponse
            produced = frozenset(response_model.model_fields) - frozenset(request_model.model_fields)
            cached = self._verify_models_cache = (request_model, produced)
        return cached

    def _aggregate_metrics_endpoint(self) -> Callable[[Any], Any]:
        from nemo_gym.collection.aggregate_endpoint import aggregate_endpoint
        from nemo_gym.collection.streaming_metrics import MetricsAccumulator

        # An environment with its own compute_metrics gets every row as a list, as before;
        # the default streams rows through an accumulator in bounded memory.
        own = type(self).compute_metrics is not SimpleResourcesServer.compute_metrics
        return aggregate_endpoint(
            server_name=lambda: self.name,
            max_stream_bytes=lambda: self.config.max_aggregate_metrics_body_bytes,
            max_whole_bytes=lambda: self.config.max_body_bytes,
            new_accumulator=lambda: MetricsAccumulator(answer_field=self.answer_field),
            key_metrics=self.get_key_metrics,
            compute_whole=self.compute_metrics if own else None,
        )
