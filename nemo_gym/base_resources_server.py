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
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue
from starlette.routing import Route

from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.models.plain_fields import LazyTyped, merged, plain_fields
from nemo_gym.response_items import create_params_shape_errors, response_shape_errors
from nemo_gym.serving.protocol import (  # noqa: F401 (re-exported at NeMo Gym's path)
    MCP_METADATA_KEY,
    MCP_SESSION_TOKEN_HEADER,
    RESERVED_MCP_TOOL_NAMES,
    normalize_tool_name,
)
from nemo_gym.serving.served_names import served_name
from nemo_gym.serving.server import BaseServer, BaseServerConfig, body_model

F = TypeVar("F", bound=Callable[..., Any])

# NeMo Gym's names: the /seed_session answer's MCP key and the session-token header it carries.
NEMO_GYM_MCP_METADATA_KEY = MCP_METADATA_KEY
NEMO_GYM_MCP_SESSION_TOKEN_HEADER = MCP_SESSION_TOKEN_HEADER


class ReverifyMode(str, Enum):  # noqa: UP042 - NeMo Gym's str(mode)
    """Whether a server's ``/verify`` can score a recorded rollout again (``gym eval reverify``)."""

    STATELESS = "stateless"
    UNSUPPORTED = "unsupported"
    UNKNOWN = "unknown"


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
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.UNKNOWN


def _openai_type(name: str) -> type[BaseModel]:
    """NeMo Gym's typed model ``name`` from :mod:`nemo_gym.openai_utils` (imports ``openai``)."""
    from nemo_gym import openai_utils

    return getattr(openai_utils, name)  # type: ignore[no-any-return]


# NeMo Gym's typed models; a plain dict when plain_bodies is in effect (nemo_gym.serving.request_context).
if TYPE_CHECKING:
    from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming

    ResponseField = NeMoGymResponse
    CreateParamsField = NeMoGymResponseCreateParamsNonStreaming
else:
    ResponseField = Annotated[
        Any, LazyTyped("NeMoGymResponse", response_shape_errors, "output", _openai_type)
    ]
    CreateParamsField = Annotated[
        Any,
        LazyTyped(
            "NeMoGymResponseCreateParamsNonStreaming", create_params_shape_errors, "input", _openai_type
        ),
    ]


