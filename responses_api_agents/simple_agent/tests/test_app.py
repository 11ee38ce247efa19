"""simple_agent against real in-process servers: the loop, tool errors, max_steps, usage, token IDs."""

from typing import Any

import pytest
from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.base_responses_api_model import SimpleResponsesAPIModel
from nemo_gym.response_items import (
    build_response,
    count_model_turns,
    function_call_item,
    input_items,
    message_item,
    usage_dict,
)
from nemo_gym.testing import SyncClient, running_agent
from responses_api_agents.simple_agent.app import SimpleAgent


class EchoArgs(BaseModel):
    text: str


class Env(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    async def seed_session(self, body):
        self.session["seen"] = []
        return {}

    @tool
    async def echo(self, body: EchoArgs) -> dict:
        self.session["seen"].append(body.text)
        return {"echo": body.text}

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=float(len(self.session.get("seen", []))))


class PlannedModel(SimpleResponsesAPIModel):
    """Plays a fixed plan of outputs keyed by the number of model turns so far."""

    plan: list[list[dict[str, Any]]] = []

    async def responses(self, body: dict) -> dict:
        turn = count_model_turns(input_items(body))
        output = self.plan[min(turn, len(self.plan) - 1)]
        self.last_input = input_items(body)
        return build_response([dict(i) for i in output], body, model="planned", usage=usage_dict(10, 2))


ECHO_TOOL = {
    "type": "function",
    "name": "echo",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
}


def run_agent(plan: list[list[dict]], **agent_config: Any) -> tuple[dict, PlannedModel]:
    model = PlannedModel({"name": "model"})
    model.plan = plan
    with (
        running_agent(Env({"name": "env"}), model, **agent_config, agent_class=SimpleAgent) as agent_url,
        SyncClient() as http,
    ):
        status, body = http.post(
            agent_url + "/run",
            {"responses_create_params": {"input": "go", "tools": [ECHO_TOOL]}, "task_id": 7},
        )
    assert status == 200, body
    return body, model


def test_loop_runs_tools_in_order_and_verifies():
    call_a = function_call_item("echo", '{"text": "a"}')
    call_b = function_call_item("echo", '{"text": "b"}')
    call_a["prompt_token_ids"], call_a["generation_token_ids"], call_a["generation_log_probs"] = (
        [1, 2],
        [3],
        [-0.5],
    )
    result, model = run_agent([[call_a, call_b], [message_item("done")]])
    # The base answer holds the fields it declares (NeMo Gym's): the row's task_id is left out.
    assert result["reward"] == 2.0 and "task_id" not in result
    kinds = [i["type"] for i in result["response"]["output"]]
    assert kinds == [
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "message",
    ]
    assert (
        result["response"]["usage"]["input_tokens"] == 20
        and result["response"]["usage"]["output_tokens"] == 4
    )
    # Token-ID fields went back to the model unchanged on the next turn.
    sent_back = next(
        i for i in model.last_input if i.get("call_id") == call_a["call_id"] and i["type"] == "function_call"
    )
    assert sent_back["prompt_token_ids"] == [1, 2] and sent_back["generation_log_probs"] == [-0.5]


def test_skip_verification_keeps_the_response_with_the_configured_reward_and_never_verifies():
    call_a = function_call_item("echo", '{"text": "a"}')
    result, _ = run_agent(
        [[call_a], [message_item("done")]], skip_verification=True, skip_verification_reward=0.25
    )
    # Env.verify would have given 1.0 (one echo): the configured reward shows verify never ran.
    assert result["reward"] == 0.25 and result["verification_skipped"] is True and result["task_id"] == 7
    assert [i["type"] for i in result["response"]["output"]][-1] == "message"


def test_tool_errors_go_back_to_the_model_as_text():
    bad_json = function_call_item("echo", "{not json")
    bad_args = function_call_item("echo", '{"txt": 1}')
    missing = function_call_item("no_such_tool", "{}")
    result, _ = run_agent([[bad_json, bad_args, missing], [message_item("ok")]])
    outputs = [i["output"] for i in result["response"]["output"] if i["type"] == "function_call_output"]
    assert "not valid JSON" in outputs[0]
    assert "HTTP 422" in outputs[1] and "text" in outputs[1]
    assert "no tool named 'no_such_tool'" in outputs[2]
    assert result["reward"] == 0.0


def test_max_steps_is_unset_by_default_as_in_nemo_gym():
    """NeMo Gym's deepagents agent subclasses this config and rejects any set max_steps."""
    from responses_api_agents.simple_agent.app import SimpleAgentConfig

    assert SimpleAgentConfig.model_fields["max_steps"].default is None


@pytest.mark.parametrize("max_steps", [1, 3])
def test_max_steps_bounds_a_model_that_never_stops(max_steps: int):
    result, _ = run_agent([[function_call_item("echo", '{"text": "x"}')]], max_steps=max_steps)
    assert result["reward"] == float(max_steps)


def test_reasoning_only_turn_ends_the_loop():
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]}
    result, _ = run_agent([[reasoning]])
    assert [i["type"] for i in result["response"]["output"]] == ["reasoning"]


def test_execute_tool_calls_false_stops_after_the_first_call():
    result, _ = run_agent(
        [[function_call_item("echo", '{"text": "x"}')], [message_item("never")]], execute_tool_calls=False
    )
    assert [i["type"] for i in result["response"]["output"]] == ["function_call"]
    assert result["reward"] == 0.0


def test_verifier_failure_class_is_relayed():
    class JudgeDown(Env):
        async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
            from nemo_gym.serving.server import HTTPError

            raise HTTPError(502, "judge unreachable", failure_class="judge_failed")

    model = PlannedModel({"name": "model"})
    model.plan = [[message_item("hi")]]
    with (
        running_agent(JudgeDown({"name": "env"}), model, agent_class=SimpleAgent) as agent_url,
        SyncClient() as http,
    ):
        status, body = http.post(agent_url + "/run", {"responses_create_params": {"input": "go"}})
    assert status == 502
    assert (
        body["failure_class"] == "judge_failed"
        and body["upstream"] == "env"
        and "judge unreachable" in body["error"]
    )
