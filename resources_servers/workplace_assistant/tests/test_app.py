"""workplace_assistant: state-matching reward, argument errors, isolation, NeMo Gym replay, end to end."""

import json
import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.response_items import function_call_item, message_item
from nemo_gym.testing import (
    SyncClient,
    collect_examples,
    compat_dir,
    read_jsonl,
    running_agent,
    running_server,
)
from resources_servers.workplace_assistant.app import WorkplaceAssistantServer
from resources_servers.workplace_assistant.tools import OPERATIONS, tool_definitions
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.scripted_model.app import ScriptedModel

HERE = Path(__file__).resolve().parent.parent
COMPAT = compat_dir("workplace_assistant")
ROWS = read_jsonl(HERE / "data" / "example.jsonl")
needs_compat = pytest.mark.skipif(not COMPAT.exists(), reason="NeMo Gym compat corpus not present")


def gold_response(row: dict[str, Any]) -> dict[str, Any]:
    """A response whose function calls are the row's gold calls, then a final answer."""
    calls = [function_call_item(g["name"], g["arguments"]) for g in row["ground_truth"]]
    return {"output": [*calls, message_item("Done.")]}


def play(client: SyncClient, url: str, row: dict[str, Any], calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """Seed a session with ``row``, make ``calls`` (all must succeed), verify; the verify answer."""
    assert client.post(url + "/seed_session", row) == (200, {})
    for name, arguments in calls:
        status, body = client.post(f"{url}/{name}", arguments)
        assert status == 200, (name, body)
    response = {"output": [function_call_item(n, json.dumps(a)) for n, a in calls] + [message_item("Done.")]}
    status, verdict = client.post(url + "/verify", {**row, "response": response})
    assert status == 200, verdict
    return verdict


def gold_calls(row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(g["name"], json.loads(g["arguments"])) for g in row["ground_truth"]]


@pytest.fixture(scope="module")
def server() -> WorkplaceAssistantServer:
    return WorkplaceAssistantServer({"name": "workplace_assistant"})


@pytest.fixture(scope="module")
def url(server: WorkplaceAssistantServer):
    with running_server(server) as base:
        yield base


def test_every_tool_is_served_with_its_registered_arguments(server: WorkplaceAssistantServer):
    served = server.tools()
    assert set(served) == set(OPERATIONS) and len(served) == 27
    for name, handler in served.items():
        assert typing.get_type_hints(handler)["body"] is OPERATIONS[name].args, name
    # The rows offer exactly these tools.
    assert all(row["responses_create_params"]["tools"] == tool_definitions() for row in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r["category"] + str(r["id"]) for r in ROWS])
def test_gold_trajectory_scores_one(url: str, row: dict[str, Any]):
    with SyncClient() as client:
        verdict = play(client, url, row, gold_calls(row))
    assert verdict["reward"] == 1.0 and verdict["state_matches"] is True
    assert verdict["state_diff"] == [] and verdict["gold_call_errors"] == []
    assert verdict["state_source"] == "session" and verdict["num_function_calls"] == len(row["ground_truth"])
    assert verdict["ground_truth"] == row["ground_truth"] and verdict["category"] == row["category"]


def test_a_different_path_to_the_same_state_also_scores_one(url: str):
    """Reward is on state, not calls: looking things up and taking a detour is fine."""
    row = ROWS[4]  # add Morgan Lee as a lead (training) for raj.patel
    calls = [
        ("company_directory_find_email_address", {"name": "Raj"}),
        ("customer_relationship_manager_add_customer", {"customer_name": "Morgan Lee", "assigned_to_email": "raj.patel@atlas.com", "status": "Lead"}),
        ("customer_relationship_manager_update_customer", {"customer_id": "00000200", "field": "product_interest", "new_value": "training"}),
    ]  # fmt: skip
    with SyncClient() as client:
        verdict = play(client, url, row, calls)
    assert verdict["reward"] == 1.0, verdict["state_diff"]


