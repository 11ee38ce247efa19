"""retail_service: per-rollout orders, the tools' rules, the goal check, and the example rows
end to end through simulated_user_agent with the scripted policy and scripted customer."""

from pathlib import Path

import pytest

from nemo_gym.testing import SyncClient, collect_examples, read_jsonl, running_server
from resources_servers.retail_service.app import RetailServiceServer

HERE = Path(__file__).resolve().parent.parent
ROWS = read_jsonl(HERE / "data" / "example.jsonl")
RETURN_ROW = ROWS[0]  # W1001 delivered → goal: returned; W1002 pending must stay as is


@pytest.fixture(scope="module")
def server():
    return RetailServiceServer({"name": "retail_service"})


@pytest.fixture(scope="module")
def url(server: RetailServiceServer):
    with running_server(server) as base:
        yield base


def test_reaching_the_goal_scores_one_and_frees_the_session(url: str, server: RetailServiceServer):
    before = len(server.sessions)
    with SyncClient() as rollout:
        assert rollout.post(url + "/seed_session", RETURN_ROW) == (200, {})
        status, order = rollout.post(url + "/get_order", {"order_id": "W1001"})
        assert status == 200 and order["status"] == "delivered" and order["items"][0]["name"] == "headphones"
        status, order = rollout.post(url + "/return_order", {"order_id": "W1001"})
        assert status == 200 and order["status"] == "returned"
        status, body = rollout.post(url + "/verify", {**RETURN_ROW, "response": {"output": []}})
    assert status == 200 and body["reward"] == 1.0 and body["mismatches"] == []
    assert body["final_orders"]["W1001"]["status"] == "returned"
    assert len(server.sessions) == before


def test_a_side_effect_on_another_order_scores_zero(url: str):
    with SyncClient() as rollout:
        rollout.post(url + "/seed_session", RETURN_ROW)
        rollout.post(url + "/return_order", {"order_id": "W1001"})
        rollout.post(url + "/cancel_order", {"order_id": "W1002", "reason": "oops"})
        _, body = rollout.post(url + "/verify", {**RETURN_ROW, "response": {}})
    assert body["reward"] == 0.0
    assert body["mismatches"] == ["W1002.status: want 'pending', got 'cancelled'"]


def test_tool_rules_and_bad_input_name_the_field_or_order(url: str, server: RetailServiceServer):
    with SyncClient() as rollout:
        rollout.post(url + "/seed_session", RETURN_ROW)
        status, body = rollout.post(url + "/cancel_order", {"order_id": "W1001"})
        assert status == 422 and "only a pending order" in body["error"]
        status, body = rollout.post(url + "/return_order", {"order_id": "W1002"})
        assert status == 422 and "only a delivered order" in body["error"]
        status, body = rollout.post(url + "/get_order", {"order_id": "W9"})
        assert status == 422 and "W9" in body["error"] and "W1001, W1002" in body["error"]
        status, body = rollout.post(url + "/change_address", {"order_id": "W1002"})
        assert status == 422 and body["detail"][0]["field"] == "address"
        status, body = rollout.post(
            url + "/verify", {**RETURN_ROW, "goal_orders": {"W7": {}}, "response": {}}
        )
        assert status == 422 and "W7" in str(body)
    with SyncClient() as rollout:
        status, body = rollout.post(url + "/seed_session", {**RETURN_ROW, "orders": {}})
        assert status == 422 and body["detail"][0]["field"] == "orders"
    before = len(server.sessions)
    with SyncClient() as stray:  # never seeded: refused, nothing created
        status, body = stray.post(url + "/get_order", {"order_id": "W1001"})
    assert status == 409 and "seed_session" in body["error"]
    assert len(server.sessions) == before


def test_rollouts_never_share_orders(url: str):
    with SyncClient() as a, SyncClient() as b:
        a.post(url + "/seed_session", RETURN_ROW)
        b.post(url + "/seed_session", RETURN_ROW)
        a.post(url + "/return_order", {"order_id": "W1001"})
        assert b.post(url + "/get_order", {"order_id": "W1001"})[1]["status"] == "delivered"
        _, verdict_b = b.post(url + "/verify", {**RETURN_ROW, "response": {}})
        _, verdict_a = a.post(url + "/verify", {**RETURN_ROW, "response": {}})
    assert (verdict_a["reward"], verdict_b["reward"]) == (1.0, 0.0)


def test_unseeded_verify_scores_zero(url: str):
    with SyncClient() as rollout:
        status, body = rollout.post(url + "/verify", {**RETURN_ROW, "response": {}})
    assert status == 200 and body["reward"] == 0.0 and body["session_found"] is False


@pytest.mark.slow
def test_example_rows_end_to_end_with_a_simulated_customer(tmp_path: Path):
    summary, rows = collect_examples(HERE, tmp_path / "rollouts.jsonl", agent="simulated_user_agent")
    by_task = {row["_ng_task_index"]: row for row in rows}
    assert [by_task[i]["reward"] for i in range(5)] == [1.0, 1.0, 1.0, 0.0, 0.0]
    for row in rows:
        assert row["ended_by"] == "user_stop"
        output = row["response"]["output"]
        roles = [item.get("role") for item in output if item.get("type") == "message"]
        # The customer opens and closes; the assistant answers each customer message in between.
        assert roles[0] == "user" and roles[-1] == "user" and "###STOP###" in output[-1]["content"]
        assert roles.count("user") == row["num_user_turns"] == roles.count("assistant") + 1
    first = by_task[0]["response"]["output"]
    assert [item["name"] for item in first if item.get("type") == "function_call"] == [
        "get_order",
        "return_order",
    ]
