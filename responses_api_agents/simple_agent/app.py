"""simple_agent: the multi-turn tool loop.

seed_session → model call → run every function_call against the resources server → feed the
outputs back → until a model call makes no tool call (or ``max_steps`` calls) → verify.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from pydantic import Field

from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    HTTPError,
    MCPServerConfig,
    MCPToolbox,
    ModelConversation,
    Rollout,
    ServerRef,
    SimpleResponsesAPIAgent,
    call_json,
    callable_tools,
    close_stdio,
    execute_tool_call,
    offered_tools,
    rollout_deadline,
    row_create_params,
)
from nemo_gym.response_items import (
    UsageSum,
    create_params_shape_errors,
    function_call_output_item,
    function_calls,
    input_items,
)


class SimpleAgentConfig(BaseResponsesAPIAgentConfig):
    """``resources_server`` and ``model_server`` refs; ``max_steps`` caps model calls per rollout
    (unset by default, as in NeMo Gym: agents built on this config, such as its deepagents agent,
    reject a cap they cannot honour).

    ``execute_tool_calls: false`` ends the rollout after the first model call, leaving its
    function calls unexecuted (for environments that score the calls themselves).

    A model may call only the tools its row offers (``responses_create_params.tools``) plus
    ``allowed_tools``; any other name (``verify``, ``seed_session``, a tool not offered) is "no
    such tool" to it (see :mod:`nemo_gym.agents.agent_hops`).

    ``hop_timeout_s`` is the deadline of one model or tool call (default ``NEMO_GYM_HOP_TIMEOUT_S``,
    300 s), ``rollout_timeout_s`` of a whole rollout (default ``NEMO_GYM_ROLLOUT_TIMEOUT_S``, 1,200 s).
    An infrastructure fault in any call fails the rollout with a failure class (see
    :mod:`nemo_gym.agents.agent_hops`); it is never shown to the model or verified.

    ``mcp_servers`` (by name) adds the tools of MCP servers to every model call: streamable
    HTTP (``url``), stdio (``command``) or the resources server's own (``from_seed_session``);
    see :mod:`nemo_gym.agents.mcp_tools`.
    """

    resources_server: ServerRef
    model_server: ServerRef
    max_steps: int | None = None
    execute_tool_calls: bool = True
    allowed_tools: list[str] = Field(default_factory=list)
    hop_timeout_s: float | None = Field(default=None, gt=0)
    rollout_timeout_s: float | None = Field(default=None, gt=0)
    mcp_servers: dict[str, MCPServerConfig] = Field(default_factory=dict)


class SimpleAgent(SimpleResponsesAPIAgent):
    """Runs a row's conversation through the model, executing tool calls on the resources server."""

    config: SimpleAgentConfig

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """One rollout: seed the session, run the loop, return the verify answer."""
        params = row_create_params(body)
        rollout = self.rollout_client(body)
        resources = self.config.resources_server.name
        hop = self.config.hop_timeout_s
        async with rollout_deadline(self.config.rollout_timeout_s, self.name):
            seeded = await call_json(rollout, resources, "/seed_session", body, timeout_s=hop)
            async with self.mcp_toolbox(rollout, params, seeded) as toolbox:
                response = await self.loop(rollout, params, toolbox)
            if self.config.skip_verification:
                # NeMo Gym's switch: the response is kept with the configured reward, unverified.
                reward = float(self.config.skip_verification_reward)
                return {**body, "response": response, "reward": reward, "verification_skipped": True}
            return await call_json(
                rollout, resources, "/verify", {**body, "response": response}, timeout_s=hop
            )

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """The loop as a Responses API model: the final response, no seeding and no verify."""
        errors = create_params_shape_errors(body, "body")
        if errors:
            raise HTTPError(422, "invalid body: " + "; ".join(errors[:5]))
        async with rollout_deadline(self.config.rollout_timeout_s, self.name):
            rollout = self.rollout_client()
            async with self.mcp_toolbox(rollout, body, None) as toolbox:
                return await self.loop(rollout, body, toolbox)

    @contextlib.asynccontextmanager
    async def mcp_toolbox(
        self, rollout: Rollout, params: dict[str, Any], seeded: Any
    ) -> AsyncIterator[MCPToolbox | None]:
        """The rollout's MCP tools (None when no ``mcp_servers`` are configured)."""
        if not self.config.mcp_servers:
            yield None
            return
        resources = self.config.resources_server.name
        url = rollout.replicas.get(resources)
        if url is None and seeded is not None:
            url = await self.server_client.base_url(resources, affinity=rollout.rollout_id)
        taken = {t.get("name") for t in params.get("tools") or [] if isinstance(t, dict)}
        async with MCPToolbox.open(
            self.config.mcp_servers,
            stdio=self._stdio_processes,
            seed_answer=seeded,
            resources_url=url,
            timeout_s=self.config.hop_timeout_s,
            taken=frozenset(n for n in taken if isinstance(n, str)),
        ) as toolbox:
            yield toolbox

    @property
    def _stdio_processes(self) -> dict[str, Any]:
        # One process per stdio server for this agent process, started by its first rollout.
        found = getattr(self, "_ng_stdio_mcp", None)
        if found is None:
            found = {}
            object.__setattr__(self, "_ng_stdio_mcp", found)
        return found

    async def on_shutdown(self) -> None:
        """Stop the stdio MCP server processes this agent started."""
        await close_stdio(self._stdio_processes)
        await super().on_shutdown()

    async def loop(
        self, rollout: Rollout, params: dict[str, Any], toolbox: MCPToolbox | None = None
    ) -> dict[str, Any]:
        """Call the model and tools until the model answers without a tool call.

        The returned response carries every item produced in the rollout (model outputs and
        tool outputs, token-ID fields untouched) and the usage summed over all model calls.
        """
        items = list(input_items(params))  # the whole conversation, only ever appended to
        start = len(items)  # what the rollout produced: items[start:]
        usage = UsageSum()
        last: dict[str, Any] = {}
        tools = callable_tools(offered_tools(params, self.config.allowed_tools))  # checked once
        steps = 0
        if toolbox is not None:
            params = {**params, "tools": list(params.get("tools") or []) + toolbox.function_tools()}
        # Long rollouts send the model server only what is new each turn (see ModelConversation).
        config = self.config  # read once per rollout, not per turn
        max_steps, execute = config.max_steps, config.execute_tool_calls
        async with ModelConversation(
            rollout, config.model_server.name, timeout_s=config.hop_timeout_s
        ) as conversation:
            while max_steps is None or steps < max_steps:
                steps += 1
                last = await conversation.call(params, items)
                output = last.get("output") or []
                items.extend(output)
                usage.add(last.get("usage"))
                calls = function_calls(output)
                if not calls or last.get("status") == "incomplete" or not execute:
                    break
                outputs = await self.run_tool_calls(rollout, calls, toolbox, tools)
                items.extend(outputs)
        return {**last, "output": items[start:], "usage": usage.total()}

    async def run_tool_calls(
        self,
        rollout: Rollout,
        calls: list[dict[str, Any]],
        toolbox: MCPToolbox | None,
        offered: frozenset[str] = frozenset(),
    ) -> list[dict[str, Any]]:
        """Run calls in order, each on the resources server or on the MCP server offering it.

        Only the ``offered`` tools go to the resources server (see :func:`offered_tools`)."""
        resources, hop = self.config.resources_server.name, self.config.hop_timeout_s
        items = []
        for call in calls:  # execute_tool_calls' loop, with the MCP servers' tools besides
            if toolbox is not None and toolbox.owns(name := call.get("name") or ""):
                output = await toolbox.call(name, call.get("arguments"))
            else:
                output = await execute_tool_call(rollout, resources, call, offered, timeout_s=hop)
            items.append(function_call_output_item(call.get("call_id") or "", output))
        return items


if __name__ == "__main__":
    SimpleAgent.run_webserver()
