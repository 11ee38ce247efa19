"""blackjack: NeMo Gym's rules and rewards over /reset and /step, state freed, through gymnasium_agent."""

from pathlib import Path
from typing import Any

import pytest

from nemo_gym.response_items import message_item
from nemo_gym.testing import SyncClient, collect_examples, read_jsonl, running_agent, running_server
from resources_servers.blackjack.app import BlackjackServer, Hand, hand_value
from responses_api_agents.gymnasium_agent.app import GymnasiumAgent
from responses_api_models.scripted_model.app import ScriptedModel

HERE = Path(__file__).resolve().parent.parent
ROWS = read_jsonl(HERE / "data" / "example.jsonl")
BY_SEED = {row["seed"]: row for row in ROWS}  # 0, 4, 18, 12, 1


def answer(text: str) -> dict[str, Any]:
    return {"output": [message_item(text)]}


def act(client: SyncClient, url: str, row: dict[str, Any], text: str) -> dict[str, Any]:
    status, body = client.post(url + "/step", {**row, "response": answer(text)})
    assert status == 200, body
    return body


@pytest.fixture(scope="module")
def server() -> BlackjackServer:
    return BlackjackServer({"name": "blackjack"})


@pytest.fixture(scope="module")
def url(server: BlackjackServer):
    with running_server(server) as base:
        yield base


def test_hand_values_count_aces_as_eleven_or_one():
    assert hand_value(["A", "6"]) == 17
    assert hand_value(["A", "6", "9"]) == 16
    assert hand_value(["A", "A", "9"]) == 21
    assert hand_value(["K", "Q", "2"]) == 22
    assert hand_value(["10", "A"]) == 21
    # The same seed deals the same hand, and every later draw matches too.
    first, second = Hand.deal(7), Hand.deal(7)
    assert (first.player, first.dealer) == (second.player, second.dealer)
    assert [first.draw() for _ in range(5)] == [second.draw() for _ in range(5)]


def test_stand_on_nineteen_wins_plus_one_and_frees_the_hand(url: str, server: BlackjackServer):
    with SyncClient() as client:
        status, reset = client.post(url + "/reset", BY_SEED[0])
        assert status == 200
        assert reset == {
            "observation": "Your hand: [8, A] = 19\nDealer shows: 8\n"
            "Respond with <action>hit</action> or <action>stand</action>.",
            "info": {"supports_explicit_close": True},
        }
        step = act(client, url, BY_SEED[0], "I stand. <action> STAND </action>")
        assert step == {
            "observation": None,
            "reward": 1.0,
            "terminated": True,
            "truncated": False,
            "info": {
                "result": "win",
                "player": "[8, A]",
                "player_value": 19,
                "dealer": "[8, 2, 6, 10]",
                "dealer_value": 26,
            },
        }
        # The hand is over and its state is gone: another step is a 409, not a new hand.
        status, body = client.post(url + "/step", {**BY_SEED[0], "response": answer("<action>hit</action>")})
        assert status == 409 and "/reset" in body["error"]
    assert len(server.sessions) == 0


def test_hit_then_bust_is_minus_one_and_a_draw_is_zero(url: str):
    with SyncClient() as client:
        client.post(url + "/reset", BY_SEED[12])
        step = act(client, url, BY_SEED[12], "<action>hit</action>")
    assert (step["observation"], step["reward"], step["terminated"]) == (None, -1.0, True)
    assert step["info"] == {"result": "bust", "player": "[9, 6, Q]", "value": 25}
    with SyncClient() as client:
        client.post(url + "/reset", BY_SEED[18])
        hits = [act(client, url, BY_SEED[18], "<action>hit</action>") for _ in range(2)]
        final = act(client, url, BY_SEED[18], "<action>stand</action>")
    assert [h["observation"].splitlines()[0] for h in hits] == [
        "Your hand: [4, 3, 7] = 14",
        "Your hand: [4, 3, 7, 5] = 19",
    ]
    assert all(h["reward"] == 0.0 and not h["terminated"] for h in hits)
    assert (final["reward"], final["info"]["result"], final["info"]["dealer_value"]) == (0.0, "draw", 19)
    with SyncClient() as client:
        client.post(url + "/reset", BY_SEED[1])
        act(client, url, BY_SEED[1], "<action>hit</action>")
        final = act(client, url, BY_SEED[1], "<action>stand</action>")
    assert (final["reward"], final["info"]["result"]) == (-1.0, "loss")


def test_an_answer_without_a_tag_stands_as_in_nemo_gym(url: str):
    with SyncClient() as client:
        client.post(url + "/reset", BY_SEED[4])  # 11 against a 3: standing loses to the dealer's 20
        step = act(client, url, BY_SEED[4], "hit me!")
    assert step["terminated"] and step["info"]["player"] == "[5, 6]" and step["info"]["result"] == "loss"


