"""simple_agent: the multi-turn tool loop.

seed_session → model call → run every function_call against the resources server → feed the
outputs back → until a model call makes no tool call (or ``max_steps`` calls) → verify.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from nemo_gym.agent_hops import call_json, call_model, execute_tool_calls, rollout_deadline
from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
    row_create_params,
)
from nemo_gym.response_items import add_usage, create_params_shape_errors, function_calls, input_items
from nemo_gym.server import HTTPError, ServerRef
from nemo_gym.server_client import Rollout


class SimpleAgentConfig(BaseResponsesAPIAgentConfig):
    """``resources_server`` and ``model_server`` refs; ``max_steps`` caps model calls per rollout.

    ``execute_tool_calls: false`` ends the rollout after the first model call, leaving its
    function calls unexecuted (for environments that score the calls themselves).

    ``hop_timeout_s`` is the deadline of one model or tool call (default ``NEMO_GYM_HOP_TIMEOUT_S``,
    300 s), ``rollout_timeout_s`` of a whole rollout (default ``NEMO_GYM_ROLLOUT_TIMEOUT_S``, 1,200 s).
    An infrastructure fault in any call fails the rollout with a failure class (see
    :mod:`nemo_gym.agent_hops`); it is never shown to the model or verified.
    """

    resources_server: ServerRef
    model_server: ServerRef
    max_steps: int | None = 50
    execute_tool_calls: bool = True
    hop_timeout_s: float | None = Field(default=None, gt=0)
    rollout_timeout_s: float | None = Field(default=None, gt=0)


class SimpleAgent(SimpleResponsesAPIAgent):
    """Runs a row's conversation through the model, executing tool calls on the resources server."""

    config: SimpleAgentConfig

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """One rollout: seed the session, run the loop, return the verify answer."""
        params = row_create_params(body)
        rollout = self.server_client.rollout(self.rollout_id)
        resources = self.config.resources_server.name
        hop = self.config.hop_timeout_s
        async with rollout_deadline(self.config.rollout_timeout_s, self.name):
            await call_json(rollout, resources, "/seed_session", body, timeout_s=hop)
            response = await self.loop(rollout, params)
            return await call_json(
                rollout, resources, "/verify", {**body, "response": response}, timeout_s=hop
            )

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """The loop as a Responses API model: the final response, no seeding and no verify."""
        errors = create_params_shape_errors(body, "body")
        if errors:
            raise HTTPError(422, "invalid body: " + "; ".join(errors[:5]))
        async with rollout_deadline(self.config.rollout_timeout_s, self.name):
            return await self.loop(self.server_client.rollout(self.rollout_id), body)

    async def loop(self, rollout: Rollout, params: dict[str, Any]) -> dict[str, Any]:
        """Call the model and tools until the model answers without a tool call.

        The returned response carries every item produced in the rollout (model outputs and
        tool outputs, token-ID fields untouched) and the usage summed over all model calls.
        """
        history = input_items(params)
        produced: list[dict[str, Any]] = []
        usage: dict[str, Any] | None = None
        last: dict[str, Any] = {}
        steps = 0
        while self.config.max_steps is None or steps < self.config.max_steps:
            steps += 1
            last = await call_model(
                rollout,
                self.config.model_server.name,
                {**params, "input": history + produced},
                timeout_s=self.config.hop_timeout_s,
            )
            output = last.get("output") or []
            produced.extend(output)
            usage = add_usage(usage, last.get("usage"))
            calls = function_calls(output)
            if not calls or last.get("status") == "incomplete" or not self.config.execute_tool_calls:
                break
            produced.extend(
                await execute_tool_calls(
                    rollout, self.config.resources_server.name, calls, timeout_s=self.config.hop_timeout_s
                )
            )
        return {**last, "output": produced, "usage": usage}


if __name__ == "__main__":
    SimpleAgent.run_webserver()
