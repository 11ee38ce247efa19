"""gymnasium_env: gymnasium's toy-text envs served by config, played to the end over HTTP and by the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_gym.response_items import message_item
from nemo_gym.testing import SyncClient, collect_examples, read_jsonl, running_server
from resources_servers.gymnasium_env.app import GymnasiumEnvServer

HERE = Path(__file__).resolve().parent.parent
ROWS = read_jsonl(HERE / "data" / "example.jsonl")


def config_of(name: str) -> dict[str, Any]:
    """The resources server settings of ``configs/<name>.yaml``."""
    (instance,) = [
        v
        for v in yaml.safe_load((HERE / "configs" / f"{name}.yaml").read_text()).values()
        if "resources_servers" in v
    ]
    return {"name": name, **instance["resources_servers"]["gymnasium_env"]}


def act(client: SyncClient, url: str, row: dict[str, Any], text: str) -> dict[str, Any]:
    status, body = client.post(url + "/step", {**row, "response": {"output": [message_item(text)]}})
    assert status == 200, body
    return body


@pytest.fixture(scope="module")
def lake():
    server = GymnasiumEnvServer(config_of("gymnasium_env"))
    with running_server(server) as url:
        yield server, url


def test_frozen_lake_is_played_to_the_goal(lake):
    server, url = lake
    with SyncClient() as client:
        status, reset = client.post(url + "/reset", ROWS[0])
        assert status == 200, reset
        assert reset["observation"].startswith("@FFF\nFHFH\nFFFH\nHFFG\nYou are @.")
        assert reset["info"] == {"env_id": "FrozenLake-v1", "prob": 1, "supports_explicit_close": True}
        steps = [
            act(client, url, ROWS[0], f"<action>{move}</action>")
            for move in ["down", "down", "right", "down", "right", "right"]
        ]
    assert [s["reward"] for s in steps] == [0.0] * 5 + [1.0]
    assert [s["terminated"] for s in steps] == [False] * 5 + [True]
    assert steps[0]["observation"].startswith("  (Down)\nSFFF\n@HFH\n")
    assert steps[-1]["observation"] is None
    assert steps[-1]["info"] == {"prob": 1.0, "action": "right", "step": 6, "episode_return": 1.0}
    assert len(server.sessions) == 0  # the env was closed and its state freed with the last step


def test_holes_end_the_episode_and_unreadable_answers_are_asked_again(lake):
    server, url = lake
    row = ROWS[2]  # SFHFG
    with SyncClient() as client:
        client.post(url + "/reset", row)
        again = act(client, url, row, "go east!")
        assert (again["reward"], again["terminated"], again["info"]) == (
            0.0,
            False,
            {"invalid_action": True, "step": 0},
        )
        assert again["observation"].startswith(
            "Your answer must name one action of: left, down, right, up; it had no action.\n@FHFG"
        )
        wrong = act(client, url, row, "<action>jump</action>")
        assert "it had the action 'jump', which is not one of them" in wrong["observation"]
        act(client, url, row, "<action>right</action>")
        fell = act(client, url, row, "<action> Right </action>")
    assert (fell["reward"], fell["terminated"], fell["info"]["episode_return"]) == (0.0, True, 0.0)
    # Three unreadable answers in a row truncate the episode.
    with SyncClient() as client:
        client.post(url + "/reset", row)
        answers = [act(client, url, row, "hmm") for _ in range(3)]
    assert [(a["truncated"], a["observation"] is None) for a in answers] == [
        (False, False),
        (False, False),
        (True, True),
    ]
    assert answers[-1]["info"]["reason"] == "3 answers in a row without a valid action"
    assert len(server.sessions) == 0


def test_taxi_and_blackjack_by_config_alone():
    taxi = GymnasiumEnvServer(config_of("taxi"))
    blackjack = GymnasiumEnvServer(config_of("gym_blackjack"))
    with running_server(taxi) as taxi_url, running_server(blackjack) as bj_url, SyncClient() as client:
        _, reset = client.post(taxi_url + "/reset", {"responses_create_params": {}, "seed": 0})
        board = reset["observation"].split("\nT is your")[0]
        assert (
            board
            == "+---------+\n|R: | : :G|\n| : | : : |\n| : : : : |\n|T| : | : |\n|<Y>| : |(B): |\n+---------+"
        )
        assert reset["info"]["action_mask"] == [1, 1, 0, 0, 0, 0]  # numpy made JSON
        step = act(client, taxi_url, {"seed": 0}, "<action>north</action>")
        assert step["reward"] == -1.0 and "\n|T: : : : |\n| | : | : |\n" in step["observation"]
        # Blackjack-v1 has no text rendering: the template writes the raw observation.
        _, reset = client.post(bj_url + "/reset", {"responses_create_params": {}, "seed": 6})
        assert reset["observation"].startswith("Your sum: 12. Dealer shows: 6. Usable ace: 0.")
        hit = act(client, bj_url, {}, "<action>hit</action>")
        assert hit["observation"].startswith("Your sum: 17.") and hit["reward"] == 0.0
        final = act(client, bj_url, {}, "<action>stand</action>")
    assert final["terminated"] and final["reward"] == 1.0 and final["info"]["action"] == "stand"


def test_bad_configs_fail_at_start_and_bad_rows_get_422(lake):
    _, url = lake
    with pytest.raises(ValueError, match="not a registered gymnasium env"):
        GymnasiumEnvServer({"env_id": "NoSuchEnv-v0"})
    with pytest.raises(ValueError, match="no 'ansi' text rendering"):
        GymnasiumEnvServer({"env_id": "Blackjack-v1"})
    with pytest.raises(ValueError, match=r"actions \{'fly': 7\} are not in"):
        GymnasiumEnvServer({"env_id": "FrozenLake-v1", "actions": {"fly": 7}})
    with pytest.raises(ValueError, match="observation_template .* cannot be filled"):
        GymnasiumEnvServer({"env_id": "FrozenLake-v1", "observation_template": "{board}"})
    with pytest.raises(ValueError, match="capturing group"):
        GymnasiumEnvServer({"env_id": "FrozenLake-v1", "action_pattern": "<a>"})
    # Without an actions mapping a Discrete env takes its action numbers.
    numbered = GymnasiumEnvServer({"env_id": "FrozenLake-v1", "env_kwargs": {"is_slippery": False}})
    with running_server(numbered) as base, SyncClient() as client:
        _, reset = client.post(base + "/reset", {"responses_create_params": {}})
        assert reset["observation"].endswith("NAME one of: 0, 1, 2, 3.")
        assert act(client, base, {}, "<action>1</action>")["observation"].startswith("  (Down)\nSFFF\n[F]HFH")
    with SyncClient() as client:
        status, body = client.post(url + "/reset", {**ROWS[0], "seed": "x"})
        assert status == 422 and body["detail"][0]["field"] == "seed"
        status, body = client.post(url + "/reset", {**ROWS[0], "env_kwargs": {"desc": 5}})
        assert status == 422 and body["error"].startswith("env_kwargs: FrozenLake-v1 refused them")
        status, body = client.post(url + "/step", {**ROWS[0], "response": {"output": []}})
        assert status == 409 and "/reset" in body["error"]


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(
        HERE, tmp_path / "rollouts.jsonl", agent="gymnasium_agent", num_samples_in_parallel=5
    )
    assert (summary.succeeded, summary.failed) == (5, 0)
    by_id = {r["id"]: r for r in rows}
    assert {i: (r["reward"], r["terminated"], r["truncated"]) for i, r in by_id.items()} == {
        0: (1.0, True, False),
        1: (1.0, True, False),
        2: (0.0, True, False),
        3: (1.0, True, False),
        4: (0.0, False, True),
    }
    assert by_id[3]["info"]["step"] == 5 and by_id[4]["info"]["step"] == 20