class BaseRunRequest(BaseModel):
    """A dataset row: ``responses_create_params`` plus any task fields (kept as they are).

    ``responses_create_params`` is a :class:`~nemo_gym.openai_utils.NeMoGymResponseCreateParamsNonStreaming`
    (``body.responses_create_params.input``; it also answers ``.get("input")``).
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    responses_create_params: CreateParamsField = Field(default_factory=dict)  # type: ignore[assignment]

    # NeMo Gym's field for the row's ``_ng_rollout_id``: read from the row, set by name
    # (``model_copy(update={"capture_rollout_id": ...})``), left out of dumps as NeMo Gym's is.
    capture_rollout_id: str | None = Field(default=None, alias="_ng_rollout_id", exclude=True)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """pydantic's ``model_dump``; called bare (NeMo Gym's ``Answer(**body.model_dump(), ...)``),
        a field our own servers keep as a plain dict (a plain body's ``response``) is handed back
        as that same dict, not rebuilt item by item (pydantic copies every dict it dumps). The
        keys, their order and the values are pydantic's; only the copy is saved (the dict is the
        request's own, as ``body.response`` is)."""
        plain = None if kwargs else self._plain_dicts()
        if not plain:
            return super().model_dump(**kwargs)
        return merged(type(self), super().model_dump(exclude=set(plain)), plain, by_alias=False)

    def __ng_json_parts__(self) -> dict[str, Any] | None:
        """What :func:`nemo_gym.serving.error_answers.dumps` serialises for this answer: pydantic's
        JSON form (by alias) with the plain dicts left as they are instead of rebuilt (orjson
        writes them; anything in them that is not plain JSON sends it back to pydantic's own
        form). None when nothing is plain or this class dumps itself its own way."""
        if type(self).model_dump is not BaseRunRequest.model_dump:
            return None
        plain = self._plain_dicts()
        if not plain:
            return None
        rest = self.__pydantic_serializer__.to_python(self, mode="json", by_alias=True, exclude=set(plain))
        return merged(type(self), rest, plain, by_alias=True)

    def _plain_dicts(self) -> dict[str, dict[str, Any]]:
        fields = self.__dict__
        return {
            name: value for name in plain_fields(type(self)) if (value := fields.get(name)).__class__ is dict
        }


class BaseSeedSessionRequest(BaseRunRequest):
    """The row sent to ``/seed_session``."""


class BaseSeedSessionResponse(BaseModel):
    """The answer to ``/seed_session`` (empty unless an environment adds fields)."""

    model_config = ConfigDict(extra="allow")


class BaseVerifyRequest(BaseRunRequest):
    """The row plus the agent's final ``response``, a :class:`~nemo_gym.openai_utils.NeMoGymResponse`.

    ``response`` is required, as in NeMo Gym: a body without it is a client's mistake (a 422
    naming the field), never a rollout scored 0 on an empty answer.
    """

    response: ResponseField


class BaseVerifyResponse(BaseVerifyRequest):
    """The verify request plus ``reward`` and diagnostics.

    ``mask_sample`` (NeMo Gym's) marks a completed rollout whose reward is not a valid
    measurement (the environment, not the model, failed); ``failure_kind``/``failure_reason``
    say why. As in NeMo Gym, the answer holds the fields its class declares: a row's other
    fields, passed in with ``**body.model_dump()``, are left out (a subclass that wants them
    sets ``model_config = ConfigDict(extra="allow")``, as NeMo Gym's simple agent does).
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    reward: float
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None


class BaseMultiRewardVerifyResponse(BaseVerifyResponse):
    """A verify answer with several reward objectives: ``reward_components`` required, ``reward`` their aggregate."""

    reward_components: dict[str, float]


class MCPServerMetadata(BaseModel):
    """What a client needs to reach one rollout's tools over MCP (the seed answer's ``mcp`` key)."""

    server_name: str
    url_path: str = "/mcp"
    transport: str = "http"
    headers: dict[str, str]


class ResourcesSeedSessionRequest(BaseModel):
    """An Environment Server's seed: state opened under a caller-chosen ``resources_session_id``.

    Seeding the same id for the same episode again returns the existing session.
    """

    model_config = ConfigDict(extra="forbid")

    resources_session_id: str = Field(min_length=1)
    episode_id: EpisodeId
    task_id: TaskId
    task_data: dict[str, JsonValue]


class ResourcesSeedSessionResponse(BaseModel):
    """The seeded ``resources_session_id`` and, optionally, how the agent reaches tools or a sandbox."""

    model_config = ConfigDict(extra="forbid")

    resources_session_id: str
    resources_tools: MCPServerMetadata | None = None
    sandbox_access: Any = None


VerificationInputT = TypeVar("VerificationInputT")


class ResourcesVerifyRequest(BaseModel, Generic[VerificationInputT]):
    """An environment's typed output sent to a resources server for scoring."""

    model_config = ConfigDict(extra="forbid")

    episode_id: EpisodeId
    task_id: TaskId
    verification_input: VerificationInputT


class ResourcesCloseSessionRequest(BaseModel):
    """Close the state seeded under ``resources_session_id`` (``/close_session``)."""

    model_config = ConfigDict(extra="forbid")

    resources_session_id: str
    episode_id: EpisodeId


