"""simulated_user_agent: a conversation between the policy and a simulated user (tau-bench style).

The user is a second model server that plays a customer with the row's ``user_persona`` and
``user_goal``. Turns alternate: the user speaks, the policy answers (running simple_agent's tool
loop on the resources server: any number of tool calls, then a text answer), the user replies,
... until the user's message holds the stop marker (the user is satisfied or gives up) or
``max_turns`` policy answers. ``/verify`` sees the whole conversation: every policy item, tool
output and user message, in order, in the response's ``output``.

The user model sees the conversation from its side: its instructions (persona, goal, stop
marker) as the first ``user`` message (so any chat model, and the scripted test model's
regexes, read them), the policy's answers as ``user`` messages and its own earlier
messages as ``assistant`` messages; tool calls stay hidden from it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from nemo_gym.base_responses_api_agent import (
    HTTPError,
    Rollout,
    ServerRef,
    call_json,
    call_model,
    rollout_deadline,
    row_create_params,
)
from nemo_gym.response_items import add_usage, content_text, input_items, message_item, output_text
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig

DEFAULT_USER_INSTRUCTIONS = (
    "You are a customer talking to a support assistant. Stay in character and say only what "
    "the customer would say, one message at a time; do not invent facts beyond your goal.\n"
    "Persona: {persona}\n"
    "Goal: {goal}\n"
    "When your goal is done, or cannot be done, end the conversation with a message that "
    "contains {stop_marker}.\n"
    "Now write the customer's first message."
)


class SimulatedUserAgentConfig(SimpleAgentConfig):
    """simple_agent's fields plus the user.

    ``user_model_server``: the model that plays the user. ``max_turns``: policy answers per
    rollout (each may make up to ``max_steps`` model calls with tools). ``stop_marker``: the
    text by which the user ends the conversation. ``user_instructions``: the user's system
    prompt, a template with ``{persona}``, ``{goal}`` and ``{stop_marker}``.
    ``user_create_params``: extra Responses API fields for the user's calls (temperature, ...).
    """

    user_model_server: ServerRef
    max_turns: int = Field(default=10, ge=1)
    stop_marker: str = Field(default="###STOP###", min_length=1)
    user_instructions: str = DEFAULT_USER_INSTRUCTIONS
    user_create_params: dict[str, Any] = Field(default_factory=dict)


def user_view(instructions: str, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as the user model sees it: roles swapped, tool traffic and the
    policy's system prompt left out, token-ID fields dropped."""
    items: list[dict[str, Any]] = [{"role": "user", "content": instructions}]
    for item in conversation:
        role = item.get("role")
        if item.get("type", "message") != "message" or role not in ("user", "assistant"):
            continue
        text = content_text(item.get("content"))
        if role == "assistant":
            if text:
                items.append({"role": "user", "content": text})
        else:
            items.append(message_item(text, role="assistant"))
    return items


def user_message(text: str) -> dict[str, Any]:
    """A simulated user's message as a conversation item."""
    return {"type": "message", "role": "user", "content": text}


class SimulatedUserAgent(SimpleAgent):
    """Alternates a simulated user and the policy (with tools) until the user stops or ``max_turns``."""

    config: SimulatedUserAgentConfig

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """One rollout: seed the session, converse, verify the whole conversation.

        The verify answer gains ``num_user_turns`` and ``ended_by`` (``user_stop``,
        ``max_turns`` or ``incomplete``: a policy answer cut short).
        """
        params = row_create_params(body)
        instructions = self._user_instructions(body)
        rollout = self.rollout_client(body)
        resources = self.config.resources_server.name
        hop = self.config.hop_timeout_s
        async with rollout_deadline(self.config.rollout_timeout_s, self.name):
            await call_json(rollout, resources, "/seed_session", body, timeout_s=hop)
            response, ended_by = await self.converse(rollout, params, instructions)
            verified = await call_json(
                rollout, resources, "/verify", {**body, "response": response}, timeout_s=hop
            )
        user_turns = sum(1 for item in response["output"] if item.get("role") == "user")
        return {**verified, "num_user_turns": user_turns, "ended_by": ended_by}

    def _user_instructions(self, row: dict[str, Any]) -> str:
        missing = [f for f in ("user_goal",) if not isinstance(row.get(f), str) or not row[f].strip()]
        if missing:
            raise HTTPError(
                422, "row field 'user_goal' must be a non-empty string (what the simulated user wants)"
            )
        persona = row.get("user_persona") or "an ordinary customer"
        if not isinstance(persona, str):
            raise HTTPError(422, f"row field 'user_persona' must be a string, got {type(persona).__name__}")
        return self.config.user_instructions.format(
            persona=persona, goal=row["user_goal"], stop_marker=self.config.stop_marker
        )

    async def converse(
        self, rollout: Rollout, params: dict[str, Any], instructions: str
    ) -> tuple[dict[str, Any], str]:
        """Run the conversation; returns the response (every item after the row's input, the
        policy's usage summed) and why it ended."""
        history = input_items(params)
        produced: list[dict[str, Any]] = []
        usage: dict[str, Any] | None = None
        last: dict[str, Any] = {}
        if not history or history[-1].get("role") != "user":
            # The row holds no opening message: the user speaks first.
            opening = await self.user_says(rollout, instructions, history)
            produced.append(user_message(opening))
            if self.config.stop_marker in opening:
                return {"output": produced, "usage": usage}, "user_stop"
        ended_by = "max_turns"
        for turn in range(self.config.max_turns):
            last = await self.loop(rollout, {**params, "input": history + produced})
            produced.extend(last.get("output") or [])
            usage = add_usage(usage, last.get("usage"))
            if last.get("status") == "incomplete":
                ended_by = "incomplete"
                break
            if turn + 1 == self.config.max_turns:
                break
            reply = await self.user_says(rollout, instructions, history + produced)
            produced.append(user_message(reply))
            if self.config.stop_marker in reply:
                ended_by = "user_stop"
                break
        return {**last, "output": produced, "usage": usage}, ended_by

    async def user_says(self, rollout: Rollout, instructions: str, conversation: list[dict[str, Any]]) -> str:
        """The user model's next message (its text; token IDs and usage are not the policy's)."""
        answer = await call_model(
            rollout,
            self.config.user_model_server.name,
            {**self.config.user_create_params, "input": user_view(instructions, conversation)},
            timeout_s=self.config.hop_timeout_s,
        )
        return output_text(answer).strip() or self.config.stop_marker


if __name__ == "__main__":
    SimulatedUserAgent.run_webserver()
