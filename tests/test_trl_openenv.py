"""TRL through OpenEnv's client (nemo_gym.bridges.trl_openenv): GRPOTrainer's environment_factory
episodes, each an OpenEnv client session on the OpenEnv bridge in front of one of our resources
servers, the reward the one OpenEnv's observation carries (the server's /verify)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from nemo_gym.bridges.trl_rewards import VerifyReward, trl_dataset_columns
from nemo_gym.launch.launcher import free_port
from nemo_gym.testing import read_jsonl, running_app, running_server

ROOT = Path(__file__).resolve().parent.parent
ROWS = read_jsonl(ROOT / "resources_servers/mcqa/data/trl_letter.jsonl")


def _why_not() -> str | None:
    if importlib.util.find_spec("openenv") is None:
        return "openenv-core is not installed (pip install -e '.[openenv]')"
    if importlib.util.find_spec("gymnasium") is None:
        return "gymnasium is not installed (pip install -e '.[gym]')"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@pytest.mark.slow
def test_episodes_reset_on_the_rows_and_score_through_openenv() -> None:
    from nemo_gym.bridges.openenv_server import openenv_app
    from nemo_gym.bridges.trl_openenv import OpenEnvRewardError, openenv_environment_factory, openenv_reward
    from resources_servers.blackjack.app import BlackjackServer
    from resources_servers.mcqa.app import MCQAServer

    columns = trl_dataset_columns(ROWS[:2])
    with (
        running_server(MCQAServer({"name": "mcqa"})) as env_url,
        running_app(openenv_app(env_url, ROWS)) as url,
    ):
        factory = openenv_environment_factory(url)
        episodes = [factory(), factory(), factory()]
        # The second row, changed to expect B: reset hands the rollout's own row to the bridge.
        rows = [columns["ng_row"][0], json.dumps({**ROWS[1], "expected_answer": "B"}), columns["ng_row"][0]]
        for episode, row in zip(episodes, rows, strict=True):
            assert episode.reset(prompt=None, ng_row=row) is None
        completions = [[{"role": "assistant", "content": "A"}], "B", "D"]
        rewards = openenv_reward([None] * 3, completions, environments=episodes)
        assert rewards == [1.0, 1.0, 0.0]
        # The same answers through /verify directly give the same rewards: the server's own.
        assert [
            VerifyReward(env_url).verify(json.loads(r), t) for r, t in zip(rows, "ABD", strict=True)
        ] == rewards
        with pytest.raises(OpenEnvRewardError, match="episode is over"):
            openenv_reward([None], ["A"], environments=episodes[:1])
        with pytest.raises(OpenEnvRewardError, match="2 completions but 1 environments"):
            openenv_reward([None] * 2, ["A", "B"], environments=episodes[:1])
        for episode in episodes:
            episode._close()

    blackjack_rows = read_jsonl(ROOT / "resources_servers/blackjack/data/example.jsonl")
    with running_server(BlackjackServer({"name": "blackjack"})) as env_url:
        with running_app(openenv_app(env_url, blackjack_rows)) as url:
            episode = openenv_environment_factory(url)()
            episode.reset()
            with pytest.raises(OpenEnvRewardError, match="not over after one answer"):
                openenv_reward([None], ["<action>hit</action>"], environments=[episode])
            episode._close()
    closed = openenv_environment_factory(f"http://127.0.0.1:{free_port()}")()
    with pytest.raises(OpenEnvRewardError, match="reset at http://127.0.0.1"):
        closed.reset()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="trl is not installed (pip install -e '.[trl]')"
)
def test_trl_grpo_trains_through_openenvs_client(tmp_path: Path) -> None:
    """GRPOTrainer with environment_factory over the bridge, two steps: every reward TRL logs
    came back through OpenEnv's client."""
    import torch
    from datasets import Dataset

    from nemo_gym.bridges.openenv_server import openenv_app
    from nemo_gym.bridges.trl_grpo import cpu_grpo_trainer
    from nemo_gym.bridges.trl_openenv import openenv_environment_factory, openenv_reward
    from nemo_gym.engine.tiny_model import build_tiny_model
    from resources_servers.mcqa.app import MCQAServer

    torch.manual_seed(0)
    path = build_tiny_model()
    seen: list[list[float]] = []

    def reward(*args, **kwargs):
        values = openenv_reward(*args, **kwargs)
        seen.append(values)
        return values

    with (
        running_server(MCQAServer({"name": "mcqa"})) as env_url,
        running_app(openenv_app(env_url, ROWS)) as url,
    ):
        trainer = cpu_grpo_trainer(
            path,
            Dataset.from_dict(trl_dataset_columns(ROWS)),
            reward,
            output_dir=tmp_path,
            steps=2,
            generations=8,
            max_completion_length=4,
            environment_factory=openenv_environment_factory(url),
        )
        trainer.train()
    assert [len(batch) for batch in seen] == [8, 8]
    logged = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    assert logged == pytest.approx([sum(batch) / 8 for batch in seen])
