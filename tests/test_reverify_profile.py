"""ng_reverify_rollouts and ng_reward_profile on rollouts collected from a real stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from nemo_gym.reward_profile import ng_reward_profile, profile_rows
from nemo_gym.testing import collect_with_stack, read_jsonl
from nemo_gym.tools.reverify import ng_reverify_rollouts

ENV_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
EXAMPLES = "resources_servers/example_single_tool_call/data/example.jsonl"
AGENT = "example_single_tool_call_simple_agent"
# Oslo gets an answer without the tool (reward 0); every other city, the tool then an answer (1).
POLICY = """
policy_model:
  responses_api_models:
    scripted_model:
      entrypoint: app.py
      scripts:
        - match: Oslo
          turns: [{text: "No idea, sorry."}]
        - turns: [{call_tool: first}, {text: "Here is what I found: {tool_output}"}]
"""


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten rollouts (five rows, two repeats) collected through the agent, environment and model."""
    folder = tmp_path_factory.mktemp("rollouts")
    policy = folder / "policy.yaml"
    policy.write_text(POLICY)
    output = folder / "rollouts.jsonl"
    summary, rows = collect_with_stack(
        [ENV_CONFIG, str(policy)],
        agent_name=AGENT,
        input_jsonl_fpath=EXAMPLES,
        output_jsonl_fpath=output,
        num_repeats=2,
    )
    assert len(rows) == 10
    assert sorted(row["reward"] for row in rows) == [0.0] * 2 + [1.0] * 8
    return output


