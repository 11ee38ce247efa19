"""example_session_state_mgmt: per-rollout counters, isolation, freeing, TTL, NeMo Gym replay, end to end."""

import json
import time
from pathlib import Path

import pytest

from nemo_gym.response_items import message_item
from nemo_gym.testing import (
    SyncClient,
    collect_examples,
    compat_dir,
    read_jsonl,
    running_agent,
    running_server,
)
from resources_servers.example_session_state_mgmt.app import ExampleSessionStateMgmtServer
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.scripted_model.app import ScriptedModel

HERE = Path(__file__).resolve().parent.parent
COMPAT = compat_dir("example_session_state_mgmt")
ROWS = read_jsonl(HERE / "data" / "example.jsonl")
ROW = ROWS[0]  # starts at 10, adds 5 and 7 → 22


@pytest.fixture(scope="module")
def server():
    return ExampleSessionStateMgmtServer({"name": "example_session_state_mgmt"})


@pytest.fixture(scope="module")
def url(server: ExampleSessionStateMgmtServer):
    with running_server(server) as base:
        yield base


def test_correct_trajectory_scores_one_and_frees_the_session(url: str, server: ExampleSessionStateMgmtServer):
    before = len(server.sessions)
    with SyncClient() as rollout:
        assert rollout.post(url + "/seed_session", ROW) == (200, {})
        assert len(server.sessions) == before + 1
        assert rollout.post(url + "/increment_counter", {"count": 5}) == (200, {"success": True})
        assert rollout.post(url + "/increment_counter", {"count": 7}) == (200, {"success": True})
        assert rollout.post(url + "/get_counter_value", {}) == (200, {"count": 22})
        status, body = rollout.post(
            url + "/verify", {**ROW, "response": {"output": [message_item("It is 22.")]}}
        )
    assert status == 200 and body["reward"] == 1.0
    assert (
        body["final_count"],
        body["num_increments"],
        body["session_found"],
        body["answer_mentions_count"],
    ) == (
        22,
        2,
        True,
        True,
    )
    assert len(server.sessions) == before


def test_wrong_count_scores_zero(url: str):
    with SyncClient() as rollout:
        rollout.post(url + "/seed_session", ROW)
        rollout.post(url + "/increment_counter", {"count": 5})
        status, body = rollout.post(
            url + "/verify", {**ROW, "response": {"output": [message_item("It is 22.")]}}
        )
    assert status == 200 and body["reward"] == 0.0 and body["final_count"] == 15
    assert body["answer_mentions_count"] is False


def test_malformed_calls_get_errors_naming_the_field(url: str, server: ExampleSessionStateMgmtServer):
    with SyncClient() as rollout:
        status, body = rollout.post(url + "/seed_session", {**ROW, "initial_count": "ten"})
        assert status == 422 and body["detail"][0]["field"] == "initial_count"
        rollout.post(url + "/seed_session", ROW)
        for bad in ({"count": "5"}, {"amount": 5}, {"count": 1.5}):
            status, body = rollout.post(url + "/increment_counter", bad)
            assert status == 422 and body["detail"][0]["field"] == "count", bad
        status, body = rollout.post(url + "/get_counter_value", {"which": "mine"})
        assert status == 422 and "no arguments" in body["error"]
        status, body = rollout.post(url + "/verify", {"responses_create_params": {}, "response": {}})
        assert status == 422 and body["detail"][0]["field"] == "expected_count"
    # A tool call with no seeded session is refused and leaves nothing behind.
    before = len(server.sessions)
    with SyncClient() as stray:
        status, body = stray.post(url + "/increment_counter", {"count": 1})
    assert status == 409 and "seed_session" in body["error"]
    assert len(server.sessions) == before


@pytest.mark.parametrize("response", [{}, {"output": []}])
def test_empty_response_is_scored_on_the_state(url: str, response: dict):
    with SyncClient() as rollout:  # never seeded: nothing to score
        status, body = rollout.post(url + "/verify", {**ROW, "response": response})
    assert status == 200 and body["reward"] == 0.0 and body["session_found"] is False
    assert body["final_count"] is None and body["num_tool_calls"] == 0
    with SyncClient() as rollout:  # seeded, no tool calls: the counter is still at its start
        rollout.post(url + "/seed_session", ROW)
        status, body = rollout.post(url + "/verify", {**ROW, "response": response})
    assert body["reward"] == 0.0 and body["final_count"] == ROW["initial_count"]


def test_interleaved_rollouts_never_share_state(url: str, server: ExampleSessionStateMgmtServer):
    before = len(server.sessions)
    row_a = {**ROW, "initial_count": 3, "expected_count": 6}
    row_b = {**ROW, "initial_count": 100, "expected_count": 105}
    with SyncClient() as a, SyncClient() as b:
        a.post(url + "/seed_session", row_a)
        b.post(url + "/seed_session", row_b)
        assert len(server.sessions) == before + 2
        a.post(url + "/increment_counter", {"count": 1})
        b.post(url + "/increment_counter", {"count": 5})
        a.post(url + "/increment_counter", {"count": 2})
        assert a.post(url + "/get_counter_value", {}) == (200, {"count": 6})
        assert b.post(url + "/get_counter_value", {}) == (200, {"count": 105})
        _, verdict_a = a.post(url + "/verify", {**row_a, "response": {}})
        assert len(server.sessions) == before + 1
        # b's state survived a's verify.
        assert b.post(url + "/get_counter_value", {}) == (200, {"count": 105})
        _, verdict_b = b.post(url + "/verify", {**row_b, "response": {}})
    assert (verdict_a["reward"], verdict_a["final_count"]) == (1.0, 6)
    assert (verdict_b["reward"], verdict_b["final_count"]) == (1.0, 105)
    assert len(server.sessions) == before


