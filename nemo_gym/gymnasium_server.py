"""Gymnasium-style environments over HTTP: subclass ``GymnasiumServer``, implement ``step``.

This is NeMo Gym's ``GymnasiumServer`` contract (its ``resources_servers.gymnasium``), paired
with ``responses_api_agents/gymnasium_agent``. Route by route:

- ``POST /reset``: the dataset row → ``{observation, info}``. Calls :meth:`GymnasiumServer.reset`
  with the row's fields other than ``responses_create_params`` (``metadata``). A ``None``
  observation means "the row's prompt is the whole first message".
- ``POST /step``: the row plus the model's ``response`` (one model call's Responses object) →
  ``{observation, reward, terminated, truncated, info}``. The agent adds each step's ``reward``
  to the rollout's reward; ``info.tool_outputs`` (``[{call_id, output}]``) become
  ``function_call_output`` items and ``observation`` the next user message. When ``terminated``
  or ``truncated`` the rollout's state is freed.
- ``POST /close``: frees the rollout's state early (an agent whose model call failed). The
  reset ``info`` says ``supports_explicit_close: true`` so the agent knows to call it.
- ``POST /verify`` is not how these environments score; it answers 400 saying so.

A minimal environment::

    class GuessServer(GymnasiumServer):
        async def reset(self, metadata, session_id=None):
            self.session_state[session_id] = {"target": metadata["target"]}
            return "Guess a number: answer <guess>N</guess>.", {}

        async def step(self, action, metadata, session_id=None):
            target = self.session_state[session_id]["target"]
            if f"<guess>{target}</guess>" in extract_text(action):
                return None, 1.0, True, False, {}
            return "No. Guess again.", 0.0, False, False, {}

Per-rollout state lives in ``self.session_state[session_id]`` (as in NeMo Gym); here it is
kept in the server's session store, so it expires after ``session_ttl_s`` and is bounded by
``max_sessions`` even for an agent that never finishes an episode. ``action`` is the response
as a plain dict (NeMo Gym passes a pydantic object): read its text with :func:`extract_text`
and its calls with :func:`nemo_gym.response_items.function_calls`.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.routing import Route

from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyRequest, SimpleResourcesServer
from nemo_gym.serving.server import HTTPError, SessionStore, validation_error_body

RowT = TypeVar("RowT", bound=BaseModel)

__all__ = [
    "EnvCloseResponse",
    "EnvResetRequest",
    "EnvResetResponse",
    "EnvStepRequest",
    "EnvStepResponse",
    "GymnasiumServer",
    "SessionStateView",
    "StepResult",
    "extract_text",
    "tool_output",
]

StepResult = tuple[str | None, float, bool, bool, dict[str, Any]]
"""What :meth:`GymnasiumServer.step` returns: ``(observation, reward, terminated, truncated, info)``."""


class EnvResetRequest(BaseRunRequest):
    """The dataset row sent to ``/reset``."""


class EnvResetResponse(BaseModel):
    """The opening observation (``None``: the row's prompt is enough) and the episode's ``info``."""

    model_config = ConfigDict(extra="allow")

    observation: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)


class EnvStepRequest(BaseRunRequest):
    """The row plus ``response``: the Responses object of the model call to act on."""

    response: dict[str, Any]


class EnvStepResponse(BaseModel):
    """One transition: the next observation (``None`` once over), the step's reward, the end flags."""

    model_config = ConfigDict(extra="allow")

    observation: str | None = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class EnvCloseResponse(BaseModel):
    """The answer to ``/close``: whether the rollout still had state to free."""

    closed: bool


def extract_text(action: dict[str, Any]) -> str:
    """The text of every assistant message in a response's ``output``, joined with nothing.

    Reasoning items and tool calls add nothing (NeMo Gym's ``extract_text``).
    """
    parts: list[str] = []
    for item in action.get("output") or []:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                part.get("text") or ""
                for part in content
                if isinstance(part, dict) and part.get("type") == "output_text"
            )
    return "".join(parts)


def tool_output(call: dict[str, Any], result: Any) -> dict[str, Any]:
    """An ``info.tool_outputs`` entry answering ``call`` (a ``function_call`` item) with ``result``."""
    import orjson

    output = result if isinstance(result, str) else orjson.dumps(result, default=str).decode()
    return {"call_id": call["call_id"], "output": output}


class SessionStateView:
    """``self.session_state``: per-rollout state by session id, kept in the server's session store.

    Reads and writes look like NeMo Gym's plain dict (``state[sid] = ...``, ``.get``, ``.pop``,
    ``in``), but entries expire with their session (``session_ttl_s``) and are bounded by
    ``max_sessions``, and freeing the session frees them.
    """

    KEY: ClassVar[str] = "gymnasium_state"

    def __init__(self, store: SessionStore) -> None:
        self._store = store

    def __getitem__(self, session_id: str | None) -> Any:
        state = self._store.get(session_id, create=False) if session_id is not None else None
        if state is None or self.KEY not in state:
            raise KeyError(session_id)
        return state[self.KEY]

    def __setitem__(self, session_id: str | None, value: Any) -> None:
        if session_id is None:
            raise RuntimeError("session_state needs a session id: set it while handling /reset or /step")
        state = self._store.get(session_id)
        assert state is not None
        state[self.KEY] = value

    def __delitem__(self, session_id: str | None) -> None:
        if session_id is None or session_id not in self:
            raise KeyError(session_id)
        self._store.free(session_id)

    def __contains__(self, session_id: object) -> bool:
        if not isinstance(session_id, str) or session_id not in self._store:
            return False
        state = self._store.get(session_id, create=False)
        return state is not None and self.KEY in state

    def get(self, session_id: str | None, default: Any = None) -> Any:
        """The rollout's state, or ``default`` when it has none (never reset, expired, freed)."""
        try:
            return self[session_id]
        except KeyError:
            return default

    def pop(self, session_id: str | None, default: Any = None) -> Any:
        """Remove and return the rollout's state (the whole session is freed)."""
        value = self.get(session_id, default)
        if session_id is not None:
            self._store.free(session_id)
        return value


