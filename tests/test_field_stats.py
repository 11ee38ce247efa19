"""NeMo Gym's field statistics in aggregate metrics: usage numbers under their own names, per
task, per run and per repeat (0.7.0's scicode_agent reads ``mean/output_tokens`` per group)."""

from __future__ import annotations

from typing import Any

from nemo_gym.reward_profile import compute_aggregate_metrics


def _row(task: int, repeat: int, output_tokens: int, reward: float) -> dict[str, Any]:
    return {
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
        "reward": reward,
        "solved": reward > 0,
        "response": {
            "usage": {"output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 1}}
        },
    }


ROWS = [_row(0, 0, 100, 1.0), _row(0, 1, 200, 0.0), _row(1, 0, 1000, 1.0), _row(1, 1, 2300, 1.0)]


def test_usage_numbers_are_profiled_per_task_and_per_run_under_their_own_names() -> None:
    result = compute_aggregate_metrics(ROWS)
    assert [g["mean/output_tokens"] for g in result.group_level_metrics] == [150, 1650]
    assert [g["max/output_tokens"] for g in result.group_level_metrics] == [200, 2300]
    assert result.agent_metrics["max/output_tokens"] == 2300
    assert result.agent_metrics["median/output_tokens"] == 600
    assert result.agent_metrics["mean/solved"] == 0.75  # a bool counts as 0/1
    assert "mean/output_tokens_details" not in result.agent_metrics  # nested usage stays out


def test_repeat_level_metrics_per_repeat_with_the_environments_repeat_hook() -> None:
    def accuracy(tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        rows = [r for task in tasks for r in task]
        return {"accuracy": sum(r["reward"] for r in rows) / len(rows), "label": "x"}

    result = compute_aggregate_metrics(ROWS, compute_repeat_metrics_fn=accuracy)
    first, second = result.repeat_level_metrics
    assert (first["_ng_rollout_index"], first["sample_count"], first["missing_count"]) == (0, 2, 0)
    assert first["mean/output_tokens"] == 550 and second["mean/output_tokens"] == 1250
    assert (first["accuracy"], second["accuracy"]) == (1.0, 0.5)
    assert "label" not in first  # only numbers finite in every repeat
    assert result.agent_metrics["mean_across_repeats/accuracy"] == 0.75


def test_one_repeat_has_no_repeat_level_entries_and_missing_tasks_are_counted() -> None:
    assert compute_aggregate_metrics(ROWS[:1]).repeat_level_metrics == []
    result = compute_aggregate_metrics(ROWS[:3])
    assert [(e["sample_count"], e["missing_count"]) for e in result.repeat_level_metrics] == [(2, 0), (1, 1)]
