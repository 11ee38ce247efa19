"""scripted_model: scripts, turns, templates, chat completions, and clear errors."""

import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.launch.config import project_root
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
        assert status == 422 and "offers no tools" in body["error"]["message"]
        # OpenAI's shape: no top-level server key, code a string or null.
        assert set(body) == {"error"} and body["error"]["code"] is None


def test_a_request_without_input_names_the_missing_input(url: str):
    with SyncClient() as client:
        status, body = client.post(url + "/v1/responses", {"tools": TOOLS})
    assert status == 400 and "input is missing" in body["error"]["message"]


def test_a_field_of_a_json_tool_output_fills_a_template():
    scripts = [
        {
            "match": "capital",
            "turns": [
                {"call_tool": "first"},
                {
                    "text": "The capital is {tool_output[capital]} ({tool_output[facts][0]}); raw {tool_output}"
                },
            ],
        }
    ]
    follow = [
        {"role": "user", "content": "capital of Peru?"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": '{"capital": "Lima", "facts": [3]}'},
    ]
    with running_server(ScriptedModel({"name": "m", "scripts": scripts})) as base, SyncClient() as client:
        status, body = client.post(base + "/v1/responses", {"input": follow, "tools": TOOLS})
        assert status == 200, body
        assert body["output"][0]["content"][0]["text"] == (
            'The capital is Lima (3); raw {"capital": "Lima", "facts": [3]}'
        )
        # A field the output lacks is a 422 naming it, never a 500.
        follow[-1]["output"] = '{"city": "Lima"}'
        status, body = client.post(base + "/v1/responses", {"input": follow, "tools": TOOLS})
        assert status == 422 and "has no field 'capital'" in body["error"]["message"], body


@pytest.mark.parametrize(
    "template, problem",
    [
        ("{tool_output.capital}", "{tool_output.capital} is not supported"),
        ("{answer}", "{answer} is not supported"),
        ("{match[first]}", "{match[first]} is not supported"),
        ("Total: {", "not a valid template"),
    ],
)
def test_scripts_are_checked_when_the_server_starts(template: str, problem: str):
    scripts = [{"match": "capital", "turns": [{"call_tool": "first"}, {"text": template}]}]
    with pytest.raises(ValueError) as raised:
        ScriptedModel({"name": "m", "scripts": scripts})
    message = str(raised.value)
    assert "scripts[0] (match 'capital'), turns[1].text" in message and repr(template) in message
    assert problem in message and "{tool_output[FIELD]}" in message


def test_a_bad_template_stops_ng_run_with_one_config_line(tmp_path: Path):
    config = tmp_path / "bad.yaml"
    config.write_text(
        "policy_model:\n  responses_api_models:\n    scripted_model:\n      entrypoint: app.py\n"
        "      scripts:\n        - match: capital\n          turns:\n            - call_tool: first\n"
        "            - text: 'The capital is {tool_output.capital}'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", "from nemo_gym.cli import ng_run; ng_run()", f"+config_paths=[{config}]"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project_root(),
    )
    assert done.returncode != 0 and "Traceback" not in done.stdout + done.stderr, done.stderr
    assert "config error: policy_model: scripts[0] (match 'capital'), turns[1].text" in done.stderr
    assert "exited with code 2" in done.stderr


def test_responses_carry_the_model_name_the_model_list_gives(url: str):
    with SyncClient() as client:
        _, listed = client.get(url + "/v1/models")
        _, answer = client.post(
            url + "/v1/responses", {"input": "hi", "tools": TOOLS, "model": "policy_model"}
        )
    assert [m["id"] for m in listed["data"]] == [answer["model"]] == ["scripted_model"]


def test_bad_script_config_is_rejected():
    with pytest.raises(ValueError, match="turns"):
        ScriptedModel({"scripts": [{"match": "x"}]})


def test_a_json_schema_request_gets_an_instance_of_the_schema():
    """Structured output: the answer is a small value valid against the schema the request names
    (Responses text.format or Chat Completions response_format), not the script's text."""
    import json

    schema = {
        "type": "object",
        "$defs": {"Verdict": {"type": "string", "enum": ["uncertain", "actor_a"]}},
        "properties": {
            "selected_answer": {"anyOf": [{"$ref": "#/$defs/Verdict"}, {"type": "null"}]},
            "score": {"type": "integer", "minimum": 1},
            "reasons": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "note": {"type": "string"},
        },
        "required": ["selected_answer", "score", "reasons"],
    }
    expected = {"selected_answer": "uncertain", "score": 1, "reasons": [""]}
    model = ScriptedModel({"name": "judge", "scripts": [{"turns": [{"text": "Yes"}]}]})
    with running_server(model) as base, SyncClient() as client:
        _, plain = client.post(base + "/v1/responses", {"input": "judge this"})
        assert plain["output"][0]["content"][0]["text"] == "Yes"
        _, body = client.post(
            base + "/v1/responses",
            {
                "input": "judge this",
                "text": {"format": {"type": "json_schema", "name": "v", "schema": schema}},
            },
        )
        assert json.loads(body["output"][0]["content"][0]["text"]) == expected
        _, chat = client.post(
            base + "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "judge this"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}},
            },
        )
        assert json.loads(chat["choices"][0]["message"]["content"]) == expected
