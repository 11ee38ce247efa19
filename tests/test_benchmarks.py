"""Benchmarks: every shipped benchmark parses, prepares offline to its frozen statistics, and runs
end to end on a few rows with the scripted model (right answers score 1.0, a wrong one 0.0)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import io
import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_gym.launch.config import ConfigError, project_root
from nemo_gym.testing import SCRIPTED_MODEL_CONFIG
from nemo_gym.tools.benchmarks import (
    Benchmark,
    format_benchmark_table,
    list_benchmarks,
    load_benchmark,
    ng_list_benchmarks,
    prepare_benchmark,
)

SHIPPED = {
    "math_arithmetic": "math_with_judge",
    "mcqa_procedural": "mcqa",
    "instruction_following_procedural": "instruction_following",
    "code_gen_procedural": "code_gen",
    "reasoning_gym_mix": "reasoning_gym",
}


def test_shipped_benchmarks_parse_and_list(capsys):
    benchmarks = {b.name: b for b in list_benchmarks(cwd=project_root())}
    assert {name: benchmarks[name].environment for name in SHIPPED} == SHIPPED
    for b in benchmarks.values():
        assert b.dataset.type == "benchmark" and b.dataset.num_repeats >= 1 and b.description
        assert (b.folder / "prepare.py").is_file() and (b.folder / "README.md").is_file()
        assert b.metrics_path.is_file(), f"{b.name}: commit {b.metrics_path} to freeze the data"
        assert b.agent == f"{b.environment}_simple_agent"
        if b.dataset.prompt_config:
            assert (project_root() / b.dataset.prompt_config).is_file()
    table = format_benchmark_table(list(benchmarks.values()))
    assert table.splitlines()[0].split() == ["NAME", "ENVIRONMENT", "ROWS", "REPEATS", "DESCRIPTION"]
    with pytest.raises(SystemExit) as exit_info:
        ng_list_benchmarks([])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    for name, environment in SHIPPED.items():
        assert re.search(rf"^{name}\s+{environment}\b", printed, re.MULTILINE), printed


def test_unknown_benchmark_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"no benchmark named 'nope'; known benchmarks: .*math_arithmetic"):
        load_benchmark("nope")


def test_regenerated_rows_that_drift_from_the_frozen_statistics_fail(tmp_path: Path):
    source = load_benchmark("math_arithmetic", cwd=project_root())
    copy = tmp_path / "benchmarks" / "math_arithmetic"
    shutil.copytree(source.folder, copy, ignore=shutil.ignore_patterns("*.jsonl", "__pycache__"))
    metrics = json.loads((copy / "data" / "math_arithmetic_metrics.json").read_text())
    metrics["Number of examples"] = 796
    metrics["problem_family"]["unique_count"] = 6
    (copy / "data" / "math_arithmetic_metrics.json").write_text(json.dumps(metrics))

    benchmark = load_benchmark("math_arithmetic", cwd=tmp_path)
    assert benchmark.folder == copy.resolve()
    out = io.StringIO()
    assert prepare_benchmark(benchmark, out=out) == 1
    text = out.getvalue()
    assert "wrote 200 rows" in text and "differ from the frozen benchmark" in text
    assert "Number of examples: 796 → 800" in text and "problem_family.unique_count: 6 → 7" in text


# ---- end to end with the scripted model ----------------------------------------------------------
Answer = Callable[[dict[str, Any]], str]


def _prepare_module(benchmark: Benchmark) -> Any:
    spec = importlib.util.spec_from_file_location(f"_bench_{benchmark.name}", benchmark.folder / "prepare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def _boxed_math(row: dict[str, Any]) -> str:
    answer = row["expected_answer"].removeprefix("\\(").removesuffix("\\)")
    return f"Working it through gives \\boxed{{{answer}}}."


def _code_solutions(benchmark: Benchmark) -> dict[str, str]:
    module = _prepare_module(benchmark)
    rows = module.build_rows()
    return {
        row["hash_id"]: task.solution for row, (task, _, _) in zip(rows, module.build_tasks(), strict=True)
    }


def answers_for(benchmark: Benchmark) -> tuple[Answer, Answer]:
    """(right answer, wrong answer) builders for one benchmark's rows."""
    if benchmark.name == "math_arithmetic":
        return _boxed_math, lambda row: "I think it is \\boxed{123456789}."
    if benchmark.name == "mcqa_procedural":
        other = {"A": "B", "B": "C", "C": "D", "D": "A"}
        return (
            lambda row: f"The answer is \\boxed{{{row['expected_answer']}}}",
            lambda row: f"The answer is \\boxed{{{other[row['expected_answer']]}}}",
        )
    if benchmark.name == "instruction_following_procedural":
        return _prepare_module(benchmark).example_response, lambda row: "A short reply."
    if benchmark.name == "code_gen_procedural":
        solutions = _code_solutions(benchmark)
        return (
            lambda row: f"Here is the program.\n```python\n{solutions[row['hash_id']]}```",
            lambda row: "```python\nprint(0)\n```",
        )
    if benchmark.name == "reasoning_gym_mix":
        return lambda row: row["answer"], lambda row: "I cannot tell."
    raise AssertionError(f"no answer builder for benchmark {benchmark.name}")