class ResourcesCloseSessionResponse(BaseModel):
    """The closed ``resources_session_id``."""

    model_config = ConfigDict(extra="forbid")

    resources_session_id: str


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

    Or, NeMo Gym's way: override ``setup_webserver()``, call the parent's, and add tool routes
    with ``app.post("/tool")(self.tool)`` (FastAPI binds the body and ``Request`` parameters).

    ``answer_field`` names a verify-answer field to use for ``majority@k`` in metrics.
    ``plain_bodies`` keeps ``response`` and ``responses_create_params`` plain dicts in the
    handlers (read as ``body.response["output"]``) and skips building the typed models: a
    faster hot path for servers written that way.
    """

    server_type: ClassVar[str] = "resources_servers"
    answer_field: ClassVar[str | None] = None
    plain_bodies: ClassVar[bool] = False
    config: BaseResourcesServerConfig

    def setup_webserver(self) -> Any:
        """The FastAPI app: ``/seed_session``, ``/verify``, ``/aggregate_metrics``, tools; extend it.

        ``app = super().setup_webserver(); app.post("/my_tool")(self.my_tool); return app``.
        """
        from nemo_gym.serving.fastapi_app import new_app, verify_route

        app = new_app(self)
        if self.config.expose_tools_over_mcp and not self.uses_setup_webserver():
            # Our style with tools over MCP (hosted by a caller, e.g. verifiers' taskset): the
            # same routes ng_run serves, MCP's session-bound seed and /mcp included.
            app.router.routes.extend(r for r in self.routes() if getattr(r, "path", None) != "/")
            return app
        if type(self).seed_session is SimpleResourcesServer.seed_session:
            app.post("/seed_session")(self._default_seed)
        else:
            app.post("/seed_session")(self.seed_session)
        app.post("/close_session")(self.close_resources_session)
        app.post("/verify")(verify_route(self, self._verify_judged))
        app.router.routes.append(
            Route("/aggregate_metrics", self._aggregate_metrics_endpoint(), methods=["POST"])
        )
        app.get("/reverify_mode")(self.get_reverify_mode)
        for tool_name, handler in self.tools().items():
            app.post(f"/{tool_name}")(handler)
        if self.config.expose_tools_over_mcp:
            from nemo_gym.mcp_auto_exposure import exposure_of

            # /mcp in front; its tools are the app's POST routes, those a subclass adds included.
            exposure_of(self).install_on_app(app)
        return app

    setup_webserver._ng_default_app = True  # type: ignore[attr-defined]

    def uses_setup_webserver(self) -> bool:
        """Served by FastAPI when ``setup_webserver`` is overridden or a route method takes FastAPI parameters."""
        if super().uses_setup_webserver():
            return True
        from nemo_gym.serving.fastapi_app import needs_fastapi

        handlers = [self.seed_session, self.verify, *self.tools().values()]
        return any(needs_fastapi(handler) for handler in handlers)  # type: ignore[arg-type]

    async def _default_seed(
        self, body: ResourcesSeedSessionRequest | BaseSeedSessionRequest
    ) -> ResourcesSeedSessionResponse | BaseSeedSessionResponse:
        return await self.seed_session(body)  # type: ignore[arg-type]

    async def get_reverify_mode(self) -> ReverifyMode:
        """Whether ``/verify`` can score a recorded rollout again (the config's ``REVERIFY_MODE``)."""
        return self.config.REVERIFY_MODE

    def normalize_tool_name(self, name: str) -> str:
        """A trajectory's tool-call name without this server's MCP namespace."""
        return normalize_tool_name(name, self.config.name or type(self).__name__)

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Metrics over verify answers (what ``/aggregate_metrics`` answers)."""
        return AggregateMetrics.model_validate(self._metrics_of(body.verify_responses))

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        """Open per-rollout state from the row (store it in ``self.session``). Default: nothing.

        An Environment Server's :class:`ResourcesSeedSessionRequest` gets its
        ``resources_session_id`` back.
        """
        if isinstance(body, ResourcesSeedSessionRequest):
            return ResourcesSeedSessionResponse(resources_session_id=body.resources_session_id)  # type: ignore[return-value]
        return BaseSeedSessionResponse()

    async def close_resources_session(
        self, body: ResourcesCloseSessionRequest
    ) -> ResourcesCloseSessionResponse:
        """Close state an Environment Server seeded (``/close_session``); the default keeps none.

        An override succeeds for a session already closed or never seeded, and keeps a seed
        arriving after the close from opening it again.
        """
        return ResourcesCloseSessionResponse(resources_session_id=body.resources_session_id)

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        """Score the rollout: return the request plus ``reward`` (and any diagnostics)."""
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")

    def compute_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """Aggregate metrics over verify answers: ``{agent_metrics, key_metrics, group_level_metrics}``.

        NeMo Gym's override, ``compute_metrics(self, tasks)`` (answers grouped by task, returning
        metrics merged into ``agent_metrics``), is recognised by its parameter name.
        """
        from nemo_gym.collection.metrics import compute_aggregate_metrics

        metrics = compute_aggregate_metrics(verify_responses, answer_field=self.answer_field)
        metrics["key_metrics"] = self._key_metrics(metrics["agent_metrics"], metrics["key_metrics"])
        return metrics

    def get_key_metrics(
        self, agent_metrics: dict[str, Any], default: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The few metrics printed at the end of a collection. Default: mean reward and pass@k.

        NeMo Gym's one-argument override ``get_key_metrics(self, agent_metrics)`` works too; called
        that way (``super().get_key_metrics(agent_metrics)``) the default is every ``mean/`` metric.
        """
        if default is None:
            return {k: v for k, v in agent_metrics.items() if k.startswith("mean/")}
        return default

    def _key_metrics(self, agent_metrics: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
        if len(inspect.signature(self.get_key_metrics).parameters) == 1:
            return self.get_key_metrics(agent_metrics)  # type: ignore[call-arg]
        return self.get_key_metrics(agent_metrics, default)

    def _nemo_gym_compute_metrics(self) -> bool:
        params = list(inspect.signature(self.compute_metrics).parameters)
        return bool(params) and params[0] == "tasks"

    def _metrics_of(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        if not self._nemo_gym_compute_metrics():
            return self.compute_metrics(verify_responses)
        from nemo_gym.collection.nemo_gym_compat import task_grouped_metrics

        return task_grouped_metrics(
            verify_responses,
            self.compute_metrics,  # type: ignore[arg-type]
            self._key_metrics,
            self.answer_field,
        )

    def tools(self) -> dict[str, Callable[[Any], Any]]:
        """Every method marked with :func:`tool`, by tool name."""
        found = {}
        for attr in dir(type(self)):
            member = getattr(type(self), attr, None)
            tool_name = getattr(member, "_ng_tool_name", None)
            if tool_name:
                found[tool_name] = getattr(self, attr)
        return found

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        """The function tools a model sees for this server's :func:`tool` methods, built from each
        method's name, docstring and body model (the ``tools`` of a data row: never paste them)."""
        from nemo_gym.serving.tool_schemas import function_tools

        found = {}
        for attr in dir(cls):
            member = getattr(cls, attr, None)
            tool_name = getattr(member, "_ng_tool_name", None)
            if tool_name and member is not None:
                found[tool_name] = member
        return function_tools(found)

    @classmethod
    def build_row(
        cls, prompt: str | list[dict[str, Any]], *, instructions: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """One data row for this environment: the prompt (a developer message first when
        ``instructions`` is given), :meth:`tool_schemas` as its tools, and ``fields`` (the row's
        own data, e.g. ``expected_answer``, which ``verify`` reads)."""
        from nemo_gym.serving.tool_schemas import task_row

        return task_row(prompt, cls.tool_schemas(), instructions=instructions, **fields)

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
            return await self._verify_judged(request_model.model_validate(fresh))
        finally:
            if self.session_id is not None:
                self.sessions.free(self.session_id)

    async def _verify_judged(self, *args: Any) -> Any:
        """``self.verify(*args)`` (``body``, or ``request, body``), a judge that failed answered as
        NeMo Gym's base answers it on every ``/verify``: :func:`nemo_gym.judge.judge_failed_answer`,
        a ``judge_failed`` row and never a reward."""
        try:
            return await self.verify(*args)
        except Exception as exc:
            from nemo_gym.judge import JudgeError, judge_failed_answer

            if not isinstance(exc, JudgeError):
                raise
            return judge_failed_answer(args[-1], exc)

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
            key_metrics=self._key_metrics,
            compute_whole=self._metrics_of if own else None,
        )


BaseResourcesServer = SimpleResourcesServer


def __getattr__(name: str) -> Any:
    # The typed models NeMo Gym's module also exposes here, imported only when asked for (they
    # import ``openai``, which our own servers never need).
    if name in ("NeMoGymResponse", "NeMoGymResponseCreateParamsNonStreaming"):
        from nemo_gym import openai_utils

        return getattr(openai_utils, name)
    return served_name(name, __name__)