def test_wrong_trajectories_score_zero_with_a_diff(url: str):
    row = ROWS[2]  # reassign Priya's five qualified customers to Tomas
    partial = gold_calls(row)[:3]
    with SyncClient() as client:
        verdict = play(client, url, row, partial)
    assert verdict["reward"] == 0.0 and verdict["state_matches"] is False
    assert verdict["state_diff"] == [
        "customers 00000159: assigned_to_email is 'priya.nair@atlas.com', expected 'tomas.silva@atlas.com'",
        "customers 00000188: assigned_to_email is 'priya.nair@atlas.com', expected 'tomas.silva@atlas.com'",
    ]
    # Doing too much is as wrong as doing too little.
    extra = [*gold_calls(row), ("email_delete_email", {"email_id": "00000001"})]
    with SyncClient() as client:
        verdict = play(client, url, row, extra)
    assert verdict["reward"] == 0.0 and verdict["state_diff"] == ["emails 00000001: deleted, expected kept"]
    # A new record with a wrong field is reported as one missing and one unexpected record.
    row = ROWS[0]
    wrong_body = {**json.loads(row["ground_truth"][0]["arguments"]), "body": "The review moved."}
    with SyncClient() as client:
        verdict = play(client, url, row, [("email_send_email", wrong_body)])
    assert verdict["reward"] == 0.0
    assert [line.split(" {")[0] for line in verdict["state_diff"]] == [
        "emails: missing new record",
        "emails: unexpected new record",
    ]


def test_malformed_arguments_get_errors_naming_the_field_and_change_nothing(url: str):
    row = ROWS[1]  # delete event 00000207
    with SyncClient() as client:
        client.post(url + "/seed_session", row)
        cases = [
            ("calendar_delete_event", {}, "event_id"),
            ("calendar_delete_event", {"event_id": "00000207", "force": True}, "force"),
            ("calendar_update_event", {"event_id": "00000207", "field": "colour", "new_value": "red"}, "field"),
            ("calendar_create_event", {"event_name": "x", "participant_email": "jonas", "event_start": "2023-12-05 10:00:00", "duration": 30}, "participant_email"),
            ("calendar_create_event", {"event_name": "x", "participant_email": "jonas.berg@atlas.com", "event_start": "2023-12-05", "duration": 30}, "event_start"),
            ("email_search_emails", {"page_size": 1000}, "page_size"),
        ]  # fmt: skip
        for name, arguments, field in cases:
            status, body = client.post(f"{url}/{name}", arguments)
            assert status == 422, (name, arguments, body)
            assert body["detail"][0]["field"] == field and field in body["error"], body
        # Values checked against the data (not the schema) name the argument too.
        status, body = client.post(
            url + "/calendar_update_event", {"event_id": "00000207", "field": "duration", "new_value": "soon"}
        )
        assert status == 422 and body["error"].startswith("new_value:") and "minutes" in body["error"]
        status, body = client.post(
            url + "/customer_relationship_manager_update_customer",
            {"customer_id": "00000014", "field": "assigned_to_email", "new_value": "someone@else.com"},
        )
        assert status == 422 and "company directory" in body["error"]
        status, body = client.post(url + "/calendar_delete_event", {"event_id": "99999999"})
        assert status == 404 and "'99999999' not found" in body["error"]
        status, verdict = client.post(url + "/verify", {**row, "response": {}})
    # None of the failed calls touched the state: only the gold deletion is missing.
    assert verdict["reward"] == 0.0
    assert verdict["state_diff"] == ["calendar_events 00000207: still present, expected deleted"]


