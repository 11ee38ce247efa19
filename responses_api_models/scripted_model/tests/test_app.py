"""scripted_model: scripts, turns, templates, chat completions, and clear errors."""

import pytest

from nemo_gym.testing import SyncClient, running_server
from responses_api_models.scripted_model.app import ScriptedModel

TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}},
    }
]


@pytest.fixture(scope="module")
def url():
    scripts = [
        {
            "match": r"capital of (\w+)",
            "turns": [
                {"call_tool": "lookup", "arguments": {"q": "{match[1]}"}},
                {"text": "It is {tool_output}."},
            ],
        },
        {"turns": [{"call_tool": "first"}, {"text": "done: {last_user}"}]},
    ]
    with running_server(ScriptedModel({"name": "policy_model", "scripts": scripts})) as base:
        yield base


def test_script_turns_and_templates(url: str):
    with SyncClient() as client:
        status, first = client.post(
            url + "/v1/responses", {"input": "What is the capital of France?", "tools": TOOLS}
        )
        assert status == 200 and first["object"] == "response"
        call = first["output"][0]
        assert (
            call["type"] == "function_call"
            and call["name"] == "lookup"
            and call["arguments"] == '{"q":"France"}'
        )
        follow = [
            {"role": "user", "content": "What is the capital of France?"},
            call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "Paris"},
        ]
        status, second = client.post(url + "/v1/responses", {"input": follow, "tools": TOOLS})
        assert second["output"][0]["content"][0]["text"] == "It is Paris."


def test_auto_arguments_follow_the_schema(url: str):
    with SyncClient() as client:
        _, body = client.post(url + "/v1/responses", {"input": "hello", "tools": TOOLS})
        assert body["output"][0]["arguments"] == '{"q":"hello","n":0}'


def test_chat_completions_dialect(url: str):
    chat_tools = [{"type": "function", "function": {"name": "lookup", "parameters": TOOLS[0]["parameters"]}}]
    with SyncClient() as client:
        _, body = client.post(
            url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "capital of Peru"}], "tools": chat_tools},
        )
        assert body["object"] == "chat.completion" and body["choices"][0]["finish_reason"] == "tool_calls"
        assert body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"q":"Peru"}'


def test_no_tools_offered_is_a_clear_422(url: str):
    with SyncClient() as client:
        status, body = client.post(url + "/v1/responses", {"input": "hi"})
        assert (
            status == 422
            and "offers no tools" in body["error"]["message"]
            and body["server"] == "policy_model"
        )


def test_bad_script_config_is_rejected():
    with pytest.raises(ValueError, match="turns"):
        ScriptedModel({"scripts": [{"match": "x"}]})
