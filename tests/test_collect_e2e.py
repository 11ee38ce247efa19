"""Collection end to end with real stacks (child processes on 127.0.0.1): ``ng_collect_rollouts``
with every argument, ``ng_e2e_collect_rollouts``, and the trainer example of docs/TRAINER_API.md."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.collection.collection_io import CollectionPaths
from nemo_gym.launch.config import project_root
from nemo_gym.launch.launcher import free_port
from nemo_gym.rollout_collection import ng_collect_rollouts, ng_e2e_collect_rollouts
from nemo_gym.testing import running_stack

ROOT = project_root()
ENV = "resources_servers/example_single_tool_call"
CONFIGS = [
    f"{ENV}/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"
# The policy calls the tool, then answers with the seed it was given (to see seeds reach the model).
SEED_SCRIPT = "++policy_model.responses_api_models.scripted_model.scripts=[{turns: [{call_tool: first}, {text: 'seed={metadata[extra_body]} t={last_user}'}]}]"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_command(command, argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        command(argv)
    return int(exited.value.code or 0)


@pytest.mark.slow
def test_ng_collect_rollouts_with_every_argument(tmp_path: Path, capsys):
    tool = json.loads((ROOT / ENV / "data" / "example.jsonl").read_text().splitlines()[0])[
        "responses_create_params"
    ]["tools"]
    rows = [
        {"city": city, "responses_create_params": {"tools": tool}}
        for city in ("Oslo", "Lima", "Pune", "Baku")
    ]
    rows.append(rows[0])  # an identical line: same task, more rollouts
    lines = [json.dumps(r) for r in rows]
    lines.insert(2, "this line is not JSON")
    lines.append(json.dumps({"city": "Rome", "responses_create_params": {"tools": tool}}))  # past +limit
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    prompt = tmp_path / "prompt.yaml"
    prompt.write_text("system: Answer briefly.\nuser: What is the weather in {city}?\n")
    out = tmp_path / "results" / "weather.jsonl"
    skill = tmp_path / "skills" / "weather"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: weather\ndescription: Look the weather up.\n---\n")
    with running_stack(CONFIGS, [SEED_SCRIPT]) as stack:
        code = run_command(
            ng_collect_rollouts,
            [
                f"++head_server.port={stack.head_server_config['port']}",
                f"+agent_name={AGENT}",
                f"+input_jsonl_fpath={source}",
                f"+output_jsonl_fpath={out}",
                "+limit=5",
                "+num_repeats={_default: 2}",
                "+num_repeats_add_seed=true",
                "+num_samples_in_parallel=3",
                "+responses_create_params={temperature: 0.7, max_output_tokens: 64}",
                f"+prompt_config={prompt}",
                "+resume_from_cache=false",
                "+disable_aggregation=false",
                "+strict=false",
                "+rollout_timeout_s=30",
                "+max_attempts=2",
                f"+skills.path={skill.parent}",
            ],
        )
    assert code == 0
    results = read_jsonl(out)
    # The malformed third line keeps task 2 for when it is fixed: the later tasks are 3 and 4.
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in results) == [
        (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (3, 0), (3, 1), (4, 0), (4, 1)
    ]  # fmt: skip
    for result in results:
        params = result["responses_create_params"]
        assert params["temperature"] == 0.7 and params["max_output_tokens"] == 64
        assert params["input"] == [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": f"What is the weather in {result['city']}?"},
        ]
        answer = result["response"]["output"][-1]["content"][0]["text"]
        assert (
            answer
            == f'seed={{"seed": {result["_ng_rollout_index"]}}} t=What is the weather in {result["city"]}?'
        )
        assert result["reward"] == 1.0 and result["agent_ref"]["name"] == AGENT
        # The run's skills reach the agent (and come back) on every row.
        assert result["skills_ref"]["path"] == str(skill.parent) and len(result["skills_ref"]["hash"]) == 12
        assert result["skills_ref"]["skills"] == [
            {"name": "weather", "description": "Look the weather up.", "version": None}
        ]
    paths = CollectionPaths.for_output(out)
    assert len(read_jsonl(paths.materialized_inputs)) == 10
    (failure,) = read_jsonl(paths.failures)
    assert failure["_ng_failure_class"] == "malformed_input" and failure["_ng_input_line"] == 3
    assert "Rome" not in {r["city"] for r in results}  # +limit counts valid rows
    (entry,) = json.loads(paths.aggregate_metrics.read_text())
    assert entry["agent_metrics"]["pass@2/reward"] == 100.0
    output = capsys.readouterr()
    assert "Key metrics" in output.out and "mean/reward=1.0000" in output.out


@pytest.mark.slow
def test_ng_e2e_collect_rollouts_starts_collects_and_stops(tmp_path: Path, capsys):
    out = tmp_path / "e2e.jsonl"
    port = free_port()
    code = run_command(
        ng_e2e_collect_rollouts,
        [
            "+config_paths=[" + ",".join(CONFIGS) + "]",
            f"++head_server.port={port}",  # no +agent_name: the config has one agent
            f"+input_jsonl_fpath={ENV}/data/example.jsonl",
            f"+output_jsonl_fpath={out}",
            "+num_repeats=2",
        ],
    )
    assert code == 0
    assert len(read_jsonl(out)) == 10 and all(r["reward"] == 1.0 for r in read_jsonl(out))
    assert "Key metrics" in capsys.readouterr().out
    with socket.socket() as probe:  # the head server is gone
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_ng_collect_rollouts_without_a_head_server_is_a_clear_error(tmp_path: Path, capsys):
    code = run_command(
        ng_collect_rollouts,
        [
            f"++head_server.port={free_port()}",
            f"+agent_name={AGENT}",
            f"+input_jsonl_fpath={ENV}/data/example.jsonl",
            f"+output_jsonl_fpath={tmp_path / 'x.jsonl'}",
        ],
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot reach the head server" in err and "ng_run" in err


@pytest.mark.slow
def test_trainer_api_doc_example_runs():
    doc = (ROOT / "docs" / "TRAINER_API.md").read_text()
    code = re.search(r"## A trainer's loop.*?```python\n(.*?)```", doc, re.S)
    assert code is not None
    done = subprocess.run(
        [sys.executable, "-c", code.group(1)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "step 0: 10 rollouts, mean reward 1.000" in done.stdout
    assert "step 1: 10 rollouts, mean reward 1.000" in done.stdout


@pytest.mark.slow
def test_ctrl_c_prints_the_rows_kept_and_the_exact_command_that_resumes(tmp_path: Path):
    import shlex
    import signal
    import time

    from nemo_gym.testing import collector_argv, distinct_example_rows, write_jsonl

    # Enough rows that the run is still going when Ctrl-C lands (a rollout here takes ~3 ms, and a
    # loaded CI machine may not schedule this polling loop for a second or more).
    rows_in = 4000
    source = write_jsonl(tmp_path / "in.jsonl", distinct_example_rows(ENV, rows_in))
    out = tmp_path / "out.jsonl"
    with running_stack(CONFIGS) as stack:
        argv = collector_argv(
            stack.head_server_config["port"], AGENT, source, out, "+num_samples_in_parallel=1"
        )
        # Ctrl-C's default disposition in the collector, whatever this process inherited (a shell
        # that starts a job in the background, as CI runners may, leaves SIGINT ignored).
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 120
        while (not out.exists() or out.read_bytes().count(b"\n") < 3) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        kept = len(read_jsonl(out))
        assert 3 <= kept < rows_in and f"{kept} finished rollout(s) are kept in {out}" in err, err
        # The printed command, pasted as it is, finishes the run (only what is missing).
        command = err.strip().splitlines()[-1].strip()
        assert command.startswith("ng_collect_rollouts ") and command.endswith("+resume_from_cache=true")
        resumed = subprocess.run(
            [str(Path(sys.executable).parent / "ng_collect_rollouts"), *shlex.split(command)[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert resumed.returncode == 0, resumed.stderr
    rows = read_jsonl(out)
    assert (
        len(rows) == rows_in and len({(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows}) == rows_in
    )


def test_the_readme_openai_client_snippet_runs_against_a_stack():
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"Any OpenAI client can talk to.*?```python\n(.*?)```", readme, re.S)
    assert code is not None and "from openai import OpenAI" in code.group(1)
    with running_stack(CONFIGS) as stack:
        port = stack.head_server_config["port"]
        snippet = code.group(1).replace("127.0.0.1:11000", f"127.0.0.1:{port}")
        done = subprocess.run(
            [sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "function_call"


def test_the_readme_names_every_system_package_the_test_script_installs():
    script = (ROOT / "scripts" / "test.sh").read_text()
    readme = (ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set-up") : readme.index("## What is in a stack")]
    packages = set()
    for line in re.findall(r"apt-get install ([^)>|&]*)", script):
        packages.update(word for word in line.split() if not word.startswith("-") and word != "\\")
    assert {"chromium", "podman"} <= packages  # the parse finds what the script installs
    unsaid = sorted(p for p in packages if not re.search(rf"(?<![\w-]){re.escape(p)}(?![\w-])", setup))
    assert unsaid == [], f"scripts/test.sh installs {unsaid} without the README's set-up saying so"
    assert "as root" in setup and "apt-get" in setup