def test_bad_rows_and_stray_calls_are_refused(url: str, server: WorkplaceAssistantServer):
    with SyncClient() as client:
        status, body = client.post(url + "/verify", {"responses_create_params": {}, "response": {}})
        assert status == 422 and body["detail"][0]["field"] == "ground_truth"
        status, body = client.post(
            url + "/verify", {**ROWS[0], "response": {}, "ground_truth": [{"arguments": "{}"}]}
        )
        assert status == 422 and body["detail"][0]["field"] == "ground_truth.0.name"
    before = len(server.sessions)
    with SyncClient() as stray:
        status, body = stray.post(url + "/email_delete_email", {"email_id": "00000001"})
    assert status == 409 and "seed_session" in body["error"]
    assert len(server.sessions) == before


def test_broken_gold_calls_are_reported(url: str):
    row = {
        **ROWS[1],
        "ground_truth": [{"name": "calendar_delete_event", "arguments": '{"event_id": "12345678"}'}],
    }
    with SyncClient() as client:
        verdict = play(client, url, row, [])
    # The gold call changed nothing, so an idle rollout matches it; the row is flagged though.
    assert verdict["reward"] == 1.0
    assert verdict["gold_call_errors"] == [
        "call 0 calendar_delete_event: HTTP 404: event '12345678' not found"
    ]


@pytest.mark.parametrize("response", [{}, {"output": []}, {"output": [message_item("I did it.")]}])
def test_empty_response_is_scored_on_the_state(url: str, response: dict[str, Any]):
    row = ROWS[3]
    with SyncClient() as client:  # seeded, no tool calls: nothing changed
        client.post(url + "/seed_session", row)
        status, verdict = client.post(url + "/verify", {**row, "response": response})
    assert status == 200 and verdict["reward"] == 0.0 and verdict["state_source"] == "session"
    assert verdict["state_diff"] == ["project_tasks 00000051: list_name is 'Backlog', expected 'In Review'"]
    with SyncClient() as client:  # never seeded: the (empty) response is replayed on fresh state
        status, verdict = client.post(url + "/verify", {**row, "response": response})
    assert status == 200 and verdict["reward"] == 0.0 and verdict["state_source"] == "response_replay"
    # A task whose answer is "change nothing" is solved by changing nothing.
    with SyncClient() as client:
        status, verdict = client.post(url + "/verify", {**row, "ground_truth": [], "response": response})
    assert verdict["reward"] == 1.0


def test_unseeded_verify_replays_the_responses_calls(url: str):
    """An offline re-score (no live session) replays the response's function calls on fresh state."""
    for row in ROWS:
        with SyncClient() as client:
            status, verdict = client.post(url + "/verify", {**row, "response": gold_response(row)})
        assert status == 200 and verdict["reward"] == 1.0 and verdict["state_source"] == "response_replay"
    bad = {"output": [function_call_item("calendar_delete_event", '{"event_id": 7')]}
    with SyncClient() as client:
        _, verdict = client.post(url + "/verify", {**ROWS[1], "response": bad})
    assert verdict["reward"] == 0.0 and "not valid JSON" in verdict["replay_call_errors"][0]


def test_sessions_are_isolated(url: str, server: WorkplaceAssistantServer):
    before = len(server.sessions)
    row = ROWS[1]
    with SyncClient() as a, SyncClient() as b:
        a.post(url + "/seed_session", row)
        b.post(url + "/seed_session", row)
        assert a.post(url + "/calendar_delete_event", {"event_id": "00000207"})[0] == 200
        # b still sees the event a deleted, and deleting it again in a is a 404.
        assert b.post(
            url + "/calendar_get_event_information_by_id", {"event_id": "00000207", "field": "event_name"}
        ) == (
            200,
            {"output": {"event_name": "Architecture sync"}},
        )
        assert a.post(url + "/calendar_delete_event", {"event_id": "00000207"})[0] == 404
        _, verdict_a = a.post(url + "/verify", {**row, "response": {}})
        _, verdict_b = b.post(url + "/verify", {**row, "response": {}})
    assert (verdict_a["reward"], verdict_b["reward"]) == (1.0, 0.0)
    assert len(server.sessions) == before

    def one(index: int) -> float:
        row = ROWS[index % len(ROWS)]
        with SyncClient() as client:
            return play(client, url, row, gold_calls(row))["reward"]

    # Many rollouts at once, each a different task: every one sees only its own changes.
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(one, range(10))) == [1.0] * 10
    assert len(server.sessions) == before