def test_sessions_expire_after_the_ttl():
    server = ExampleSessionStateMgmtServer({"name": "short_lived", "session_ttl_s": 0.2})
    with running_server(server) as url, SyncClient() as old, SyncClient() as fresh:
        old.post(url + "/seed_session", ROW)
        assert len(server.sessions) == 1
        time.sleep(0.3)
        fresh.post(url + "/seed_session", ROW)  # any request sweeps expired sessions
        assert len(server.sessions) == 1
        status, body = old.post(url + "/increment_counter", {"count": 5})
        assert status == 409 and "expire" in body["error"]
        _, verdict = old.post(url + "/verify", {**ROW, "response": {}})
        assert verdict["session_found"] is False and verdict["reward"] == 0.0


def test_bad_tool_arguments_reach_the_model_as_text_through_simple_agent():
    scripts = [
        {
            "turns": [
                {"call_tool": "increment_counter", "arguments": {"count": "5"}},
                {"call_tool": "increment_counter", "arguments": {"count": 12}},
                {"text": "Done."},
            ]
        }
    ]
    env = ExampleSessionStateMgmtServer({"name": "env"})
    model = ScriptedModel({"name": "model", "scripts": scripts})
    with running_agent(env, model, agent_class=SimpleAgent) as agent_url:
        with SyncClient() as http:
            status, body = http.post(agent_url + "/run", ROW)
        assert len(env.sessions) == 0
    assert status == 200, body
    outputs = [i["output"] for i in body["response"]["output"] if i["type"] == "function_call_output"]
    assert "HTTP 422" in outputs[0] and "count" in outputs[0]
    assert outputs[1] == '{"success":true}'
    assert (body["reward"], body["final_count"]) == (1.0, 22)


@pytest.mark.skipif(not COMPAT.exists(), reason="compat corpus not present")
def test_nemo_gym_rollouts_replayed_call_by_call(url: str):
    """Seed a fresh session with the row, replay the recorded calls in order, verify the recorded response."""
    rows = {
        row["responses_create_params"]["input"][-1]["content"]: row
        for row in read_jsonl(COMPAT / "example.jsonl")
    }
    recorded_rollouts = read_jsonl(COMPAT / "example_rollouts.jsonl")
    assert len(recorded_rollouts) == 5
    for recorded in recorded_rollouts:
        # Recorded rollouts keep only responses_create_params of the row: join the task fields back.
        row = rows[recorded["responses_create_params"]["input"][-1]["content"]]
        items = recorded["response"]["output"]
        outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
        with SyncClient() as rollout:
            assert rollout.post(url + "/seed_session", row) == (200, {})
            for call in (i for i in items if i["type"] == "function_call"):
                status, answer = rollout.post(url + "/" + call["name"], json.loads(call["arguments"]))
                assert status == 200 and answer == json.loads(outputs[call["call_id"]]), call
            status, ours = rollout.post(url + "/verify", {**row, **recorded})
        assert status == 200 and ours["reward"] == recorded["reward"]
        assert ours["final_count"] == row["expected_count"]


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(HERE, tmp_path / "rollouts.jsonl", num_samples_in_parallel=5)
    assert (summary.succeeded, summary.failed) == (5, 0)
    results = {r["initial_count"]: r for r in rows}
    # Five rollouts ran concurrently on one server; each saw only its own counter.
    assert {start: r["final_count"] for start, r in results.items()} == {
        10: 22,
        0: 20,
        100: 101,
        6: 7,
        -2: -1,
    }
    assert sorted(r["reward"] for r in results.values()) == [0.0, 0.0, 0.0, 1.0, 1.0]


def test_nemo_gym_tool_semantics_with_unseeded_counter_starts_at_zero():
    # NeMo Gym's own test of this environment (its tests/test_app.py test_sanity), over HTTP:
    # sessions are kept apart by their cookies and an unseeded session's counter starts at 0.
    server = ExampleSessionStateMgmtServer({"name": "counter", "unseeded_counter_starts_at_zero": True})
    with running_server(server) as base, SyncClient() as first, SyncClient() as second:
        assert first.post(base + "/get_counter_value", {}) == (200, {"count": 0})
        assert first.post(base + "/increment_counter", {"count": 2}) == (200, {"success": True})
        assert first.post(base + "/get_counter_value", {}) == (200, {"count": 2})
        assert second.post(base + "/increment_counter", {"count": 4}) == (200, {"success": True})
        assert second.post(base + "/get_counter_value", {}) == (200, {"count": 4})
        assert second.post(base + "/increment_counter", {"count": 3}) == (200, {"success": True})
        assert second.post(base + "/get_counter_value", {}) == (200, {"count": 7})
        assert first.post(base + "/get_counter_value", {}) == (200, {"count": 2})
    # Our default refuses a counter nobody seeded (the row's initial_count would be lost).
    with running_server(ExampleSessionStateMgmtServer({"name": "counter"})) as base, SyncClient() as client:
        status, body = client.post(base + "/get_counter_value", {})
        assert status == 409 and "/seed_session" in body["error"]