def pick_rows(
    benchmark: Benchmark, rows: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Three rows to answer right and one to answer wrong (one the wrong answer surely fails)."""
    if benchmark.name == "instruction_following_procedural":
        wrong = next(r for r in rows[3:] if "keywords:existence" in r["instruction_id_list"])
        return rows[:3], wrong
    return rows[:3], rows[3]


def last_user_text(row: dict[str, Any], prompt: Any) -> str:
    items = prompt.input_items(row) if prompt is not None else row["responses_create_params"]["input"]
    return next(item["content"] for item in reversed(items) if item["role"] == "user")


def scripted_policy(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """A policy_model block answering each prompt (matched literally) with its text."""
    scripts = [
        # Texts are format templates for the scripted model: double the literal braces.
        {"match": re.escape(prompt), "turns": [{"text": text.replace("{", "{{").replace("}", "}}")}]}
        for prompt, text in pairs
    ]
    scripts.append({"match": None, "turns": [{"text": "No script for this prompt."}]})
    return {"policy_model": {"responses_api_models": {"scripted_model": {"scripts": scripts}}}}


def missing_requirement(benchmark: Benchmark) -> str | None:
    environment = project_root() / "resources_servers" / benchmark.environment / "app.py"
    if not environment.is_file() or not benchmark.environment_available():
        return f"the {benchmark.environment} environment (resources_servers/{benchmark.environment}) is not in this checkout yet"
    if benchmark.name == "reasoning_gym_mix" and importlib.util.find_spec("reasoning_gym") is None:
        return "the reasoning_gym package is not installed"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_benchmark_prepares_offline_and_runs_end_to_end(name: str, tmp_path: Path):
    from nemo_gym.collection.collection_io import PromptConfig
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.testing import running_stack

    benchmark = load_benchmark(name, cwd=project_root())
    reason = missing_requirement(benchmark)
    if reason:
        pytest.skip(f"{name}: {reason}")

    # Prepare offline into a scratch file: same rows as the frozen benchmark (statistics match).
    data = tmp_path / f"{name}.jsonl"
    out = io.StringIO()
    assert prepare_benchmark(benchmark, output=data, out=out) == 0, out.getvalue()
    rows = [json.loads(line) for line in data.read_text().splitlines()]

    right, wrong = answers_for(benchmark)
    good_rows, bad_row = pick_rows(benchmark, rows)
    prompt = (
        PromptConfig.load(project_root() / benchmark.dataset.prompt_config)
        if benchmark.dataset.prompt_config
        else None
    )
    pairs = [(last_user_text(r, prompt), right(r)) for r in good_rows] + [
        (last_user_text(bad_row, prompt), wrong(bad_row))
    ]
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(scripted_policy(pairs)))
    selected = tmp_path / "selected.jsonl"
    selected.write_text("".join(json.dumps(r) + "\n" for r in [*good_rows, bad_row]))

    output = tmp_path / "rollouts.jsonl"
    collection = {
        "agent_name": benchmark.agent,
        "input_jsonl_fpath": str(selected),
        "output_jsonl_fpath": str(output),
        "num_repeats": 2,
    }
    if benchmark.dataset.prompt_config:
        collection["prompt_config"] = str(project_root() / benchmark.dataset.prompt_config)
    configs = [*benchmark.config_paths(), SCRIPTED_MODEL_CONFIG, str(policy)]
    with running_stack(configs) as handle:
        summary = asyncio.run(
            RolloutCollectionHelper().run_from_config(
                {**collection, "head_server": handle.head_server_config}, verbose=False
            )
        )
    assert (summary.succeeded, summary.failed) == (8, 0), summary
    rewards: dict[int, list[float]] = {}
    for rollout in (json.loads(line) for line in output.read_text().splitlines()):
        rewards.setdefault(rollout["_ng_task_index"], []).append(rollout["reward"])
    assert rewards == {0: [1.0, 1.0], 1: [1.0, 1.0], 2: [1.0, 1.0], 3: [0.0, 0.0]}, rewards
    metrics = summary.metrics[0]["agent_metrics"]
    assert metrics["mean/reward"] == pytest.approx(0.75)


def test_instruction_ids_are_known_to_the_environment():
    if importlib.util.find_spec("resources_servers.instruction_following.checks") is None:
        pytest.skip("the instruction_following environment is not in this checkout yet")
    checks = importlib.import_module("resources_servers.instruction_following.checks")
    module = _prepare_module(load_benchmark("instruction_following_procedural", cwd=project_root()))
    assert set(module.INSTRUCTIONS) <= set(checks.REGISTRY)