def test_bad_tool_arguments_reach_the_model_as_text_through_simple_agent():
    bad = {"customer_id": "00000014", "field": "shoe_size", "new_value": "42"}
    scripts = [
        {
            "turns": [
                {"call_tool": "customer_relationship_manager_update_customer", "arguments": bad},
                {"call_tool": "customer_relationship_manager_delete_customer", "arguments": {"customer_id": "00000014"}},
                {"text": "Done."},
            ]
        }
    ]  # fmt: skip
    row = {**ROWS[4], "ground_truth": [{"name": "customer_relationship_manager_delete_customer", "arguments": '{"customer_id": "00000014"}'}]}  # fmt: skip
    env = WorkplaceAssistantServer({"name": "env"})
    model = ScriptedModel({"name": "model", "scripts": scripts})
    with running_agent(env, model, agent_class=SimpleAgent) as agent_url:
        with SyncClient() as http:
            status, body = http.post(agent_url + "/run", row)
        assert len(env.sessions) == 0
    assert status == 200, body
    outputs = [i["output"] for i in body["response"]["output"] if i["type"] == "function_call_output"]
    assert outputs[0].startswith("Error:") and "HTTP 422" in outputs[0] and "field" in outputs[0]
    assert outputs[1] == '{"output":"Customer deleted successfully."}'
    assert body["reward"] == 1.0


@needs_compat
def test_nemo_gym_rows_run_unchanged(url: str):
    """NeMo Gym's example rows: same tools and arguments; their gold calls solve them on our data."""
    rows = read_jsonl(COMPAT / "example.jsonl")
    assert len(rows) == 5
    ours = {t["name"]: t["parameters"] for t in tool_definitions()}
    for tool in rows[0]["responses_create_params"]["tools"]:
        params = tool["parameters"]
        assert set(params["properties"]) == set(ours[tool["name"]]["properties"]), tool["name"]
        assert set(params["required"]) == set(ours[tool["name"]]["required"]), tool["name"]
    assert len(ours) == len(rows[0]["responses_create_params"]["tools"])
    for row in rows:
        with SyncClient() as client:
            verdict = play(client, url, row, gold_calls(row))
        assert verdict["reward"] == 1.0 and verdict["gold_call_errors"] == [], row["id"]


@needs_compat
def test_nemo_gym_prompts_find_their_gold_records(url: str):
    """The searches a careful model would make for each NeMo Gym prompt find exactly the gold ids."""
    searches = {
        0: ("email_search_emails", {"query": "carlos Task Update on Develop prototype for report generation"}, "emails", "email_id", 1),
        1: ("calendar_search_events", {"time_min": "2023-12-01", "time_max": "2023-12-01"}, "events", "event_id", -1),
        2: ("customer_relationship_manager_search_customers", {"assigned_to_email": "akira", "status": "Lead", "product_interest": "Software"}, "customers", "customer_id", None),
        3: ("customer_relationship_manager_search_customers", {"assigned_to_email": "lena", "status": "Won", "product_interest": "Services"}, "customers", "customer_id", None),
        4: ("customer_relationship_manager_search_customers", {"status": "Proposal", "product_interest": "Hardware", "last_contact_date_max": "2023-11-02"}, "customers", "customer_id", None),
    }  # fmt: skip
    for row in read_jsonl(COMPAT / "example.jsonl"):
        name, arguments, key, id_field, pick = searches[row["id"]]
        gold_ids = {json.loads(g["arguments"]).get(id_field) for g in row["ground_truth"]}
        with SyncClient() as client:
            client.post(url + "/seed_session", row)
            status, body = client.post(f"{url}/{name}", arguments)
            client.post(url + "/verify", {**row, "response": {}})
        found = [r[id_field] for r in body["output"][key]]
        # pick: 1 = the first (newest email), -1 = the last (latest event), None = all of them.
        chosen = set(found) if pick is None else {found[0] if pick == 1 else found[-1]}
        assert status == 200 and chosen == gold_ids, (row["id"], found)


