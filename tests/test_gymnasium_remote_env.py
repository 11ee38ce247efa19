"""nemo_gym.gymnasium.RemoteEnv: a Gymnasium-style server as a real gymnasium.Env, checked by check_env."""

from __future__ import annotations

import gc
import warnings
from typing import Any

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from nemo_gym.gymnasium import RemoteEnv, RemoteEnvError
from nemo_gym.gymnasium_server import GymnasiumServer, StepResult, extract_text
from nemo_gym.testing import running_server
from resources_servers.blackjack.app import BlackjackServer

ROW = {"responses_create_params": {"input": [{"role": "system", "content": "Play blackjack."}]}}


@pytest.fixture(scope="module")
def blackjack():
    server = BlackjackServer({"name": "blackjack"})
    with running_server(server) as url:
        yield server, url


@pytest.mark.parametrize("unparsed_action", ["stand", "ask_again"])
def test_check_env_passes_over_blackjack(unparsed_action: str):
    server = BlackjackServer({"name": "blackjack", "unparsed_action": unparsed_action})
    with running_server(server) as url:
        env = RemoteEnv(url, ROW)
        gc.collect()  # what earlier tests left (their event loops) warns now, not inside the window
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env)  # random printable text actions included
        env.close()
        assert len(server.sessions) == 0  # every episode check_env left open was closed
    problems = [str(w.message) for w in caught if "spec" not in str(w.message)]
    assert problems == []


def test_a_seeded_gymnasium_loop_plays_hands_to_the_end(blackjack):
    server, url = blackjack
    env = RemoteEnv(url, ROW, render_mode="ansi")
    observation, info = env.reset(seed=4)
    assert observation.startswith("Your hand: [5, 6] = 11") and info == {"supports_explicit_close": True}
    assert env.render() == observation and observation in env.observation_space
    observation, reward, terminated, truncated, info = env.step("<action>hit</action>")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert observation.startswith("Your hand: [5, 6, 8] = 19")
    observation, reward, terminated, truncated, info = env.step("<action>stand</action>")
    assert (observation, reward, terminated, info["result"]) == ("", 1.0, True, "win")
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step("<action>hit</action>")
    # Unseeded resets after a seeded one repeat as a sequence, like any Gymnasium env.
    env.reset(seed=123)
    first = [env.reset()[0] for _ in range(3)]
    env.reset(seed=123)
    assert [env.reset()[0] for _ in range(3)] == first
    # Row fields can be overridden per episode.
    assert env.reset(options={"row": {"seed": 0}})[0].startswith("Your hand: [8, A] = 19")
    env.close()
    env.close()
    assert len(server.sessions) == 0


def test_wrapped_in_standard_wrappers(blackjack):
    _, url = blackjack
    env = gymnasium.wrappers.RecordEpisodeStatistics(RemoteEnv(url, ROW))
    env.reset(seed=18)
    rewards = []
    for action in ["<action>hit</action>", "<action>hit</action>", "<action>stand</action>"]:
        _, reward, terminated, _, info = env.step(action)
        rewards.append(reward)
    assert terminated and rewards == [0.0, 0.0, 0.0] and info["episode"]["l"] == 3
    env.close()


class Unicode(GymnasiumServer):
    async def reset(self, metadata: dict[str, Any], session_id: str | None = None):
        self.session_state[session_id] = 0
        return "♠ 10 and 😀 emoji", {}

    async def step(
        self, action: dict[str, Any], metadata: dict[str, Any], session_id: str | None = None
    ) -> StepResult:
        return "echo: " + extract_text(action) * 10, 0.5, False, False, {"n": 1}


def test_observations_are_kept_inside_the_space():
    with running_server(Unicode({"name": "uni"})) as url:
        env = RemoteEnv(url, ROW, max_observation_length=20)
        observation, _ = env.reset()
        assert observation == "♠ 10 and ? emoji" and observation in env.observation_space
        observation, reward, *_ = env.step("abc")
        assert observation == "echo: abcabcabcabcab" and reward == 0.5
        env.close()


def test_server_errors_name_the_url_and_the_error():
    with running_server(Unicode({"name": "uni"})) as url:
        env = RemoteEnv(url + "/", {"responses_create_params": "not an object"})
        with pytest.raises(
            RemoteEnvError, match=r"/reset answered HTTP 422: invalid body: responses_create_params"
        ):
            env.reset()
    with pytest.raises(RemoteEnvError, match="cannot reach http://127.0.0.1:9/reset"):
        RemoteEnv("http://127.0.0.1:9", ROW, timeout_s=2).reset()
    with pytest.raises(ValueError, match="render_mode"):
        RemoteEnv("http://127.0.0.1:9", ROW, render_mode="human")


def test_gymnasium_make_builds_one_and_check_env_runs_its_spec_checks(blackjack):
    from nemo_gym.gymnasium import REMOTE_ENV_ID, register_remote_env

    server, url = blackjack
    assert register_remote_env() == REMOTE_ENV_ID == register_remote_env()
    env = gymnasium.make(REMOTE_ENV_ID, url=url, row=ROW, render_mode="ansi")
    assert isinstance(env.unwrapped, RemoteEnv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)  # with a spec: render modes and a double close are checked too
    assert [str(w.message) for w in caught] == []
    observation, _ = env.reset(seed=0)
    assert env.render() == observation and observation.startswith("Your hand: [8, A] = 19")
    env.close()
    assert len(server.sessions) == 0
