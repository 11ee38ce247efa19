"""NeMo Gym 0.7.0's offline commands on this repository's example data: ``gym dataset render``,
``gym env schema``, ``gym env packages``, ``gym env validate``, ``gym search``, ``gym list
resources-servers``, ``gym dev test`` and ``gym eval compare``; each with a bad input named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.tools.gym_cli import main as gym_main

ROOT = Path(__file__).resolve().parents[1]
MULTI_STEP = "resources_servers/example_multi_step/configs/example_multi_step.yaml"
SCRIPTED = "responses_api_models/scripted_model/configs/scripted_model.yaml"


def gym(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        gym_main(args)
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


def test_dataset_render(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "raw.jsonl"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/math_arithmetic/prepare.py"), "--output", str(raw)],
        check=True,
        capture_output=True,
    )
    rendered = tmp_path / "out" / "rendered.jsonl"
    prompt = ROOT / "benchmarks/math_arithmetic/prompt.yaml"
    code, out, err = gym(
        ["dataset", "render", "-i", str(raw), "--prompt-config", str(prompt), "-o", str(rendered)], capsys
    )
    assert code == 0, err
    rows = [json.loads(line) for line in rendered.read_text().splitlines()]
    first = json.loads(raw.read_text().splitlines()[0])
    assert len(rows) == 200 and rows[0]["prompt_config_used"] == str(prompt)
    [message] = rows[0]["responses_create_params"]["input"]
    assert (
        message["role"] == "user"
        and message["content"].endswith(first["question"])
        and "\\boxed{}" in message["content"]
    )
    # A row that already has an input is named by file and line; nothing is written.
    example = ROOT / "resources_servers/mcqa/data/example.jsonl"
    code, _, err = gym(
        [
            "dataset",
            "render",
            "-i",
            str(example),
            "--prompt-config",
            str(prompt),
            "-o",
            str(tmp_path / "x.jsonl"),
        ],
        capsys,
    )
    assert code == 2 and f"{example}:1: the row already has responses_create_params.input" in err
    assert not (tmp_path / "x.jsonl").exists()


def test_env_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = gym(["env", "schema", "--resources-server", "example_multi_step"], capsys)
    schema = json.loads(out)
    assert code == 0 and schema["properties"]["expected_synonym_values"]["items"] == {"type": "integer"}
    assert set(schema["required"]) >= {"minefield_label", "expected_synonyms"}
    code, out, _ = gym(["env", "schema", "mcqa"], capsys)
    assert code == 1 and "ships no task_data.py" in out
    code, _, err = gym(["env", "schema", "no_such_server"], capsys)
    assert code == 2 and "no_such_server" in err


def test_env_packages(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = gym(["env", "packages", "--resources-server", "math_with_judge", "--json"], capsys)
    packages = {p["name"]: p["version"] for p in json.loads(out)}
    from importlib.metadata import version

    assert code == 0 and packages["math-verify"] == version("math-verify")


def test_env_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = gym(["env", "validate", "--config", f"{MULTI_STEP},{SCRIPTED}"], capsys)
    assert code == 0, err
    assert "valid: 3 server(s), 1 dataset file(s) checked" in out
    # A dataset row that breaks the server's task_data.py schema: named by file and line.
    bad = tmp_path / "bad.jsonl"
    lines = (ROOT / "resources_servers/example_multi_step/data/example.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["expected_synonym_values"] = "not a list"
    bad.write_text(lines[0] + "\n" + json.dumps(row) + "\n")
    override = f"++example_multi_step_simple_agent.responses_api_agents.simple_agent.datasets=[{{name: e, type: example, jsonl_fpath: {bad}}}]"
    code, out, _ = gym(["env", "validate", "--config", f"{MULTI_STEP},{SCRIPTED}", override], capsys)
    assert code == 1 and f"{bad}:2: does not match" in out and "expected_synonym_values" in out
    # A ref to a server the config does not have fails before anything else.
    code, _, err = gym(["env", "validate", "--config", MULTI_STEP], capsys)
    assert code == 2 and "server ref 'policy_model'" in err


def test_search_and_list_resources_servers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = gym(["search", "math"], capsys)
    assert code == 0 and "math_with_judge" in out and "mcqa" not in out
    code, out, _ = gym(["search", "agents", "codex", "--json"], capsys)
    assert code == 0 and "codex_agent" in {a["name"] for a in json.loads(out)}
    code, out, _ = gym(["search", "nothing-at-all-matches-this"], capsys)
    assert code == 1 and "no environments match" in out
    code, out, _ = gym(["list", "resources-servers", "mcqa", "--json"], capsys)
    assert code == 0 and json.loads(out)["domain"] == "knowledge"
    code, _, err = gym(["list", "resources-servers", "mcqq"], capsys)
    assert code == 2 and "did you mean 'mcqa'" in err


def test_dev_test_runs_pytest(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = gym(
        ["dev", "test", "tests/test_import_graph.py", "-k", "test_layer_rule_sees_an_upward_import"], capsys
    )
    assert code == 0
    code, _, err = gym(["dev", "test", "tests/no_such_file.py"], capsys)
    assert code == 2 and "no_such_file.py" in err


def test_eval_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        json.loads(line)
        for line in (ROOT / "tests/compat/nemo_gym/math_with_judge/example_rollouts.jsonl").open()
    ]
    base, new = tmp_path / "base.jsonl", tmp_path / "new" / "new.jsonl"
    new.parent.mkdir()
    indexed = [{**row, "_ng_task_index": i, "_ng_rollout_index": 0} for i, row in enumerate(rows)]
    base.write_text("".join(json.dumps(r) + "\n" for r in indexed))
    passed = [i for i, r in enumerate(indexed) if r["reward"] == 1.0]
    failed = [i for i, r in enumerate(indexed) if r["reward"] == 0.0]
    flipped = {passed[0]: 0.0, failed[0]: 1.0, failed[1]: 1.0}
    new.write_text(
        "".join(
            json.dumps({**r, "reward": flipped.get(i, r["reward"])}) + "\n" for i, r in enumerate(indexed)
        )
    )
    code, out, err = gym(["eval", "compare", "--baseline", str(base), "--candidates", str(new)], capsys)
    assert code == 0, err
    report = json.loads((new.parent / "compare_report.json").read_text())
    [block] = report["comparisons"]
    [flips] = block["flips"]
    assert flips["mode"] == "binary" and (
        flips["fail_to_pass_count"],
        flips["pass_to_fail_count"],
        flips["net"],
    ) == (2, 1, 1)
    assert flips["flips"][0] == {**flips["flips"][0], "task_index": passed[0], "direction": "pass_to_fail"}
    mean = next(row for row in block["metrics"] if row["metric"] == "mean/reward")
    assert mean["candidates"][0]["delta"] == pytest.approx(1 / len(rows))
    assert "| **mean/reward** |" in (new.parent / "compare_report.md").read_text()
    # Different agent names per side, and a candidate whose metrics file is read instead of computed.
    renamed = tmp_path / "renamed.jsonl"
    agent = {"type": "responses_api_agents", "name": "new_agent"}
    renamed.write_text(
        "".join(
            json.dumps({**json.loads(line), "agent_ref": agent}) + "\n"
            for line in new.read_text().splitlines()
        )
    )
    metrics_file = tmp_path / "renamed_aggregate_metrics.json"
    metrics_file.write_text(
        json.dumps(
            [
                {
                    "agent_ref": agent,
                    "agent_metrics": {"mean/reward": 0.9},
                    "key_metrics": {},
                    "group_level_metrics": [],
                }
            ]
        )
    )
    args = [
        "eval",
        "compare",
        "--baseline",
        str(base),
        "--candidates",
        str(renamed),
        "-o",
        str(tmp_path / "rep"),
    ]
    code, _, err = gym(args, capsys)
    assert code == 2 and "share no agent" in err
    code, _, err = gym([*args, "--candidate-agents", "new_agent", "--report-format", "json"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "rep" / "compare_report.json").read_text())
    assert (
        report["candidates"][0]["metrics_source"] == "file"
        and report["baseline"]["metrics_source"] == "computed"
    )
    [block] = report["comparisons"]
    assert block["candidate_agents"] == ["new_agent"] and block["flips"][0]["net"] == 1
    mean = next(row for row in block["metrics"] if row["metric"] == "mean/reward")
    assert mean["candidates"][0]["value"] == 0.9 and not (tmp_path / "rep" / "compare_report.md").exists()
    code, _, err = gym(
        ["eval", "compare", "--baseline", str(base), "--candidates", str(tmp_path / "nope.jsonl")], capsys
    )
    assert code == 2 and "+candidate_rollouts_jsonl_fpaths[0]: no such file" in err


def _indexed_rollouts(env: str, target: Path) -> list[dict]:
    rows = [
        json.loads(line) for line in (ROOT / f"tests/compat/nemo_gym/{env}/example_rollouts.jsonl").open()
    ]
    agent = {"type": "responses_api_agents", "name": f"{env}_simple_agent"}
    out = [{**r, "_ng_task_index": i, "_ng_rollout_index": 0, "agent_ref": agent} for i, r in enumerate(rows)]
    target.write_text("".join(json.dumps(r) + "\n" for r in out))
    return out


def test_eval_export_atif(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import hashlib

    rollouts = tmp_path / "rollouts.jsonl"
    rows = _indexed_rollouts("example_multi_step", rollouts)
    # One model call with token IDs: its step carries them as metrics.
    rows[1]["response"]["output"][0].update(
        prompt_token_ids=[1, 2, 3], generation_token_ids=[4, 5], generation_log_probs=[-0.1, -0.2]
    )
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out_dir = tmp_path / "atif"
    args = ["eval", "export", "--format", "atif", "--rollouts", str(rollouts), "--output-dir", str(out_dir)]
    code, out, err = gym([*args, "--session-id", "run-1", "--agent-version", "1.10"], capsys)
    assert code == 0, err
    manifest = [json.loads(line) for line in (out_dir / "manifest.jsonl").read_text().splitlines()]
    assert [m["trajectory_path"] for m in manifest] == [f"{i}-0.json" for i in range(5)]
    for entry in manifest:
        data = (out_dir / entry["trajectory_path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["expected_sha256"]
    first = json.loads((out_dir / "0-0.json").read_text())
    assert first["schema_version"] == "ATIF-v1.7" and first["trajectory_id"] == "run-1:0:0"
    assert first["agent"] == {
        "name": "example_multi_step_simple_agent",
        "version": "1.10",
        "model_name": rows[0]["response"]["model"],
    }
    sources = [step["source"] for step in first["steps"]]
    assert sources[:2] == ["system", "user"] and set(sources[2:]) == {"agent"}
    calls = [c for step in first["steps"] for c in step.get("tool_calls", [])]
    function_calls = [item for item in rows[0]["response"]["output"] if item["type"] == "function_call"]
    assert [c["tool_call_id"] for c in calls] == [item["call_id"] for item in function_calls]
    assert first["steps"][2]["observation"]["results"][0]["source_call_id"] == calls[0]["tool_call_id"]
    assert first["steps"][-1]["message"] == rows[0]["response"]["output"][-1]["content"][0]["text"]
    assert first["final_metrics"]["total_steps"] == len(first["steps"])
    assert first["final_metrics"]["total_prompt_tokens"] == rows[0]["response"]["usage"]["input_tokens"]
    second = json.loads((out_dir / "1-0.json").read_text())
    assert second["steps"][2]["metrics"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "logprobs": [-0.1, -0.2],
    }
    # The folder must be new; a bad row is named by line and field, and nothing is written.
    code, _, err = gym([*args, "--session-id", "run-1", "--agent-version", "1"], capsys)
    assert code == 2 and "already exists" in err
    rows[3]["response"]["output"][0]["arguments"] = "[1, 2]"
    del rows[4]["agent_ref"]
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fresh = tmp_path / "again"
    code, _, err = gym(
        [
            "eval",
            "export",
            "--rollouts",
            str(rollouts),
            "--output-dir",
            str(fresh),
            "--session-id",
            "s",
            "--agent-version",
            "1",
        ],
        capsys,
    )
    assert code == 2 and "2 row(s) cannot be exported" in err
    assert (
        "line 4: response.output[0].arguments: not a JSON object" in err
        and "line 5: agent_ref.name: missing" in err
    )
    assert not fresh.exists()
