"""ng_prepare_data: line errors, NeMo Gym-compatible statistics, drift, collation, Hugging Face sources."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_gym.launch.config import ConfigError, load_config
from nemo_gym.testing import compat_dir
from nemo_gym.tools.dataset_statistics import metrics_drift
from nemo_gym.tools.prepare_data import (
    AgentDataset,
    DatasetConfig,
    check_dataset,
    ng_prepare_data,
    prepare_data,
    validate_row,
)

COMPAT_ROOT = compat_dir("example_single_tool_call").parent


def row(text: str, **fields: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": [{"role": "user", "content": text}]}, **fields}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_config(tmp_path: Path, datasets: list[dict[str, Any]]) -> Path:
    """An environment config: a resources server, a model and an agent listing ``datasets``."""
    config = {
        "toy": {"resources_servers": {"example_single_tool_call": {"entrypoint": "app.py"}}},
        "policy_model": {"responses_api_models": {"scripted_model": {"entrypoint": "app.py"}}},
        "toy_agent": {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "resources_server": {"type": "resources_servers", "name": "toy"},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                    "datasets": datasets,
                }
            }
        },
    }
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    config = load_config([f"+config_paths=[{tmp_path / 'toy.yaml'}]", *args], cwd=tmp_path)
    return prepare_data(config, out=out), out.getvalue()


@pytest.mark.skipif(not COMPAT_ROOT.exists(), reason="compat corpus not present")
@pytest.mark.parametrize(
    "environment", sorted(p.name for p in COMPAT_ROOT.iterdir() if p.is_dir()) if COMPAT_ROOT.exists() else []
)
def test_statistics_reproduce_nemo_gym_metrics_files(environment: str):
    folder = COMPAT_ROOT / environment
    committed = json.loads((folder / "example_metrics.json").read_text())
    header_keys = (
        "name",
        "type",
        "jsonl_fpath",
        "num_repeats",
        "gitlab_identifier",
        "huggingface_identifier",
        "license",
    )
    config = DatasetConfig.model_validate({k: committed[k] for k in header_keys if k in committed})
    report = check_dataset(AgentDataset("agent", config, folder / "example.jsonl"))
    assert report.errors == []
    assert metrics_drift(committed, report.metrics) == []
    # Exact, not just within tolerance: same keys in the same order, same rounding.
    stats = {k: v for k, v in report.metrics.items() if k in committed and k not in header_keys}
    assert stats == {k: v for k, v in committed.items() if k in stats}
    assert list(stats) == [k for k in committed if k in stats]


def test_validate_row_names_each_field():
    assert validate_row(row("hi")) == []
    assert validate_row({"responses_create_params": {"input": "plain text"}}) == []
    assert validate_row([1]) == ["a row must be a JSON object, got list"]
    assert validate_row({}) == [
        "responses_create_params: field required (a Responses create request with 'input')"
    ]
    bad = {
        "responses_create_params": {
            "input": [{"role": "robot", "content": "x"}, {"role": "user"}, 3, {"foo": 1}],
            "tools": [{"type": "function"}],
            "temperature": "hot",
        },
        "agent_ref": {"name": "a"},
    }
    problems = validate_row(bad)
    assert [p.split(":")[0] for p in problems] == [
        "responses_create_params.input[0].role",
        "responses_create_params.input[1].content",
        "responses_create_params.input[2]",
        "responses_create_params.input[3]",
        "responses_create_params.tools[0].name",
        "responses_create_params.temperature",
        "agent_ref",
    ]


def test_broken_lines_are_named_by_file_and_line_and_nothing_is_written(tmp_path: Path):
    data = write_jsonl(
        tmp_path / "data" / "train.jsonl",
        [row("a"), '{"responses_create_params": {"input": [}', row("b"), {"responses_create_params": {}}],
    )
    write_config(tmp_path, [{"name": "train", "type": "train", "jsonl_fpath": str(data)}])
    code, out = run(tmp_path, f"+output_dirpath={tmp_path / 'out'}", "+mode=train_preparation")
    assert code == 1
    assert f"{data}:2: not valid JSON" in out
    assert f"{data}:4: responses_create_params.input: field required" in out
    assert f"{data}:1" not in out and f"{data}:3" not in out
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "data" / "train_metrics.json").exists()


def test_train_preparation_repeats_stamps_and_writes_metrics(tmp_path: Path):
    train = write_jsonl(tmp_path / "data" / "train.jsonl", [row("one", id=1), row("two", id=2)])
    validation = write_jsonl(tmp_path / "data" / "validation.jsonl", [row("three", topic="x")])
    example = write_jsonl(tmp_path / "data" / "example.jsonl", [row("ex")])
    write_config(
        tmp_path,
        [
            {"name": "train", "type": "train", "jsonl_fpath": str(train), "num_repeats": 3},
            {"name": "validation", "type": "validation", "jsonl_fpath": str(validation)},
            {"name": "example", "type": "example", "jsonl_fpath": str(example)},
        ],
    )
    out_dir = tmp_path / "out"
    code, out = run(tmp_path, f"+output_dirpath={out_dir}", "+mode=train_preparation")
    assert code == 0, out
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "train.jsonl",
        "train_metrics.json",
        "validation.jsonl",
        "validation_metrics.json",
    ]
    rows = [json.loads(line) for line in (out_dir / "train.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [1, 1, 1, 2, 2, 2]
    assert all(r["agent_ref"] == {"type": "responses_api_agents", "name": "toy_agent"} for r in rows)
    metrics = json.loads((out_dir / "train_metrics.json").read_text())
    assert metrics["Number of examples"] == 6 and metrics["id"]["Average"] == 1.5
    # The per-dataset statistics were written next to each dataset, header first.
    sidecar = json.loads((tmp_path / "data" / "train_metrics.json").read_text())
    assert list(sidecar)[:4] == ["name", "type", "jsonl_fpath", "num_repeats"]
    assert sidecar["num_repeats"] == 3 and sidecar["Number of examples"] == 6
    assert not (tmp_path / "data" / "example_metrics.json").exists()  # not in this mode's scope

    code, out = run(tmp_path, f"+output_dirpath={out_dir}", "+mode=example_validation")
    assert code == 0, out
    assert json.loads((tmp_path / "data" / "example_metrics.json").read_text())["Number of examples"] == 1


def test_drifted_statistics_are_reported_old_to_new(tmp_path: Path, capsys):
    data = write_jsonl(tmp_path / "data" / "example.jsonl", [row("a b c", level=1), row("d", level=3)])
    write_config(tmp_path, [{"name": "example", "type": "example", "jsonl_fpath": str(data)}])
    out_dir = tmp_path / "out"
    assert run(tmp_path, f"+output_dirpath={out_dir}", "+mode=example_validation")[0] == 0
    committed_path = tmp_path / "data" / "example_metrics.json"
    committed = committed_path.read_text()

    write_jsonl(data, [row("a b c", level=1), row("d", level=3), row("e f g h i j", level=8)])
    code, out = run(tmp_path, f"+output_dirpath={out_dir}", "+mode=example_validation")
    assert code == 1
    assert f"statistics drifted from {committed_path}" in out
    assert "Number of examples: 2 → 3" in out
    assert "level.Average: 2.0 → 4.0" in out and "level.Max: 3.0 → 8.0" in out
    assert "Json-dumped number of words (proxy for token count).Max:" in out
    assert "Number of tools" not in out  # unchanged statistics are not listed
    assert committed_path.read_text() == committed  # not overwritten unless asked

    # The console command exits non-zero on drift.
    with pytest.raises(SystemExit) as exit_info:
        ng_prepare_data(
            [
                f"+config_paths=[{tmp_path / 'toy.yaml'}]",
                f"+output_dirpath={out_dir}",
                "+mode=example_validation",
            ]
        )
    assert exit_info.value.code == 1
    assert "Number of examples: 2 → 3" in capsys.readouterr().out

    code, out = run(
        tmp_path,
        f"+output_dirpath={out_dir}",
        "+mode=example_validation",
        "+overwrite_metrics_conflicts=true",
    )
    assert code == 0 and "overwritten" in out
    assert json.loads(committed_path.read_text())["Number of examples"] == 3

    # Without an output folder the overwrite is the only write, and the last line says so.
    write_jsonl(data, [row("a b c", level=1), row("d", level=3)])
    code, out = run(tmp_path, "+mode=example_validation", "+overwrite_metrics_conflicts=true")
    assert code == 0 and "(overwritten)" in out and "nothing written" not in out
    assert f"1 dataset(s) valid; updated {committed_path} (no collated files" in out
    assert json.loads(committed_path.read_text())["Number of examples"] == 2


def test_prompt_config_builds_the_input(tmp_path: Path):
    data = write_jsonl(tmp_path / "bench.jsonl", [{"question": "2+2?", "expected_answer": "4"}])
    prompt = tmp_path / "prompt.yaml"
    prompt.write_text("system: Be brief.\nuser: 'Solve: {question}'\n")
    write_config(
        tmp_path,
        [{"name": "bench", "type": "benchmark", "jsonl_fpath": str(data), "prompt_config": str(prompt)}],
    )
    code, out = run(tmp_path, f"+output_dirpath={tmp_path / 'out'}", "+mode=train_preparation")
    assert code == 0, out
    (prepared,) = [
        json.loads(line) for line in (tmp_path / "out" / "benchmark.jsonl").read_text().splitlines()
    ]
    assert prepared["responses_create_params"]["input"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Solve: 2+2?"},
    ]

    write_jsonl(data, [{"expected_answer": "4"}])
    (tmp_path / "bench_metrics.json").unlink()
    code, out = run(tmp_path, f"+output_dirpath={tmp_path / 'out'}", "+mode=train_preparation")
    assert code == 1 and f"{data}:1: prompt_config user template needs field 'question'" in out


def test_bad_dataset_entries_and_arguments_are_config_errors(tmp_path: Path):
    from nemo_gym.launch.config import ConfigError

    write_config(tmp_path, [{"name": "x", "type": "training", "jsonl_fpath": "x.jsonl"}])
    with pytest.raises(ConfigError, match=r"toy_agent.datasets\[0\]: type"):
        run(tmp_path, "+output_dirpath=o", "+mode=train_preparation")
    write_config(tmp_path, [])
    with pytest.raises(ConfigError, match="mode must be one of train_preparation, example_validation"):
        run(tmp_path, "+output_dirpath=o", "+mode=train")


# ---- Hugging Face sources: a pre-populated hub cache, with the hub switched off ----------------
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache_with(tmp_path: Path, repo_id: str, files: dict[str, str]) -> Path:
    """A Hugging Face cache laid out as huggingface_hub writes it (refs/main → snapshot)."""
    cache = tmp_path / "hf_cache"
    repo = cache / f"datasets--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    for name, text in files.items():
        target = repo / "snapshots" / COMMIT / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return cache


def run_offline(tmp_path: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    argv = [f"+config_paths=[{tmp_path / 'toy.yaml'}]", f"+output_dirpath={tmp_path / 'out'}", *args]
    code = f"from nemo_gym.tools.prepare_data import ng_prepare_data; ng_prepare_data({argv!r})"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


def test_huggingface_source_downloads_through_the_hub_client(tmp_path: Path):
    rows = "".join(json.dumps(row(f"q{i}", answer=i)) + "\n" for i in range(4))
    cache = hub_cache_with(tmp_path, "acme/toy-math", {"data/train.jsonl": rows})
    write_config(
        tmp_path,
        [
            {
                "name": "train",
                "type": "train",
                "jsonl_fpath": "data/train.jsonl",
                "source": {
                    "type": "huggingface",
                    "repo_id": "acme/toy-math",
                    "artifact_fpath": "data/train.jsonl",
                },
            },
            {
                "name": "validation",
                "type": "validation",
                "jsonl_fpath": "data/validation.jsonl",
                "huggingface_identifier": {"repo_id": "acme/not-cached"},
            },
        ],
    )
    missing = run_offline(tmp_path, cache, "+mode=train_preparation")
    assert missing.returncode == 1
    assert "data/train.jsonl does not exist; it comes from Hugging Face repo acme/toy-math" in missing.stdout
    assert "+should_download=true" in missing.stdout

    done = run_offline(tmp_path, cache, "+mode=train_preparation", "+should_download=true")
    assert done.returncode == 1, done.stdout + done.stderr
    assert (tmp_path / "data" / "train.jsonl").read_text() == rows
    assert "cannot download acme/not-cached (offline?)" in done.stdout
    assert "validation.jsonl is not in the local Hugging Face cache" in done.stdout

    config = yaml.safe_load((tmp_path / "toy.yaml").read_text())
    config["toy_agent"]["responses_api_agents"]["simple_agent"]["datasets"].pop()
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(config))
    done = run_offline(tmp_path, cache, "+mode=train_preparation", "+should_download=true")
    assert done.returncode == 0, done.stdout + done.stderr
    prepared = (tmp_path / "out" / "train.jsonl").read_text().splitlines()
    assert [json.loads(line)["answer"] for line in prepared] == [0, 1, 2, 3]


def test_example_validation_needs_no_output_folder_and_writes_nothing(tmp_path: Path):
    data = write_jsonl(tmp_path / "data" / "example.jsonl", [row("a b c", level=1), row("d", level=3)])
    write_config(tmp_path, [{"name": "example", "type": "example", "jsonl_fpath": str(data)}])
    before = sorted(p for p in tmp_path.rglob("*"))
    code, out = run(tmp_path, "+mode=example_validation")
    assert code == 0, out
    assert "1 dataset(s) valid; nothing written (no collated files without +output_dirpath)" in out
    assert sorted(p for p in tmp_path.rglob("*")) == before
    # A bad line still fails it, naming the line; still nothing written.
    data.write_text(data.read_text() + "{not json\n")
    code, out = run(tmp_path, "+mode=example_validation")
    assert code == 1 and f"{data}:3:" in out
    assert sorted(p for p in tmp_path.rglob("*")) == before
    # train_preparation still needs the folder it writes to.
    with pytest.raises(ConfigError, match=r"\+output_dirpath is required"):
        run(tmp_path, "+mode=train_preparation")
