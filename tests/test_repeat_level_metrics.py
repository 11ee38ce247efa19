"""NeMo Gym's (0.6.0 on) ``AggregateMetrics.repeat_level_metrics``: per-repeat summaries."""

from __future__ import annotations

import pytest

from nemo_gym.collection.repeat_metrics import repeat_level_metrics
from nemo_gym.config_types import AggregateMetrics
from nemo_gym.reward_profile import compute_aggregate_metrics


def _row(task: int, repeat: int, reward: float, agent: str = "a") -> dict:
    return {
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
        "reward": reward,
        "agent_ref": {"name": agent},
    }


def test_one_entry_per_repeat_with_the_statistics_of_its_tasks() -> None:
    rows = [
        _row(0, 0, 1.0),
        _row(1, 0, 0.0),
        _row(2, 0, 1.0),
        _row(3, 0, 0.0),
        _row(0, 1, 1.0),
        _row(1, 1, 1.0),
    ]
    first, second = repeat_level_metrics(rows)
    assert (first["_ng_rollout_index"], first["sample_count"], first["missing_count"]) == (0, 4, 0)
    assert first["agent_ref"] == {"name": "a"}
    assert first["mean/reward"] == 0.5
    assert first["std/reward"] == pytest.approx(0.57735, abs=1e-5)  # sample standard deviation
    assert first["sem/reward"] == pytest.approx(0.57735 / 2, abs=1e-5)
    assert (first["p25/reward"], first["median/reward"], first["p75/reward"]) == (0.0, 0.5, 1.0)
    assert (second["sample_count"], second["missing_count"], second["mean/reward"]) == (2, 2, 1.0)


def test_an_agent_run_once_per_task_has_no_entries() -> None:
    rows = [_row(0, 0, 1.0), _row(1, 0, 0.0), _row(0, 0, 1.0, agent="b"), _row(0, 1, 0.0, agent="b")]
    assert [e["agent_ref"]["name"] for e in repeat_level_metrics(rows)] == ["b", "b"]
    assert repeat_level_metrics(rows[:2]) == []


def test_the_aggregate_answer_carries_them() -> None:
    """gdpval 0.6.0 builds its answer with ``repeat_level_metrics=base.repeat_level_metrics``."""
    answer = compute_aggregate_metrics([_row(0, 0, 1.0), _row(0, 1, 0.0)])
    assert [e["mean/reward"] for e in answer.repeat_level_metrics] == [1.0, 0.0]
    assert AggregateMetrics().repeat_level_metrics == []
