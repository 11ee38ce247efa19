"""gem_env: GEM environments by config, end to end through the collector on the scripted model.

Each rollout's reward is checked against GEM itself: the same seed and the same answers replayed
in this process give the same summed reward and the same number of steps.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nemo_gym.testing import SCRIPTED_MODEL_CONFIG, collect_with_stack

HERE = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gem") is None, reason="gem-llm is not installed (pip install --no-deps gem-llm)"
)


def answers(row: dict) -> list[str]:
    """The model's answers in a rollout, in order."""
    return [
        "".join(part.get("text", "") for part in item["content"])
        for item in row["response"]["output"]
        if item.get("type") == "message" and item.get("role") == "assistant"
    ]


def replay(env_id: str, seed: int, actions: list[str]) -> tuple[float, int, bool]:
    """GEM's own summed reward for these answers, how many were played, whether it terminated."""
    import gem

    env = gem.make(env_id)
    env.reset(seed=seed)
    total = 0.0
    for count, action in enumerate(actions, 1):
        _, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        if terminated or truncated:
            return total, count, bool(terminated)
    return total, len(actions), False


@pytest.mark.slow
@pytest.mark.parametrize("game", ["GuessTheNumber", "Mastermind", "TowerofHanoi"])
def test_gem_environment_scores_with_gems_own_reward(game: str, tmp_path: Path) -> None:
    name = f"gem_{game.lower()}"
    summary, rows = collect_with_stack(
        [
            f"resources_servers/gem_env/configs/{name}.yaml",
            SCRIPTED_MODEL_CONFIG,
            "resources_servers/gem_env/configs/scripted_policy.yaml",
        ],
        agent_name=f"{name}_gymnasium_agent",
        input_jsonl_fpath=HERE / "data" / "example.jsonl",
        output_jsonl_fpath=tmp_path / "rollouts.jsonl",
    )
    assert summary.failed == 0 and len(rows) == 2, rows
    for row in rows:
        played = answers(row)
        total, count, terminated = replay(f"game:{game}-v0-easy", row["seed"], played)
        assert row["reward"] == pytest.approx(total) and len(played) == count, (row["reward"], total, played)
        assert row["terminated"] is terminated
