"""TRL's reward function through a resources server's real /verify, and GRPO training on CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.bridges.trl_rewards import (
    ROW_COLUMN,
    VerifyReward,
    VerifyRewardError,
    completion_text,
    trl_dataset_columns,
)
from nemo_gym.launch.launcher import free_port
from nemo_gym.testing import read_jsonl, running_server
from resources_servers.mcqa.app import MCQAServer

ROOT = Path(__file__).resolve().parent.parent
ROWS = read_jsonl(ROOT / "resources_servers/mcqa/data/trl_letter.jsonl")


@pytest.fixture(scope="module")
def url():
    with running_server(MCQAServer({"name": "mcqa"})) as base:
        yield base


def test_dataset_columns_carry_the_prompt_and_the_whole_row() -> None:
    columns = trl_dataset_columns(ROWS[:2])
    assert columns["prompt"][0] == ROWS[0]["responses_create_params"]["input"]
    assert json.loads(columns[ROW_COLUMN][1]) == ROWS[1]
    assert trl_dataset_columns([{"responses_create_params": {"input": "hi"}}])["prompt"] == [
        [{"role": "user", "content": "hi"}]
    ]


def test_dataset_columns_name_the_bad_row() -> None:
    with pytest.raises(ValueError, match="row 1: responses_create_params.input is missing"):
        trl_dataset_columns([ROWS[0], {"responses_create_params": {}}])
    with pytest.raises(ValueError, match="row 0: .*role and string content"):
        trl_dataset_columns([{"responses_create_params": {"input": [{"type": "function_call_output"}]}}])


def test_rewards_are_the_servers_own(url: str) -> None:
    reward = VerifyReward(url)
    rows = [json.dumps(ROWS[0])] * 4
    completions = [
        [{"role": "assistant", "content": "A"}],
        [{"role": "assistant", "content": " a, the first"}],
        [{"role": "assistant", "content": "B"}],
        "zzz",
    ]
    assert reward([None] * 4, completions, **{ROW_COLUMN: rows}) == [1.0, 1.0, 0.0, 0.0]
    assert reward.history == [[1.0, 1.0, 0.0, 0.0]]


def test_a_failed_verify_raises_and_is_never_a_zero_reward(url: str) -> None:
    bad = dict(ROWS[0], expected_answer="Q")  # not one of the row's options: the server answers 422
    with pytest.raises(VerifyRewardError, match=r"/verify answered 422: .*expected_answer"):
        VerifyReward(url)(["p"], ["C"], **{ROW_COLUMN: [json.dumps(bad)]})
    with pytest.raises(VerifyRewardError, match="could not be called"):
        VerifyReward(f"http://127.0.0.1:{free_port()}", timeout_s=5)(
            ["p"], ["C"], **{ROW_COLUMN: [json.dumps(ROWS[0])]}
        )
    with pytest.raises(ValueError, match="needs an 'ng_row' column"):
        VerifyReward(url)(["p"], ["C"])


def test_completion_text_reads_strings_and_assistant_messages() -> None:
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "tool", "content": "x"}]) == "a"
    with pytest.raises(TypeError):
        completion_text(3)


def _why_no_trl() -> str | None:
    for name in ("trl", "datasets", "torch", "transformers"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed (pip install -e '.[cpu,trl]')"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_why_no_trl() is not None, reason=_why_no_trl() or "")
def test_grpo_on_cpu_raises_the_reward(tmp_path: Path) -> None:
    """scripts/train_trl.py end to end: the last quarter's mean reward beats the first quarter's."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/train_trl.py"), "--output-dir", str(tmp_path), "--no-plot"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "rewards.json").read_text())
    assert summary["verify_calls"] == summary["steps"] * summary["generations_per_step"]
    assert summary["last_quarter_mean"] > summary["first_quarter_mean"], summary
    assert proc.returncode == 0