def run(entry: Any, args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        entry(args)
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def test_reverify_with_the_same_environment_changes_nothing(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "same.jsonl"
    code, out, err = run(
        ng_reverify_rollouts,
        [f"+config_paths=[{ENV_CONFIG}]", f"+input_jsonl_fpath={rollouts}", f"+output_jsonl_fpath={output}"],
        capsys,
    )
    assert code == 0, out + err
    assert "re-verified 10 rollouts: 0 reward(s) changed, 10 unchanged, 0 verify failure(s)" in out
    assert "mean reward: 0.8000 recorded -> 0.8000 now" in out
    rows = read_jsonl(output)
    assert [r["reward"] for r in rows] == [r["reward"] for r in read_jsonl(rollouts)]
    assert all(r["_ng_previous_reward"] == r["reward"] for r in rows)


def test_reverify_reports_what_a_changed_environment_scores_differently(
    rollouts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    always = "++example_single_tool_call.resources_servers.example_single_tool_call.always_reward=true"
    code, out, err = run(
        ng_reverify_rollouts,
        [f"+config_paths=[{ENV_CONFIG}]", f"+input_jsonl_fpath={rollouts}", always],
        capsys,
    )
    assert code == 0, out + err
    assert "2 reward(s) changed, 8 unchanged" in out and "0.8000 recorded -> 1.0000 now" in out
    assert out.count(": 0.0 -> 1.0") == 2
    default_output = rollouts.with_suffix(".reverified.jsonl")
    changed = [r for r in read_jsonl(default_output) if r["_ng_previous_reward"] != r["reward"]]
    assert len(changed) == 2 and all("Oslo" in json.dumps(r["responses_create_params"]) for r in changed)


def test_reverify_names_bad_input(rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(rollouts.read_bytes().splitlines()[0] + b"\n{not json\n")
    code, _, err = run(
        ng_reverify_rollouts, [f"+config_paths=[{ENV_CONFIG}]", f"+input_jsonl_fpath={bad}"], capsys
    )
    assert code == 2 and f"{bad}:2: not valid JSON" in err
    other_agent = tmp_path / "other.jsonl"
    row = read_jsonl(rollouts)[0]
    other_agent.write_bytes(
        orjson.dumps({**row, "agent_ref": {"type": "responses_api_agents", "name": "nope"}})
    )
    code, _, err = run(
        ng_reverify_rollouts, [f"+config_paths=[{ENV_CONFIG}]", f"+input_jsonl_fpath={other_agent}"], capsys
    )
    assert code == 2 and "agent 'nope' is not in the config" in err and AGENT in err


def test_reward_profile_of_collected_rollouts(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "profile.json"
    code, out, err = run(
        ng_reward_profile, [f"+input_jsonl_fpath={rollouts}", f"+output_json_fpath={output}"], capsys
    )
    assert code == 0, err
    table = out.splitlines()
    assert table[0].split()[:4] == ["TASK", "AGENT", "N", "PASS"]
    # Hardest first: the Oslo task, never solved.
    assert table[1].split()[:7] == ["0", AGENT, "2", "0.000", "0.000", "0.0000", "never"]
    assert "5 tasks, 10 rollouts: mean reward 0.800, mean pass rate 0.800" in out
    assert "always solved 4, never solved 1, mixed 0" in out
    profile = json.loads(output.read_text())
    assert profile["never_solved"] == [{"task_index": 0, "agent": AGENT}]
    assert len(profile["always_solved"]) == 4 and profile["summary"]["rollouts"] == 10


def test_profile_variance_pass_rate_and_skipped_rows() -> None:
    rows = [
        {"_ng_task_index": 0, "reward": 1.0},
        {"_ng_task_index": 0, "reward": 0.0},
        {"_ng_task_index": 0, "reward": 0.5},
        {"_ng_task_index": 0, "reward": 1.0},
        {"_ng_task_index": 1, "reward": 0.25},
        {"_ng_task_index": 1, "reward": None},
    ]
    profile = profile_rows(rows, pass_threshold=0.5)
    first, second = profile.tasks
    assert first.rollouts == 4 and first.pass_rate == 0.75 and first.mean_reward == 0.625
    assert first.reward_variance == pytest.approx(0.171875) and first.solved == "mixed"
    assert second.solved == "never" and profile.rows_skipped == 1
    assert profile.as_dict()["summary"]["mixed"] == 1


def test_profile_refuses_what_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"reward": null}\n')
    code, out, _ = run(ng_reward_profile, [f"+input_jsonl_fpath={empty}"], capsys)
    assert code == 1 and "no rows with a numeric reward" in out
    code, _, err = run(ng_reward_profile, [f"+input_jsonl_fpath={tmp_path / 'missing.jsonl'}"], capsys)
    assert code == 2 and "must name an existing rollouts JSONL file" in err


def test_reverify_on_a_running_stack(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nemo_gym.testing import running_stack

    with running_stack(
        [ENV_CONFIG, "responses_api_models/scripted_model/configs/scripted_model.yaml"]
    ) as handle:
        code, out, err = run(
            ng_reverify_rollouts,
            [
                f"+config_paths=[{ENV_CONFIG}]",
                f"+input_jsonl_fpath={rollouts}",
                f"+output_jsonl_fpath={tmp_path / 'out.jsonl'}",
                "+use_running_stack=true",
                f"head_server.port={handle.head_server_config['port']}",
            ],
            capsys,
        )
    assert code == 0, out + err
    assert "0 reward(s) changed, 10 unchanged" in out


@pytest.mark.slow
def test_reverify_and_profile_run_on_the_main_jobs_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess
    import sys

    output = tmp_path / "main_job_rollouts.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "nemo_gym.tools.main_job", f"+output_jsonl_fpath={output}", "+num_repeats=2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    recorded = read_jsonl(output)
    assert len(recorded) == 10
    code, out, err = run(
        ng_reverify_rollouts, [f"+config_paths=[{ENV_CONFIG}]", f"+input_jsonl_fpath={output}"], capsys
    )
    assert code == 0, out + err
    assert "re-verified 10 rollouts: 0 reward(s) changed, 10 unchanged, 0 verify failure(s)" in out
    code, out, err = run(ng_reward_profile, [f"+input_jsonl_fpath={output}"], capsys)
    assert code == 0, err
    profile = json.loads(output.with_suffix(".reward_profile.json").read_text())
    assert profile["summary"]["tasks"] == 5 and profile["summary"]["rollouts"] == 10
    assert all(task["rollouts"] == 2 for task in profile["tasks"])
