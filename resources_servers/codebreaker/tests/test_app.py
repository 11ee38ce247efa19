"""codebreaker: seeded secrets, feedback, the guess budget, state freed, RemoteEnv and the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_gym.response_items import message_item
from nemo_gym.testing import SyncClient, collect_examples, read_jsonl, running_server
from resources_servers.codebreaker.app import CodebreakerServer, GameRules, score, secret_code

HERE = Path(__file__).resolve().parent.parent
ROWS = read_jsonl(HERE / "data" / "example.jsonl")


def act(client: SyncClient, url: str, row: dict[str, Any], text: str) -> dict[str, Any]:
    status, body = client.post(url + "/step", {**row, "response": {"output": [message_item(text)]}})
    assert status == 200, body
    return body


@pytest.fixture(scope="module")
def served():
    server = CodebreakerServer({"name": "codebreaker"})
    with running_server(server) as url:
        yield server, url


def test_secrets_are_seeded_and_feedback_counts_each_digit_once():
    assert [secret_code(GameRules(seed=row["seed"])) for row in ROWS] == [
        "1234",
        "3456",
        "6543",
        "6532",
        "1122",
    ]
    assert secret_code(GameRules(seed=5, symbols=9, length=6, allow_repeats=False)) == secret_code(
        GameRules(seed=5, symbols=9, length=6, allow_repeats=False)
    )
    assert len(set(secret_code(GameRules(seed=5, symbols=9, length=9, allow_repeats=False)))) == 9
    assert score("1122", "1212") == (2, 2)
    assert score("1122", "2211") == (0, 4)
    assert score("6532", "3456") == (0, 3)
    assert score("1234", "1111") == (1, 0)


def test_a_game_cracked_on_the_third_guess(served):
    server, url = served
    row = ROWS[1]  # secret 3456
    with SyncClient() as client:
        status, reset = client.post(url + "/reset", row)
        assert status == 200
        assert reset["observation"].startswith("I picked a secret code of 4 digits, each from 1 to 6")
        assert reset["info"] == {"max_guesses": 10, "supports_explicit_close": True}
        first = act(client, url, row, "Let me try <guess>1 2 3 4</guess>")
        bad = act(client, url, row, "<guess>1278</guess>")
        cracked = act(client, url, row, "<guess>3456</guess> and <guess>1111</guess>")
    assert first["observation"] == (
        "Guess 1: 1234: 0 right and in the right place, 2 right but in the wrong place. 9 guesses left."
    )
    assert first["info"] == {"right_place": 0, "wrong_place": 2} and not first["terminated"]
    assert bad["observation"] == "Guess 2 is not valid: '1278' is not 4 digits from 1 to 6. 8 guesses left."
    assert cracked == {
        "observation": None,
        "reward": 1.0,
        "terminated": True,
        "truncated": False,
        "info": {"result": "cracked", "secret": "3456", "guesses": 3},
    }
    assert len(server.sessions) == 0


def test_the_guess_budget_ends_the_game_at_zero(served):
    server, url = served
    row = {**ROWS[0], "max_guesses": 2}
    with SyncClient() as client:
        client.post(url + "/reset", row)
        first = act(client, url, row, "no idea")
        last = act(client, url, row, "<guess>4321</guess>")
        again = client.post(
            url + "/step", {**row, "response": {"output": [message_item("<guess>1234</guess>")]}}
        )
    assert (
        first["observation"] == "Guess 1 is not valid: no <guess>...</guess> tag with 4 digits. 1 guess left."
    )
    assert (last["reward"], last["terminated"], last["info"]) == (
        0.0,
        True,
        {"result": "out_of_guesses", "secret": "1234", "guesses": 2},
    )
    assert again[0] == 409 and "/reset" in again[1]["error"]
    assert len(server.sessions) == 0


def test_bad_rows_are_422_naming_the_field(served):
    _, url = served
    with SyncClient() as client:
        for row, field in [
            ({"responses_create_params": {}}, "seed"),
            ({**ROWS[0], "length": 0}, "length"),
            ({**ROWS[0], "symbols": 12}, "symbols"),
        ]:
            status, body = client.post(url + "/reset", row)
            assert status == 422 and body["detail"][0]["field"] == field, body
        status, body = client.post(url + "/reset", {**ROWS[0], "allow_repeats": False, "symbols": 3})
        assert status == 422 and "allow_repeats false needs symbols >= length" in body["error"]


def test_remote_env_passes_check_env(served):
    from gymnasium.utils.env_checker import check_env

    from nemo_gym.gymnasium import RemoteEnv

    server, url = served
    env = RemoteEnv(url, ROWS[0])
    check_env(env, skip_render_check=True)  # random text guesses included
    observation, _ = env.reset(seed=1373)
    assert env.step("<guess>1234</guess>")[1:3] == (1.0, True)
    env.close()
    assert len(server.sessions) == 0


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(
        HERE, tmp_path / "rollouts.jsonl", agent="gymnasium_agent", num_samples_in_parallel=5
    )
    assert (summary.succeeded, summary.failed) == (5, 0)
    results = {r["seed"]: (r["reward"], r["info"]["result"], r["info"]["guesses"]) for r in rows}
    assert results == {
        1373: (1.0, "cracked", 1),
        3767: (1.0, "cracked", 3),
        3188: (1.0, "cracked", 4),
        0: (0.0, "out_of_guesses", 6),
        440: (0.0, "out_of_guesses", 4),
    }
