"""example_multi_step: tools, verify on right/wrong/malformed/empty answers, NeMo Gym replay, end to end."""

import json
from pathlib import Path

import pytest

from nemo_gym.response_items import function_call_item, function_call_output_item, message_item
from nemo_gym.testing import (
    SyncClient,
    collect_examples,
    compat_dir,
    post_verify,
    read_jsonl,
    replay_recorded,
    running_agent,
    running_server,
)
from resources_servers.example_multi_step.app import ExampleMultiStepServer
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.scripted_model.app import ScriptedModel

HERE = Path(__file__).resolve().parent.parent
COMPAT = compat_dir("example_multi_step")
ROWS = read_jsonl(HERE / "data" / "example.jsonl")
COLD = ROWS[0]  # expects Chilly, Frosty, Icy → [613, 647, 293]; the term itself is 'Cold' (386)


@pytest.fixture(scope="module")
def url():
    with running_server(ExampleMultiStepServer({"name": "example_multi_step"})) as base:
        yield base


def trajectory(*calls: tuple[str, dict], final: str = "done") -> list[dict]:
    """A response output: each call followed by its (unchecked) output, then a final message."""
    items: list[dict] = []
    for name, arguments in calls:
        call = function_call_item(name, json.dumps(arguments))
        items += [call, function_call_output_item(call["call_id"], "{}")]
    return items + [message_item(final)]


def lookups(*synonyms: str) -> list[tuple[str, dict]]:
    return [("get_synonym_value", {"synonym": s}) for s in synonyms]


def test_tools_answer_and_reject_bad_arguments(url: str):
    with SyncClient() as client:
        assert client.post(url + "/get_synonym_value", {"synonym": "Hot"}) == (200, {"synonym_value": 299})
        assert client.post(url + "/extract_synonym_values", {"synonym_values": [1, 2]}) == (
            200,
            {"success": True},
        )
        status, body = client.post(url + "/get_synonym_value", {"word": "Hot"})
        assert status == 422 and body["detail"][0]["field"] == "synonym"
        status, body = client.post(url + "/extract_synonym_values", {"synonym_values": [1, "two"]})
        assert status == 422 and body["detail"][0]["field"] == "synonym_values.1"


def test_correct_trajectory_scores_one(url: str):
    output = trajectory(
        *lookups("Chilly", "Frosty", "Icy"), ("extract_synonym_values", {"synonym_values": [613, 647, 293]})
    )
    body = post_verify(url, COLD, {"output": output})
    assert body["reward"] == 1.0 and body["accuracy"] is True and body["set_overlap"] == 1.0
    assert body["parsed_synonym_values"] == [613, 647, 293] and body["answer_source"] == "tool"
    assert body["looked_up_synonyms"] == ["Chilly", "Frosty", "Icy"]
    assert (
        body["order_instruction_following_failure"] is False and body["original_term_minefield_hit"] is False
    )
    assert body["expected_synonyms"] == COLD["expected_synonyms"] and body["id"] == COLD["id"]


def test_wrong_answers_and_their_diagnostics(url: str):
    wrong_order = post_verify(
        url, COLD, {"output": trajectory(("extract_synonym_values", {"synonym_values": [647, 613, 293]}))}
    )
    assert wrong_order["reward"] == 0.0 and wrong_order["set_overlap"] == 1.0
    assert wrong_order["order_instruction_following_failure"] is True
    minefield = post_verify(
        url, COLD, {"output": trajectory(("extract_synonym_values", {"synonym_values": [386, 613]}))}
    )
    assert minefield["reward"] == 0.0 and minefield["original_term_minefield_hit"] is True
    assert minefield["set_overlap"] == pytest.approx(1 / 3)
    assert minefield["order_instruction_following_failure"] is False
    # The last submission counts: a corrected answer scores.
    corrected = trajectory(
        ("extract_synonym_values", {"synonym_values": [386]}),
        ("extract_synonym_values", {"synonym_values": [613, 647, 293]}),
    )
    assert post_verify(url, COLD, {"output": corrected})["reward"] == 1.0


