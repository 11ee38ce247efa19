"""gymnasium_agent: drives a Gymnasium-style environment (``nemo_gym.gymnasium_server``).

reset → model call → step → ... until the step says ``terminated`` or ``truncated``, or
``max_steps`` model calls were made (then the rollout is ``truncated``). The rollout's reward
is the sum of the step rewards, and its response holds every item in order: what the model
produced (token-ID fields untouched), each step's tool outputs as ``function_call_output``
items and each observation as a user message. There is no ``/verify``: the steps score.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    HopFault,
    Rollout,
    ServerRef,
    SimpleResponsesAPIAgent,
    call_json,
    call_model,
    rollout_deadline,
    row_create_params,
)
from nemo_gym.failure_classes import BAD_UPSTREAM_BODY
from nemo_gym.gymnasium_server import EnvResetResponse, EnvStepResponse
from nemo_gym.response_items import add_usage, function_call_output_item, input_items

logger = logging.getLogger("nemo_gym")


class GymnasiumAgentConfig(BaseResponsesAPIAgentConfig):
    """``resources_server`` (NeMo Gym's older configs call it ``env_server``), ``model_server``, ``max_steps``.

    ``hop_timeout_s`` is the deadline of one model call or ``/reset``, ``/step``, ``/close``
    (default ``NEMO_GYM_HOP_TIMEOUT_S``, 300 s), ``rollout_timeout_s`` of a whole episode
    (default ``NEMO_GYM_ROLLOUT_TIMEOUT_S``, 1,200 s). An infrastructure fault in any hop fails
    the rollout with a failure class (see :mod:`nemo_gym.agents.agent_hops`), never a reward.
    """

    resources_server: ServerRef
    model_server: ServerRef
    max_steps: int = Field(10, ge=1)
    hop_timeout_s: float | None = Field(default=None, gt=0)
    rollout_timeout_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _env_server_is_resources_server(cls, data: Any) -> Any:
        if isinstance(data, dict) and "env_server" in data:
            data = dict(data)
            env_server = data.pop("env_server")
            data.setdefault("resources_server", env_server)
        return data


def user_message(text: str) -> dict[str, Any]:
    """An observation as the next user message of the conversation."""
    return {"type": "message", "role": "user", "content": text}


class GymnasiumAgent(SimpleResponsesAPIAgent):
    """Runs one episode per row against a Gymnasium-style resources server."""

    config: GymnasiumAgentConfig

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """One episode: the row plus ``response``, ``reward`` (summed), ``terminated``, ``truncated``, ``info``.

        ``responses_create_params`` comes back with the opening observation appended, as the
        model saw it. The environment is closed (when it says it supports ``/close``) whether
        the episode finished, hit ``max_steps``, failed or ran out of time.
        """
        params = row_create_params(body)
        rollout = self.rollout_client(body)
        env = self.config.resources_server.name
        closable = False
        try:
            async with rollout_deadline(self.config.rollout_timeout_s, self.name):
                answer = await call_json(rollout, env, "/reset", body, timeout_s=self.config.hop_timeout_s)
                # A reset that answered owns state on the server even if its body is malformed.
                info = answer.get("info") if isinstance(answer, dict) else None
                closable = isinstance(info, dict) and info.get("supports_explicit_close") is True
                reset = self._parse(EnvResetResponse, answer, "/reset")
                result = await self._episode(rollout, body, params, reset)
        except BaseException:
            if closable:
                await self._close(rollout)  # the model or a step failed: free the environment's state
            raise
        if closable:
            warning = await self._close(rollout)
            if warning is not None:
                result["info"] = {**result["info"], "cleanup_warning": warning}
        return result

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """One model call passed through (an episode needs a row: use ``/run``)."""
        rollout = self.rollout_client()
        return await call_model(
            rollout, self.config.model_server.name, body, timeout_s=self.config.hop_timeout_s
        )

    async def _episode(
        self, rollout: Rollout, row: dict[str, Any], params: dict[str, Any], reset: EnvResetResponse
    ) -> dict[str, Any]:
        env, model = self.config.resources_server.name, self.config.model_server.name
        hop = self.config.hop_timeout_s
        opening = input_items(params)
        if reset.observation:
            opening.append(user_message(reset.observation))
        params = {**params, "input": opening}
        produced: list[dict[str, Any]] = []
        usage: dict[str, Any] | None = None
        last: dict[str, Any] = {}
        total_reward = 0.0
        step = EnvStepResponse()
        finished = False
        for _ in range(self.config.max_steps):
            last = await call_model(rollout, model, {**params, "input": opening + produced}, timeout_s=hop)
            output = list(last.get("output") or [])
            produced.extend(output)
            usage = add_usage(usage, last.get("usage"))
            step_body = {**row, "response": {**last, "output": output}}
            answer = await call_json(rollout, env, "/step", step_body, timeout_s=hop)
            step = self._parse(EnvStepResponse, answer, "/step")
            total_reward += step.reward
            for entry in step.info.get("tool_outputs") or []:
                produced.append(self._tool_output(entry))
            if step.observation:
                produced.append(user_message(step.observation))
            if step.terminated or step.truncated:
                finished = True
                break
        return {
            **row,
            "responses_create_params": params,
            "response": {**last, "output": produced, "usage": usage},
            "reward": total_reward,
            "terminated": step.terminated,
            "truncated": step.truncated or not finished,
            "info": step.info,
        }

    async def _close(self, rollout: Rollout) -> dict[str, Any] | None:
        """POST /close; a failure is logged and returned as a warning, never raised."""
        try:
            await call_json(
                rollout, self.config.resources_server.name, "/close", {}, timeout_s=self.config.hop_timeout_s
            )
        except Exception as exc:  # noqa: BLE001 - cleanup must not replace the rollout's own result or error
            logger.warning("%s: closing the environment failed: %s", self.name, exc)
            return {"operation": "close", "error_type": type(exc).__name__, "message": str(exc)}
        return None

    def _parse(self, model: type[BaseModel], answer: Any, route: str) -> Any:
        try:
            return model.model_validate(answer)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "body"
            raise self._bad_body(route, f"answered a malformed body: {first['msg']} at {where}") from None

    def _tool_output(self, entry: Any) -> dict[str, Any]:
        if not isinstance(entry, dict) or not isinstance(entry.get("call_id"), str) or "output" not in entry:
            raise self._bad_body("/step", "answered info.tool_outputs entries without call_id and output")
        output = entry["output"]
        return function_call_output_item(entry["call_id"], output if isinstance(output, str) else str(output))

    def _bad_body(self, route: str, message: str) -> HopFault:
        return HopFault(BAD_UPSTREAM_BODY, self.config.resources_server.name, route, message)


if __name__ == "__main__":
    GymnasiumAgent.run_webserver()
