"""xlam_fc: tool_call_match on NeMo Gym's xLAM rows: replay, right/wrong/malformed/empty calls, end to end."""

import json
from pathlib import Path

import pytest

from nemo_gym.response_items import function_call_item
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
from resources_servers.xlam_fc.app import XlamFcServer
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.scripted_model.app import ScriptedModel

HERE = Path(__file__).resolve().parent.parent
COMPAT = compat_dir("xlam_fc")
ROWS = read_jsonl(HERE / "data" / "example.jsonl")
TIMES, DEFINE, TRIVIA, REPOS, PRIME = ROWS


@pytest.fixture(scope="module")
def url():
    with running_server(XlamFcServer({"name": "xlam_fc"})) as base:
        yield base


def verify(url: str, row: dict, *pairs: tuple[str, dict | str]) -> dict:
    output = [function_call_item(n, a if isinstance(a, str) else json.dumps(a)) for n, a in pairs]
    return post_verify(url, row, {"output": output})


def test_right_calls_score_one_and_extra_arguments_are_allowed(url: str):
    both = verify(
        url,
        TIMES,
        ("get_current_time", {"timezone": "Europe/Berlin"}),
        ("get_current_time", {"timezone": "Asia/Tokyo"}),
    )
    assert both["reward"] == 1.0 and (both["num_expected"], both["num_predicted"], both["num_correct"]) == (
        2,
        2,
        2,
    )
    # Spelling out a default the expected answer leaves implicit still matches (NeMo Gym's rule).
    spelled_out = verify(
        url, REPOS, ("trending_repositories", {"language": "rust", "since": "weekly", "limit": 10})
    )
    assert spelled_out["reward"] == 1.0
    extra = verify(url, DEFINE, ("define_word", {"word": "serendipity", "lang": "en"}))
    assert extra["reward"] == 1.0 and extra["reward_components"]["schema_valid"] == 0.0


def test_wrong_calls_score_zero(url: str):
    typed = verify(url, TRIVIA, ("trivia_questions", {"category": "history", "amount": "5"}))
    assert typed["reward"] == 0.0 and typed["num_correct"] == 0
    assert typed["mismatches"] == [
        "trivia_questions: argument 'amount': expected 5 (integer), got \"5\" (string)"
    ]
    other_tool = verify(url, PRIME, ("factorize", {"n": 7919}))
    assert other_tool["reward"] == 0.0 and other_tool["reward_components"]["name_correct"] == 0.0
    missing_arg = verify(url, PRIME, ("is_prime", {}))
    assert missing_arg["mismatches"] == ["is_prime: argument 'number' missing (expected 7919 (integer))"]


def test_malformed_and_empty(url: str):
    broken = verify(url, PRIME, ("is_prime", "number=7919"))
    assert broken["reward"] == 0.0 and broken["predicted_calls"] == [
        {"name": "is_prime", "arguments": "number=7919"}
    ]
    empty = verify(url, PRIME)
    assert empty["reward"] == 0.0 and empty["num_predicted"] == 0
    with SyncClient() as client:
        status, body = client.post(url + "/verify", {**PRIME, "response": {}})
        assert status == 200 and body["reward"] == 0.0
        no_field = {k: v for k, v in PRIME.items() if k != "expected_answers"}
        status, body = client.post(url + "/verify", {**no_field, "response": {}})
        assert status == 422 and "expected_answers: field required" in body["error"]
        client.post(url + "/seed_session", PRIME)
        status, body = client.post(url + "/is_prime", {"number": "7919"})
        assert status == 422 and "number: '7919' is not of type 'integer'" in body["error"]


def test_bad_tool_arguments_reach_the_model_as_text_through_simple_agent():
    # The template fills text, so the number goes out as the string "7919": the schema wants an integer.
    scripts = [{"match": r"\d+", "turns": [{"call_tool": "is_prime", "arguments": {"number": "{match[0]}"}}]}]
    env, model = XlamFcServer({"name": "env"}), ScriptedModel({"name": "model", "scripts": scripts})
    with running_agent(env, model, max_steps=1, agent_class=SimpleAgent) as agent_url, SyncClient() as http:
        status, body = http.post(agent_url + "/run", PRIME)
    assert status == 200, body
    tool_output = body["response"]["output"][1]["output"]
    assert "HTTP 422" in tool_output and "number" in tool_output
    assert body["reward"] == 0.0 and body["predicted_calls"] == [
        {"name": "is_prime", "arguments": {"number": "7919"}}
    ]


@pytest.mark.skipif(not COMPAT.exists(), reason="compat corpus not present")
def test_nemo_gym_rollouts_replay_to_the_recorded_rewards(url: str):
    # Recorded rollouts keep only responses_create_params of the row: join expected_answers back.
    replayed = replay_recorded(url, COMPAT, lambda recorded, row: {**row, **recorded})
    assert len(replayed) == 5
    for recorded, ours in replayed:
        for key in ("reward", "num_expected", "num_predicted", "num_correct", "predicted_calls"):
            assert ours[key] == recorded[key], (ours.get("id"), key)


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(HERE, tmp_path / "rollouts.jsonl")
    assert (summary.succeeded, summary.failed) == (5, 0)
    results = {r["id"]: r for r in rows}
    assert {i for i, r in results.items() if r["reward"] == 1.0} == {1}
    assert results[1]["predicted_calls"] == [{"name": "define_word", "arguments": {"word": "serendipity"}}]
    assert all(r["num_predicted"] == 1 for r in results.values())
