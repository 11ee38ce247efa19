"""Our environments spoken as OpenEnv: OpenEnv's own client drives them through reset and step to a reward."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nemo_gym.testing import read_jsonl, running_app, running_server

ROOT = Path(__file__).resolve().parent.parent


def _why_not() -> str | None:
    if importlib.util.find_spec("openenv") is None:
        return "openenv-core is not installed (pip install -e '.[openenv]')"
    if importlib.util.find_spec("gymnasium") is None:
        return "gymnasium is not installed (pip install -e '.[gym]')"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


def _client(url: str):  # OpenEnv's own generic client, synchronous wrapper
    from openenv.core.generic_client import GenericEnvClient

    return GenericEnvClient(base_url=url).sync()


def test_openenv_client_plays_blackjack_through_reset_and_step_to_its_reward() -> None:
    from nemo_gym.bridges.openenv_server import openenv_app
    from resources_servers.blackjack.app import BlackjackServer

    rows = read_jsonl(ROOT / "resources_servers/blackjack/data/example.jsonl")
    with running_server(BlackjackServer({"name": "blackjack"})) as env_url:
        with running_app(openenv_app(env_url, rows)) as url, _client(url) as env:
            first = env.reset(row_index=0)
            assert first.done is False and "Your hand" in first.observation["text"]
            assert env.state()["step_count"] == 0 and env.state()["multi_turn"] is True
            hit = env.step({"message": "<action>hit</action>"})
            steps = 1
            result = hit
            while not result.done:
                result = env.step({"message": "<action>stand</action>"})
                steps += 1
            assert result.reward in (-1.0, 0.0, 1.0)
            state = env.state()
            assert state["done"] is True and state["step_count"] == steps
            # The same seeded row replays the same game: the framework's own reward, not ours.
            again = env.reset(row_index=0)
            assert again.observation["text"] == first.observation["text"]
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR|an action is"):
                env.step({"oops": 1})
            with pytest.raises(RuntimeError, match="row_index 99"):
                env.reset(row_index=99)


def test_openenv_client_drives_a_verify_environment_in_one_step() -> None:
    from nemo_gym.bridges.openenv_server import openenv_app
    from resources_servers.mcqa.app import MCQAServer

    rows = read_jsonl(ROOT / "resources_servers/mcqa/data/trl_letter.jsonl")
    with running_server(MCQAServer({"name": "mcqa"})) as env_url:
        with running_app(openenv_app(env_url, rows)) as url, _client(url) as env:
            prompt = env.reset(seed=3)
            assert "Pick the first" in prompt.observation["text"] and env.state()["multi_turn"] is False
            right = env.step({"message": "A"})
            assert (right.reward, right.done) == (1.0, True)
            env.reset(row_index=1)
            assert env.step({"text": "D"}).reward == 0.0
            with pytest.raises(RuntimeError, match="episode is over"):
                env.step({"message": "A"})
            # A resources server that fails is an error, never a reward.
            env.reset(row_index=0, row={"expected_answer": "Q"})
            with pytest.raises(RuntimeError, match="EXECUTION_ERROR|answered 422"):
                env.step({"message": "A"})
