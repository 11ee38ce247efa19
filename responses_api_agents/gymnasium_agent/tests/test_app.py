"""gymnasium_agent: step rewards summed, tool outputs and observations in order, cleanup on every path."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from nemo_gym.gymnasium_server import GymnasiumServer, StepResult, extract_text, tool_output
from nemo_gym.response_items import count_model_turns, function_calls, input_items
from nemo_gym.serving.server import HTTPError
from nemo_gym.testing import SyncClient, running_agent
from responses_api_agents.gymnasium_agent.app import GymnasiumAgent, GymnasiumAgentConfig
from responses_api_models.scripted_model.app import ScriptedModel

ROW = {"responses_create_params": {"input": "Count the lamps, then report."}, "lamps": 3, "id": 7}


class LampServer(GymnasiumServer):
    """A tool-calling episode: ``count_lamps`` pays 0.25 per call, a final text answer pays 0.5 if right."""

    async def reset(self, metadata: dict[str, Any], session_id: str | None = None) -> tuple[str | None, dict]:
        self.session_state[session_id] = {"lamps": metadata["lamps"], "calls": 0}
        return None, {"episode": "lamps"}

    async def step(
        self, action: dict[str, Any], metadata: dict[str, Any], session_id: str | None = None
    ) -> StepResult:
        state = self.session_state.get(session_id)
        if state is None:
            raise HTTPError(409, "no episode: call /reset first")
        calls = function_calls(action.get("output") or [])
        if calls:
            state["calls"] += len(calls)
            outputs = [tool_output(call, {"lamps": state["lamps"]}) for call in calls]
            return None, 0.25 * len(calls), False, False, {"tool_outputs": outputs}
        right = extract_text(action).strip().endswith(str(state["lamps"]))
        return None, 0.5 if right else 0.0, True, False, {"calls": state["calls"], "right": right}


TOOLS = [{"type": "function", "name": "count_lamps", "parameters": {"type": "object", "properties": {}}}]


def test_tool_outputs_and_rewards_accumulate_in_order():
    env = LampServer({"name": "env"})
    model = ScriptedModel(
        {
            "name": "model",
            "scripts": [
                {
                    "turns": [
                        {"call_tool": "count_lamps", "arguments": {}},
                        {"call_tool": "count_lamps", "arguments": {}},
                        {"text": "There are {tool_output}: 3"},
                    ]
                }
            ],
        }
    )
    row = {**ROW, "responses_create_params": {**ROW["responses_create_params"], "tools": TOOLS}}
    with running_agent(env, model, agent_class=GymnasiumAgent, max_steps=10) as url, SyncClient() as http:
        status, body = http.post(url + "/run", row)
        assert len(env.sessions) == 0
    assert status == 200, body
    assert body["reward"] == 1.0 and (body["terminated"], body["truncated"]) == (True, False)
    assert body["info"] == {"calls": 2, "right": True} and (body["lamps"], body["id"]) == (3, 7)
    items = body["response"]["output"]
    assert [i["type"] for i in items] == [
        "function_call",
        "function_call_output",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert items[1]["call_id"] == items[0]["call_id"] and items[1]["output"] == '{"lamps":3}'
    # No reset observation: the prompt is the row's own input, as a list of items.
    assert body["responses_create_params"]["input"] == [
        {"role": "user", "content": "Count the lamps, then report.", "type": "message"}
    ]
    assert body["response"]["usage"]["output_tokens"] > 0


class FailsOnSecondCall(ScriptedModel):
    """A model whose second call in a rollout fails (a 500), as a crashed engine would."""

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        if count_model_turns(input_items(body)) >= 1:
            raise RuntimeError("engine crashed")
        return await super().responses(body)


def test_a_failed_model_call_closes_the_environment_and_fails_the_rollout():
    env = LampServer({"name": "env"})
    model = FailsOnSecondCall(
        {"name": "model", "scripts": [{"turns": [{"call_tool": "count_lamps", "arguments": {}}]}]}
    )
    row = {**ROW, "responses_create_params": {**ROW["responses_create_params"], "tools": TOOLS}}
    with running_agent(env, model, agent_class=GymnasiumAgent) as url, SyncClient() as http:
        status, body = http.post(url + "/run", row)
        assert len(env.sessions) == 0  # /close freed the episode the failure left open
    assert status == 502 and body["upstream"] == "model" and "engine crashed" in body["error"], body
    assert body["failure_class"] == "upstream_5xx"


class SlowOnSecondCall(ScriptedModel):
    """A model whose second call takes longer than the rollout may."""

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        if count_model_turns(input_items(body)) >= 1:
            await asyncio.sleep(3)
        return await super().responses(body)


def test_the_rollout_deadline_fails_the_rollout_as_a_timeout_and_closes():
    env = LampServer({"name": "env"})
    model = SlowOnSecondCall(
        {"name": "model", "scripts": [{"turns": [{"call_tool": "count_lamps", "arguments": {}}]}]}
    )
    row = {**ROW, "responses_create_params": {**ROW["responses_create_params"], "tools": TOOLS}}
    with (
        running_agent(env, model, agent_class=GymnasiumAgent, rollout_timeout_s=0.5) as url,
        SyncClient() as http,
    ):
        status, body = http.post(url + "/run", row)
        assert len(env.sessions) == 0
    assert status == 502 and body["failure_class"] == "timeout", body
    assert "deadline of 0.5s" in body["error"]


def test_a_step_refusal_fails_the_rollout_and_still_closes():
    class Refusing(LampServer):
        async def step(self, action, metadata, session_id=None):
            raise HTTPError(409, "the lamps are off")

    env = Refusing({"name": "env"})
    model = ScriptedModel({"name": "model", "scripts": [{"turns": [{"text": "3"}]}]})
    with running_agent(env, model, agent_class=GymnasiumAgent) as url, SyncClient() as http:
        status, body = http.post(url + "/run", ROW)
        assert len(env.sessions) == 0
    assert status == 502 and body["upstream"] == "env" and "the lamps are off" in body["error"]


def test_a_malformed_row_is_a_422_before_any_reset():
    env = LampServer({"name": "env"})
    model = ScriptedModel({"name": "model"})
    with running_agent(env, model, agent_class=GymnasiumAgent) as url, SyncClient() as http:
        status, body = http.post(url + "/run", {"lamps": 3})
        assert status == 422 and "responses_create_params" in body["error"]
        assert len(env.sessions) == 0


def test_config_accepts_nemo_gym_env_server_name():
    ref = {"type": "resources_servers", "name": "blackjack"}
    model = {"type": "responses_api_models", "name": "policy_model"}
    config = GymnasiumAgentConfig.model_validate({"env_server": ref, "model_server": model})
    assert config.resources_server.name == "blackjack" and config.max_steps == 10
    with pytest.raises(ValidationError, match="resources_server"):
        GymnasiumAgentConfig.model_validate({"model_server": model})
    with pytest.raises(ValidationError, match="max_steps"):
        GymnasiumAgentConfig.model_validate({"env_server": ref, "model_server": model, "max_steps": 0})


def test_verify_route_of_a_gymnasium_server_says_to_use_the_agent():
    from nemo_gym.testing import running_server

    with running_server(LampServer({"name": "lamps"})) as base, SyncClient() as http:
        status, body = http.post(base + "/verify", {**ROW, "response": {"output": []}})
    assert status == 400 and "/step" in body["error"] and body["server"] == "lamps"


def test_a_malformed_step_answer_is_a_classified_failure_not_a_reward():
    class Garbled(LampServer):
        async def _step_endpoint(self, body):
            return {"reward": "lots", "terminated": True}

    env = Garbled({"name": "env"})
    model = ScriptedModel({"name": "model", "scripts": [{"turns": [{"text": "3"}]}]})
    with running_agent(env, model, agent_class=GymnasiumAgent) as url, SyncClient() as http:
        status, body = http.post(url + "/run", ROW)
        assert len(env.sessions) == 0
    assert status == 502 and body["failure_class"] == "bad_upstream_body", body
    assert body["error"].startswith("env/step: answered a malformed body") and "reward" in body["error"]
