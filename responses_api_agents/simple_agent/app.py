"""simple_agent: the multi-turn tool loop.

seed_session → model call → run every function_call against the resources server → feed the
outputs back → until a model call makes no tool call (or ``max_steps`` calls) → verify.
"""

from __future__ import annotations

from typing import Any

import orjson

from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
    row_create_params,
)
from nemo_gym.response_items import add_usage, function_call_output_item, function_calls, input_items
from nemo_gym.server import ServerRef
from nemo_gym.server_client import Rollout, ServerCallError


class SimpleAgentConfig(BaseResponsesAPIAgentConfig):
    """``resources_server`` and ``model_server`` refs; ``max_steps`` caps model calls per rollout.

    ``execute_tool_calls: false`` ends the rollout after the first model call, leaving its
    function calls unexecuted (for environments that score the calls themselves).
    """

    resources_server: ServerRef
    model_server: ServerRef
    max_steps: int | None = 50
    execute_tool_calls: bool = True


class SimpleAgent(SimpleResponsesAPIAgent):
    """Runs a row's conversation through the model, executing tool calls on the resources server."""

    config: SimpleAgentConfig

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """One rollout: seed the session, run the loop, return the verify answer."""
        params = row_create_params(body)
        rollout = self.server_client.rollout(self.rollout_id)
        resources = self.config.resources_server.name
        await rollout.post_json(resources, "/seed_session", body)
        response = await self.loop(rollout, params)
        return await rollout.post_json(resources, "/verify", {**body, "response": response})

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """The loop as a Responses API model: the final response, no seeding and no verify."""
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
            last = await rollout.post_json(
                self.config.model_server.name, "/v1/responses", {**params, "input": history + produced}
            )
            output = last.get("output") or []
            produced.extend(output)
            usage = add_usage(usage, last.get("usage"))
            calls = function_calls(output)
            if not calls or last.get("status") == "incomplete" or not self.config.execute_tool_calls:
                break
            for call in calls:  # in order: stateful environments see calls as the model made them
                produced.append(
                    function_call_output_item(call["call_id"], await self.call_tool(rollout, call))
                )
        return {**last, "output": produced, "usage": usage}

    async def call_tool(self, rollout: Rollout, call: dict[str, Any]) -> str:
        """Run one function call; any failure comes back as text for the model, not an exception."""
        name = call.get("name", "")
        try:
            arguments = orjson.loads(call.get("arguments") or "{}")
        except orjson.JSONDecodeError as exc:
            return f"Error: the arguments of {name!r} are not valid JSON: {exc}"
        try:
            resp = await rollout.post(self.config.resources_server.name, f"/{name}", arguments)
        except ServerCallError as exc:
            return f"Error: tool {name!r} could not be called: {exc}"
        if resp.status == 404:
            return f"Error: there is no tool named {name!r}"
        if not resp.ok:
            try:
                detail = resp.json()
                detail = detail.get("error", detail) if isinstance(detail, dict) else detail
            except orjson.JSONDecodeError:
                detail = resp.body.decode(errors="replace")
            return f"Error: tool {name!r} failed (HTTP {resp.status}): {detail}"
        result = resp.json()
        return result if isinstance(result, str) else orjson.dumps(result).decode()


if __name__ == "__main__":
    SimpleAgent.run_webserver()
