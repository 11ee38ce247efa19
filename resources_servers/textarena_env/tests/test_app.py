"""textarena_env: TextArena games by config, end to end through the collector on the scripted model.

Each game's reward is checked against TextArena itself: the same seed and the same answers
replayed in this process give the same reward and the same number of steps.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nemo_gym.testing import SCRIPTED_MODEL_CONFIG, collect_with_stack
from resources_servers.textarena_env.app import final_rewards

HERE = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("textarena") is None,
    reason="textarena is not installed (pip install -e '.[textarena]')",
)


def answers(row: dict) -> list[str]:
    """The model's answers in a rollout, in order."""
    texts = []
    for item in row["response"]["output"]:
        if item.get("type") == "message" and item.get("role") == "assistant":
            texts.append("".join(part.get("text", "") for part in item["content"]))
    return texts


def replay(env_id: str, seed: int, actions: list[str]) -> tuple[float, int]:
    """TextArena's own reward for these answers, and how many were played before the game ended."""
    import textarena

    env = textarena.make(env_id)
    env.reset(num_players=1, seed=seed)
    for count, action in enumerate(actions, 1):
        env.get_observation()
        done, _ = env.step(action=action)
        if done:
            return final_rewards(env.close())[0][0], count
    raise AssertionError(f"{env_id} did not end after {len(actions)} answers")


@pytest.mark.slow
@pytest.mark.parametrize("game", ["GuessTheNumber", "Mastermind", "TowerOfHanoi"])
def test_textarena_game_scores_with_textarenas_own_reward(game: str, tmp_path: Path) -> None:
    name = f"textarena_{game.lower()}"
    summary, rows = collect_with_stack(
        [
            f"resources_servers/textarena_env/configs/{name}.yaml",
            SCRIPTED_MODEL_CONFIG,
            "resources_servers/textarena_env/configs/scripted_policy.yaml",
        ],
        agent_name=f"{name}_gymnasium_agent",
        input_jsonl_fpath=HERE / "data" / "example.jsonl",
        output_jsonl_fpath=tmp_path / "rollouts.jsonl",
    )
    assert summary.failed == 0 and len(rows) == 2, rows
    for row in rows:
        assert row["terminated"] is True, row
        played = answers(row)
        assert (row["reward"], len(played)) == replay(f"{game}-v0", row["seed"], played)
