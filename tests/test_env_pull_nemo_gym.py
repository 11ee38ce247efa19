"""NeMo Gym's own environments pulled by name from the ``nemo-gym`` 0.7.0 wheel (package index),
unchanged, then tested and run end to end with ``gym env test`` and ``gym eval run`` on the
scripted model. Skipped, saying why, when pip cannot reach the package index; every subprocess
is bounded by a timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.testing import gym_project
from nemo_gym.testing.package_index import layered_python

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
@pytest.mark.usefixtures("nemo_gym_wheel")
def test_three_pulled_nemo_gym_environments_run_with_gym_eval_run(tmp_path: Path) -> None:
    project = gym_project(tmp_path)
    for name, config, rows, extra in CASES:
        folder = tmp_path / "resources_servers" / name
        pulled = project.gym("env", "pull", f"{name}==0.7.0", f"+dir={folder}")
        assert pulled.returncode == 0, pulled.stderr
        assert json.loads((folder / ".nemo_gym_source.json").read_text())["version"] == "0.7.0"
        out = tmp_path / f"{name}.jsonl"
        run = project.gym(
            "eval", "run", f"+config_paths=[resources_servers/{name}/configs/{config},{SCRIPTED}]",
            f"+input_jsonl_fpath=resources_servers/{name}/data/{rows}", f"+output_jsonl_fpath={out}", "+limit=2",
            *extra,
        )  # fmt: skip
        assert run.returncode == 0, (name, run.stdout[-2000:], run.stderr[-2000:])
        results = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(results) == 2, name
        assert all(isinstance(r["reward"], int | float) and r["response"]["output"] for r in results), name
    single = [
        json.loads(line) for line in (tmp_path / "example_single_tool_call.jsonl").read_text().splitlines()
    ]
    assert all(r["reward"] == 1.0 for r in single)


# What a user's clone holds besides nemo_gym/: the bundled folders, the lint and test settings.
FRESH_PROJECT = (
    "resources_servers",
    "responses_api_agents",
    "responses_api_models",
    "benchmarks",
    "conftest.py",
    "pyproject.toml",
)


# The scripted model's turns for each folder: call the first tool then answer, or just answer.
FOUR = {
    "math_with_code": [],
    "example_tool_call_multireward": [],
    "polymath": [
        "++policy_model.responses_api_models.scripted_model.scripts=[{turns: [{text: 'The answer is 4'}]}]"
    ],
    "wordle": [
        "++policy_model.responses_api_models.scripted_model.scripts="
        "[{turns: [{call_tool: submit_guess, arguments: {guess: crane}}, {text: done}]}]"
    ],
}


@pytest.mark.slow
@pytest.mark.usefixtures("nemo_gym_wheel")
def test_four_nemo_gym_folders_pull_test_and_run_in_a_fresh_project(tmp_path: Path) -> None:
    """The issue's four folders, as a user gets them: pulled into a fresh project, tested with
    ``gym env test`` (their ``from app import`` tests), run with ``gym eval run``; the clash
    with the bundled math_with_judge is named before anything is written; wordle's data step
    is said; the project's lint and test collection leave the pulled folders out."""
    fresh = gym_project(tmp_path / "project", FRESH_PROJECT, python=layered_python(tmp_path / "venv"))
    project = fresh.root
    refused = fresh.pull("polymath==0.7.0", timeout=600)
    assert refused.returncode == 1
    assert "LibraryJudgeMathResourcesServer" in refused.stderr and "+replace_bundled=true" in refused.stderr
    assert not (project / "resources_servers" / "polymath").exists()

    for name in FOUR:
        extra = ["+replace_bundled=true"] if name == "polymath" else []
        pulled = fresh.pull(f"{name}==0.7.0", *extra, timeout=600)
        assert pulled.returncode == 0, (name, pulled.stdout, pulled.stderr)
        assert f"gym env test resources_servers/{name}" in pulled.stdout and "gym eval run" in pulled.stdout
        if name == "wordle":
            assert "also pulled" in pulled.stdout and "resources_servers/gymnasium" in pulled.stdout
            assert "prepare its data: python resources_servers/wordle/generate_data.py" in pulled.stdout
        if name == "polymath":
            assert "replaced the project's own: resources_servers/math_with_judge" in pulled.stdout
    record = json.loads((project / "resources_servers" / "gymnasium" / ".nemo_gym_source.json").read_text())
    assert record["pulled_for"] == "resources_servers/wordle" and record["version"] == "0.7.0"

    for name in FOUR:
        tested = fresh.gym("env", "test", name, timeout=600)
        assert tested.returncode == 0, (name, tested.stdout[-3000:], tested.stderr[-2000:])
        assert f"[{name}] ok" in tested.stdout

    # The data step generate_data.py would download the word lists; a small list stands in.
    (project / "resources_servers" / "wordle" / "data" / "guesses.txt").write_text(
        "\n".join(["crane", "bogey", "chump", "virus", "ovate", "booby"]) + "\n"
    )
    for name, extra in FOUR.items():
        out = tmp_path / f"{name}.jsonl"
        run = fresh.gym(
            "eval", "run", f"+config_paths=[resources_servers/{name}/configs/{name}.yaml,{SCRIPTED}]",
            f"+input_jsonl_fpath=resources_servers/{name}/data/example.jsonl", f"+output_jsonl_fpath={out}",
            "+limit=2", "head_server.port=0", *extra, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, (name, run.stdout[-2000:], run.stderr[-2000:])
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == 2 and all(isinstance(r["reward"], int | float) for r in rows), name

    # The project's own lint and test collection leave the pulled folders out.
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."], cwd=project, capture_output=True, text=True, timeout=120
    )
    assert lint.returncode == 0, lint.stdout[-2000:]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "resources_servers"],
        cwd=project, env=fresh.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert collected.returncode == 0, collected.stdout[-2000:]
    for name in (*FOUR, "gymnasium", "math_with_judge"):
        assert f"resources_servers/{name}/" not in collected.stdout, name
    assert "resources_servers/mcqa/" in collected.stdout
