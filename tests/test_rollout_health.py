"""``nemo_gym.rollout_health`` and ``gym eval health-check`` on NeMo Gym's recorded example rollouts:
a rollout whose turns and captured model calls agree is healthy, one whose model call failed last is
unhealthy, one without trajectory evidence is unobserved, and an unreadable line is named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.rollout_health import (
    CHECK_REGISTRY,
    health_check_run_dir,
    normalize_ignored_checks,
    run_health_checks,
)
from nemo_gym.tools.gym_cli import main as gym_main

ROOT = Path(__file__).resolve().parents[1]
ROLLOUTS = ROOT / "tests/compat/nemo_gym/example_multi_step/example_rollouts.jsonl"
MODEL = {"type": "responses_api_models", "name": "policy_model"}


def trajectory(row: dict[str, Any], task: int, *, status: int = 200) -> dict[str, Any]:
    """A trajectory of one turn that references one captured call carrying the row's token usage."""
    usage = row["response"]["usage"]
    call_id = f"call-{task}"
    return {
        "task_id": str(task),
        "rollout_id": f"{task}-0",
        "turns": [
            {
                "invocation_id": "main",
                "task_id": str(task),
                "rollout_id": f"{task}-0",
                "turn_no": 1,
                "timestamp": 1.0,
                "answer": row["response"]["output"][-1],
                "step_count": 1,
                "model_calls": [{"model_call_id": call_id}],
            }
        ],
        "model_calls": [
            {
                "model_call_id": call_id,
                "started_at": 1.0,
                "response": {"output": row["response"]["output"][-1:]} if status < 400 else None,
                "response_metadata": {"model_ref": MODEL, "status_code": status},
                "token_stats": {
                    "prompt_tokens": usage["input_tokens"],
                    "completion_tokens": usage["output_tokens"],
                },
            }
        ],
    }


def write_run(folder: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in ROLLOUTS.read_text().splitlines()]
    records = []
    for task, row in enumerate(rows):
        record = {**row, "_ng_task_index": task, "_ng_rollout_index": 0}
        if task < 3:
            record["ng_trajectory"] = trajectory(row, task, status=500 if task == 2 else 200)
        records.append(record)
    lines = [json.dumps(r) for r in records] + ["{not json"]
    (folder / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    return records


def test_run_health_checks_on_example_rollouts(tmp_path: Path) -> None:
    write_run(tmp_path)
    result = run_health_checks(tmp_path / "rollouts.jsonl", workers=1)
    verdicts = {d.task_index: d.verdict for d in result.rollouts}
    assert verdicts[0] == verdicts[1] == "healthy"
    assert verdicts[2] == "unhealthy" and verdicts[3] == verdicts[4] == "unobserved"
    failed = {f.check for f in result.rollouts[2].findings}
    assert failed == {"rollout_ended_on_failed_model_call", "model_call_failed"}
    unreadable = result.rollouts[5]
    assert unreadable.verdict == "unhealthy" and unreadable.findings[0].locator == {
        "source_file": str(tmp_path / "rollouts.jsonl"),
        "line": 6,
    }
    run = result.summary["run"]
    assert run["verdicts"] == {"healthy": 2, "unhealthy": 2, "unobserved": 2}
    assert run["stats"]["model_call_errors"] == {
        "total": 1,
        "by_status": {"500": 1},
        "rollouts_affected": 1,
        "ended_on_error": 1,
    }
    assert run["artifacts"]["coverage"]["rollout_token_count_mismatch"]["evaluated"] == 3
    lines = (tmp_path / "rollout_verdicts.jsonl").read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["verdict"] == "healthy"
    # Ignoring the two checks that fired leaves the failed rollout healthy.
    again = run_health_checks(
        tmp_path / "rollouts.jsonl",
        workers=2,
        ignored_checks=["rollout_ended_on_failed_model_call", "model_call_failed"],
    )
    assert again.rollouts[2].verdict == "healthy"


def test_token_mismatch_and_unknown_checks(tmp_path: Path) -> None:
    records = write_run(tmp_path)
    record = records[0]
    record["ng_trajectory"]["model_calls"][0]["token_stats"]["completion_tokens"] += 5
    (tmp_path / "one.jsonl").write_text(json.dumps(record) + "\n")
    [digest] = run_health_checks(tmp_path / "one.jsonl", workers=1).rollouts
    assert [f.check for f in digest.findings] == ["rollout_token_count_mismatch"]
    with pytest.raises(ValueError, match="Unknown rollout health check"):
        normalize_ignored_checks("model_call_failed,no_such_check")
    assert len(CHECK_REGISTRY) == 14
    with pytest.raises(FileNotFoundError, match="Run directory not found"):
        health_check_run_dir(tmp_path / "missing")


def test_gym_eval_health_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path)
    with pytest.raises(SystemExit) as done:
        gym_main(["eval", "health-check", str(tmp_path), "--workers", "1"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert "Rollout health: 6 checked, 2 healthy, 2 unhealthy, 2 unobserved" in out
    assert json.loads((tmp_path / "quality_summary.json").read_text())["tasks"]["2"]["unhealthy"] == 1
    with pytest.raises(SystemExit) as done:
        gym_main(["eval", "health-check", str(tmp_path), "--rollouts-file", "nope.jsonl"])
    assert done.value.code == 2 and "nope.jsonl" in capsys.readouterr().err