def test_ask_again_option_answers_an_untagged_reply_with_an_observation():
    server = BlackjackServer({"name": "blackjack", "unparsed_action": "ask_again"})
    with running_server(server) as base, SyncClient() as client:
        client.post(base + "/reset", BY_SEED[4])
        step = act(client, base, BY_SEED[4], "hit me!")
        assert (step["reward"], step["terminated"], step["info"]) == (0.0, False, {"unparsed_action": True})
        assert step["observation"].startswith("I could not find <action>hit</action>")
        assert "Your hand: [5, 6] = 11" in step["observation"]
        step = act(client, base, BY_SEED[4], "<action>hit</action>")
        assert step["observation"].startswith("Your hand: [5, 6, 8] = 19")


def test_rollouts_are_isolated_and_close_frees_state(url: str, server: BlackjackServer):
    with SyncClient() as first, SyncClient() as second:
        first.post(url + "/reset", BY_SEED[18])
        second.post(url + "/reset", BY_SEED[18])
        act(first, url, BY_SEED[18], "<action>hit</action>")
        # The second hand has not moved: its first hit draws the same card the first one did.
        step = act(second, url, BY_SEED[18], "<action>hit</action>")
        assert step["observation"].startswith("Your hand: [4, 3, 7] = 14")
        assert first.post(url + "/close", {}) == (200, {"closed": True})
        assert first.post(url + "/close", {}) == (200, {"closed": False})
        assert second.post(url + "/close", {}) == (200, {"closed": True})
    assert len(server.sessions) == 0


def test_bad_rows_and_verify_get_clear_4xx(url: str):
    with SyncClient() as client:
        status, body = client.post(url + "/reset", {**BY_SEED[0], "seed": "seven"})
        assert status == 422 and body["detail"][0]["field"] == "seed", body
        status, body = client.post(url + "/step", {**BY_SEED[0]})
        assert status == 422 and body["detail"][0]["field"] == "response"
        status, body = client.post(url + "/verify", {**BY_SEED[0], "response": answer("x")})
        assert status == 400 and "gymnasium_agent" in body["error"]


def test_gymnasium_agent_plays_a_hand_and_returns_the_rollout():
    env = BlackjackServer({"name": "env"})
    model = ScriptedModel(
        {
            "name": "model",
            "scripts": [
                {"match": "= (1[7-9]|2[01])\\n", "turns": [{"text": "<action>stand</action>"}]},
                {"turns": [{"text": "<action>hit</action>"}]},
            ],
        }
    )
    with (
        running_agent(env, model, agent_class=GymnasiumAgent, max_steps=5) as agent_url,
        SyncClient() as http,
    ):
        status, body = http.post(agent_url + "/run", BY_SEED[4])
        assert status == 200, body
        assert len(env.sessions) == 0
        status, short = http.post(agent_url + "/run", {**BY_SEED[18], "id": 99})
        assert status == 200, short
    assert (body["reward"], body["terminated"], body["truncated"]) == (1.0, True, False)
    assert body["info"]["result"] == "win" and body["seed"] == 4 and body["id"] == 1
    # The prompt as the model saw it: the row's system message, then the dealt hand.
    opening = body["responses_create_params"]["input"]
    assert [m["role"] for m in opening] == ["system", "user"] and opening[1]["content"].startswith(
        "Your hand: [5, 6]"
    )
    kinds = [(i["type"], i.get("role")) for i in body["response"]["output"]]
    assert kinds == [("message", "assistant"), ("message", "user"), ("message", "assistant")]
    assert body["response"]["output"][1]["content"].startswith("Your hand: [5, 6, 8] = 19")
    # Seed 18 needs two hits and a stand: with max_steps 5 it finishes; the reward is a draw.
    assert (short["reward"], short["info"]["result"], short["id"]) == (0.0, "draw", 99)


def test_max_steps_truncates_and_closes_the_environment():
    env = BlackjackServer({"name": "env"})
    model = ScriptedModel({"name": "model", "scripts": [{"turns": [{"text": "<action>hit</action>"}]}]})
    with (
        running_agent(env, model, agent_class=GymnasiumAgent, max_steps=1) as agent_url,
        SyncClient() as http,
    ):
        status, body = http.post(agent_url + "/run", BY_SEED[18])  # 7: one hit leaves 14, not over
        assert status == 200, body
        assert len(env.sessions) == 0  # freed by /close, not left for the TTL
    assert (body["reward"], body["terminated"], body["truncated"]) == (0.0, False, True)
    assert body["response"]["output"][-1]["content"].startswith("Your hand: [4, 3, 7] = 14")


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(
        HERE, tmp_path / "rollouts.jsonl", agent="gymnasium_agent", num_samples_in_parallel=5
    )
    assert (summary.succeeded, summary.failed) == (5, 0)
    results = {r["seed"]: (r["reward"], r["info"]["result"]) for r in rows}
    assert results == {
        0: (1.0, "win"),
        4: (1.0, "win"),
        18: (0.0, "draw"),
        12: (-1.0, "bust"),
        1: (-1.0, "loss"),
    }
