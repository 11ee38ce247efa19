"""skyrl_gym_env: SkyRL-gym environments by config, end to end through ng_collect_rollouts on the scripted model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nemo_gym.testing import SCRIPTED_MODEL_CONFIG, collect_with_stack

HERE = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("skyrl_gym") is None,
    reason="skyrl-gym is not installed (pip install -e '.[skyrl]')",
)


def collect(env: str, tmp_path: Path) -> dict[int, dict]:
    configs = [
        f"resources_servers/skyrl_gym_env/configs/skyrl_{env}.yaml",
        SCRIPTED_MODEL_CONFIG,
        "resources_servers/skyrl_gym_env/configs/scripted_policy.yaml",
    ]
    summary, rows = collect_with_stack(
        configs,
        agent_name=f"skyrl_{env}_gymnasium_agent",
        input_jsonl_fpath=HERE / "data" / f"{env}.jsonl",
        output_jsonl_fpath=tmp_path / f"{env}.jsonl",
    )
    assert summary.failed == 0, rows
    return {r["id"]: r for r in rows}


@pytest.mark.slow
def test_three_skyrl_environments_score_with_skyrl_gyms_own_reward(tmp_path: Path) -> None:
    gsm8k = collect("gsm8k", tmp_path)
    assert {i: r["reward"] for i, r in gsm8k.items()} == {0: 1.0, 1: 0.0}
    aime = collect("aime", tmp_path)  # SkyRL-gym's AIME scores a wrong answer -1
    assert {i: r["reward"] for i, r in aime.items()} == {0: 1.0, 1: -1.0}
    # Multi-turn, through the gymnasium_agent: SkyRL-gym's per-turn rewards (0.2 / max_turns for
    # a well-formatted wrong answer, 1.0 for the right one) summed over its two turns.
    (multi,) = collect("gsm8k_multi_turn", tmp_path).values()
    assert multi["reward"] == pytest.approx(1.1) and multi["terminated"] is True
