"""Three of NeMo Gym's own environments pulled by name from the ``nemo-gym`` 0.7.0 wheel (package
index) and run end to end with ``gym eval run`` on the scripted model, unchanged. Skipped,
saying why, when pip cannot reach the package index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.launch.config import project_root
from nemo_gym.tools.env_pull import PullError, fetch_wheel

GYM = [sys.executable, "-c", "from nemo_gym.tools.gym_cli import main; main()"]
SCRIPTED = "responses_api_models/scripted_model/configs/scripted_model.yaml"
# (environment, its config, its rows, extra overrides): the scripted model's default script calls
# the first tool then answers; format_verification offers no tool, so it answers in one turn.
CASES = [
    ("example_single_tool_call", "example_single_tool_call.yaml", "example.jsonl", []),
    ("example_multi_step", "example_multi_step.yaml", "example.jsonl", []),
    (
        "format_verification",
        "freeform_formatting.yaml",
        "ds2_freeform_formatting_example.jsonl",
        ["++policy_model.responses_api_models.scripted_model.scripts=[{turns: [{text: '1. \"A\": x'}]}]"],
    ),
]


@pytest.mark.slow
def test_three_pulled_nemo_gym_environments_run_with_gym_eval_run(tmp_path: Path) -> None:
    try:
        fetch_wheel("0.7.0")
    except PullError as exc:
        pytest.skip(f"cannot fetch the nemo-gym 0.7.0 wheel (pip cannot reach the package index?): {exc}")
    env = dict(os.environ, PYTHONPATH=str(project_root()))
    for name, config, rows, extra in CASES:
        folder = tmp_path / "resources_servers" / name
        pulled = subprocess.run(
            [*GYM, "env", "pull", f"{name}==0.7.0", f"+dir={folder}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert pulled.returncode == 0, pulled.stderr
        assert json.loads((folder / ".nemo_gym_source.json").read_text())["version"] == "0.7.0"
        out = tmp_path / f"{name}.jsonl"
        run = subprocess.run(
            [*GYM, "eval", "run", f"+config_paths=[resources_servers/{name}/configs/{config},{SCRIPTED}]",
             f"+input_jsonl_fpath=resources_servers/{name}/data/{rows}", f"+output_jsonl_fpath={out}", "+limit=2", *extra],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, (name, run.stdout[-2000:], run.stderr[-2000:])
        results = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(results) == 2, name
        assert all(isinstance(r["reward"], int | float) and r["response"]["output"] for r in results), name
    single = [
        json.loads(line) for line in (tmp_path / "example_single_tool_call.jsonl").read_text().splitlines()
    ]
    assert all(r["reward"] == 1.0 for r in single)