class GymnasiumServer(SimpleResourcesServer):
    """Base of a Gymnasium-style environment: override :meth:`step`, optionally :meth:`reset`.

    ``supports_explicit_close`` (default True) is advertised in every reset ``info`` so the
    agent calls ``/close`` when a rollout ends without a terminal step.
    """

    plain_bodies = True  # handlers read response/responses_create_params as dicts

    supports_explicit_close: ClassVar[bool] = True

    @property
    def session_state(self) -> SessionStateView:
        """Per-rollout state by session id (see :class:`SessionStateView`)."""
        view = getattr(self, "_session_state_view", None)
        if view is None:
            view = self._session_state_view = SessionStateView(self.sessions)
        return view

    def parse_row(self, model: type[RowT], metadata: dict[str, Any]) -> RowT:
        """``metadata`` validated as ``model``; a 422 listing each invalid row field otherwise."""
        try:
            return model.model_validate(metadata)
        except ValidationError as exc:
            body = validation_error_body(exc, self.name, "row")
            raise HTTPError(422, body["error"], detail=body["detail"]) from None

    async def reset(
        self, metadata: dict[str, Any], session_id: str | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        """Start an episode for a row; returns ``(observation, info)``.

        ``metadata`` holds the row's fields other than ``responses_create_params``. Store the
        episode in ``self.session_state[session_id]``. Default: no state, no observation.
        """
        return None, {}

    async def step(
        self, action: dict[str, Any], metadata: dict[str, Any], session_id: str | None = None
    ) -> StepResult:
        """Act on one model response; returns ``(observation, reward, terminated, truncated, info)``.

        ``observation`` is the next user message (``None`` once the episode is over); ``reward``
        this step's reward (the rollout's reward is the sum); ``terminated`` when the episode
        ended by its own rules, ``truncated`` when cut short. Raise
        :class:`~nemo_gym.serving.server.HTTPError` (a 4xx) for a request that cannot be served.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    async def close_session(self, session_id: str | None) -> bool:
        """Free a rollout's state; returns whether it had any. Override to release more (files, processes)."""
        if session_id is None or session_id not in self.sessions:
            return False
        self.sessions.free(session_id)
        return True

    async def verify(self, body: BaseVerifyRequest) -> Any:  # type: ignore[override]
        """Not how a Gymnasium-style environment scores: a 400 saying so."""
        raise HTTPError(
            400,
            f"{self.name} is a Gymnasium-style environment: its rewards come from /step, so it has no "
            "/verify; run it with gymnasium_agent (responses_api_agents/gymnasium_agent)",
        )

    def routes(self) -> list[Route]:
        """The resources-server routes plus ``/reset``, ``/step`` and ``/close``."""
        reserved = {"reset", "step", "close"}
        clash = reserved & set(self.tools())
        if clash:
            raise ValueError(
                f"{type(self).__name__}: tool name {sorted(clash)[0]!r} clashes with a Gymnasium route"
            )
        return super().routes() + [
            self.route("/reset", self._reset_endpoint),
            self.route("/step", self._step_endpoint),
            self.route("/close", self._close_endpoint),
        ]

    async def _reset_endpoint(self, body: EnvResetRequest) -> EnvResetResponse:
        session_id = self.session_id
        # A reset inside a session that is still open starts over: the old episode is dropped.
        await self.close_session(session_id)
        observation, info = await self.reset(dict(body.model_extra or {}), session_id)
        info = dict(info or {})
        if self.supports_explicit_close:
            info.setdefault("supports_explicit_close", True)
        return EnvResetResponse(observation=observation, info=info)

    async def _step_endpoint(self, body: EnvStepRequest) -> EnvStepResponse:
        session_id = self.session_id
        result = await self.step(body.response, dict(body.model_extra or {}), session_id)
        try:
            observation, reward, terminated, truncated, info = result
        except (TypeError, ValueError):
            raise TypeError(
                f"{type(self).__name__}.step must return (observation, reward, terminated, truncated, info), "
                f"got {type(result).__name__}"
            ) from None
        if terminated or truncated:
            await self.close_session(session_id)
        return EnvStepResponse(
            observation=observation,
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=dict(info or {}),
        )

    async def _close_endpoint(self, body: dict[str, Any]) -> EnvCloseResponse:
        return EnvCloseResponse(closed=await self.close_session(self.session_id))