# The recorded rollouts keep only the prompt, the response and the reward, not the row's
# ground_truth, so these gold calls are written here from each prompt (see README).
ROLLOUT_GOLD = {
    "Create a bar chart of total visits since November 30": [
        ("analytics_create_plot", {"time_min": "2023-11-30", "time_max": "2023-11-30", "value_to_plot": "total_visits", "plot_type": "bar"}),
    ],
    "We need to move all customers that haven't responded to a proposal for the consulting product in 3 weeks to lost. Can you update the CRM?": [],
    "Delete Casey Wilson from the crm": [
        ("customer_relationship_manager_delete_customer", {"customer_id": "00000014"}),
    ],
    "Add Dakota Thomas as a new lead in the crm and assign them to Nadia": [
        ("customer_relationship_manager_add_customer", {"customer_name": "Dakota Thomas", "assigned_to_email": "nadia.moreau@atlas.com", "status": "Lead"}),
    ],
    "Delete my last email from kofi": [("email_delete_email", {"email_id": "00000259"})],
}  # fmt: skip


@needs_compat
def test_nemo_gym_rollouts_replayed_call_by_call(url: str):
    """Seed, replay each recorded call in order, verify the recorded response: the recorded reward."""
    recorded_rollouts = read_jsonl(COMPAT / "example_rollouts.jsonl")
    assert len(recorded_rollouts) == 5
    same_output = 0
    for recorded in recorded_rollouts:
        prompt = recorded["responses_create_params"]["input"][-1]["content"]
        gold = [{"name": n, "arguments": json.dumps(a)} for n, a in ROLLOUT_GOLD[prompt]]
        row = {**recorded, "ground_truth": gold}
        items = recorded["response"]["output"]
        outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
        with SyncClient() as client:
            assert client.post(url + "/seed_session", row) == (200, {})
            for call in (i for i in items if i["type"] == "function_call"):
                status, answer = client.post(url + "/" + call["name"], json.loads(call["arguments"]))
                assert status == 200, (call, answer)
                theirs = json.loads(outputs[call["call_id"]])
                if answer == theirs:
                    same_output += 1
                else:  # record contents differ (our fixtures are our own); the records found agree
                    found = answer["output"]
                    theirs_found = theirs["output"]
                    key = "customers" if "customers" in found else "emails"
                    ids = [r.get("customer_id") or r.get("email_id") for r in found[key]]
                    assert ids == [r.get("customer_id") or r.get("email_id") for r in theirs_found[key]]
                    assert found["pagination"] == theirs_found["pagination"]
            status, ours = client.post(url + "/verify", row)
        assert status == 200 and ours["state_source"] == "session"
        assert ours["reward"] == recorded["reward"], (prompt, ours["state_diff"])
    assert same_output == 6  # of 8 recorded tool outputs, byte for byte


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(HERE, tmp_path / "rollouts.jsonl", num_samples_in_parallel=5)
    assert (summary.succeeded, summary.failed) == (5, 0)
    results = {r["id"]: r for r in rows}
    # The scripts solve rows 0 (send an email) and 4 (add a lead, "training" → "Training").
    assert {i: r["reward"] for i, r in results.items()} == {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0, 4: 1.0}
    assert results[4]["state_diff"] == [] and results[4]["num_function_calls"] == 1
    assert results[1]["state_diff"] == ["calendar_events 00000207: still present, expected deleted"]