def test_malformed_submission_and_row(url: str):
    bad_json = function_call_item("extract_synonym_values", "{not json")
    body = post_verify(url, COLD, {"output": [bad_json]})
    assert body["reward"] == 0.0 and "not valid JSON" in body["submission_error"]
    strings = function_call_item("extract_synonym_values", '{"synonym_values": ["613"]}')
    body = post_verify(url, COLD, {"output": [strings]})
    assert body["reward"] == 0.0 and body["submission_error"] == "synonym_values must be a list of integers"
    row = {k: v for k, v in COLD.items() if k != "expected_synonym_values"}
    with SyncClient() as client:
        status, body = client.post(url + "/verify", {**row, "response": {"output": []}})
    assert status == 422 and body["detail"][0]["field"] == "expected_synonym_values"


@pytest.mark.parametrize("response", [{}, {"output": []}])
def test_empty_response_scores_zero(url: str, response: dict):
    body = post_verify(url, COLD, response)
    assert body["reward"] == 0.0 and body["parsed_synonym_values"] == [] and body["answer_source"] == "none"
    assert body["submission_error"] == "no extract_synonym_values call"


def test_text_answer_only_counts_when_configured():
    text_only = {"output": [message_item("The values are [613, 647, 293].")]}
    with running_server(ExampleMultiStepServer({"name": "ms", "accept_text_answer": True})) as lenient:
        body = post_verify(lenient, COLD, text_only)
    assert body["reward"] == 1.0 and body["answer_source"] == "text"
    with running_server(ExampleMultiStepServer({"name": "ms"})) as strict:
        assert post_verify(strict, COLD, text_only)["reward"] == 0.0


def test_bad_tool_arguments_reach_the_model_as_text_through_simple_agent():
    scripts = [
        {
            "turns": [
                {"call_tool": "get_synonym_value", "arguments": {"word": "Chilly"}},
                {"call_tool": "extract_synonym_values", "arguments": {"synonym_values": [613, 647, 293]}},
                {"text": "[613, 647, 293]"},
            ]
        }
    ]
    env, model = ExampleMultiStepServer({"name": "env"}), ScriptedModel({"name": "model", "scripts": scripts})
    with running_agent(env, model, agent_class=SimpleAgent) as agent_url, SyncClient() as http:
        status, body = http.post(agent_url + "/run", COLD)
    assert status == 200, body
    outputs = [i["output"] for i in body["response"]["output"] if i["type"] == "function_call_output"]
    assert "HTTP 422" in outputs[0] and "synonym" in outputs[0]
    assert body["reward"] == 1.0


@pytest.mark.skipif(not COMPAT.exists(), reason="compat corpus not present")
def test_nemo_gym_rollouts_replay_to_the_recorded_rewards(url: str):
    # Recorded rollouts keep only responses_create_params of the row: join the task fields back.
    replayed = replay_recorded(url, COMPAT, lambda recorded, row: {**row, **recorded})
    assert len(replayed) == 5
    for recorded, ours in replayed:
        for key in (
            "reward",
            "accuracy",
            "set_overlap",
            "parsed_synonym_values",
            "original_term_minefield_hit",
            "order_instruction_following_failure",
        ):
            assert ours[key] == recorded[key], key
    with SyncClient() as client:
        for row in read_jsonl(COMPAT / "example.jsonl"):
            assert client.post(url + "/get_synonym_value", {"synonym": row["expected_synonyms"][0]}) == (
                200,
                {"synonym_value": row["expected_synonym_values"][0]},
            )
        # The recorded tool outputs are what our tools answer for the same calls.
        for recorded, _ in replayed:
            items = recorded["response"]["output"]
            outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
            for call in (
                i for i in items if i["type"] == "function_call" and i["name"] == "get_synonym_value"
            ):
                _, answer = client.post(url + "/get_synonym_value", json.loads(call["arguments"]))
                assert json.loads(outputs[call["call_id"]]) == answer


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(HERE, tmp_path / "rollouts.jsonl")
    assert (summary.succeeded, summary.failed) == (5, 0)
    results = {r["id"]: r for r in rows}
    # Rows 0 and 3 ask about the cold: the script looks up and submits the right values.
    assert {i for i, r in results.items() if r["reward"] == 1.0} == {0, 3}
    assert results[1]["original_term_minefield_hit"] is True and results[1]["reward"] == 0.0
    assert results[0]["looked_up_synonyms"] == ["Chilly", "Frosty", "Icy"]
