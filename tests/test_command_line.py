"""The command line: --help on every command, the grouped ``gym`` CLI, the head port setting."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.collection.collection_io import CollectionPaths
from nemo_gym.console.command_help import COMMANDS
from nemo_gym.launch.config import ConfigError, head_server_address, load_config, project_root
from nemo_gym.launch.launcher import free_port
from nemo_gym.testing import running_stack
from nemo_gym.tools.gym_cli import GROUPS, translate
from nemo_gym.tools.gym_cli import main as gym_main

SCRIPTS: dict[str, str] = tomllib.loads((project_root() / "pyproject.toml").read_text())["project"]["scripts"]
NG_COMMANDS = sorted(name for name in SCRIPTS if name.startswith("ng_"))


def entry_point(name: str) -> Callable[[list[str]], Any]:
    """The function behind console script ``name`` in pyproject.toml."""
    module, _, attr = SCRIPTS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def call(
    entry: Callable[[list[str]], Any], args: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """Run a console entry in-process; (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        entry(args)
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


@pytest.mark.parametrize("name", NG_COMMANDS)
def test_every_ng_command_answers_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    entry = entry_point(name)
    texts = []
    for args in (["--help"], ["-h"], ["help"], ["+limit=3", "--help"]):
        code, out, err = call(entry, args, capsys)
        assert code == 0, (name, args, err)
        assert out.startswith(f"usage: {name}"), out[:200]
        assert "example" in out and name in out.split("example", 1)[1], f"{name} --help shows no example"
        texts.append(out)
    assert len(set(texts)) == 1
    if name in COMMANDS:
        help_ = COMMANDS[name]
        for option in help_.options:
            assert option.key in texts[0]
        if help_.config_options:
            assert "+config_paths" in texts[0] and "head_server.port" in texts[0]


def test_help_shows_defaults_and_required_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = call(entry_point("ng_collect_rollouts"), ["--help"], capsys)
    assert code == 0
    assert "+num_samples_in_parallel=N" in out and "(default: 32)" in out
    assert "+input_jsonl_fpath=PATH" in out and "(required)" in out


def test_collect_help_is_generated_from_the_settings_and_its_defaults_are_the_real_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import yaml

    from nemo_gym.collection.settings import RolloutCollectionConfig

    code, out, _ = call(entry_point("ng_collect_rollouts"), ["--help"], capsys)
    assert code == 0
    text = re.sub(r"\n\s{20,}", " ", out)  # join wrapped lines
    shown = dict(re.findall(r"^  \+([\w.]+)=\S+\s+.*?\(default: ([^)]*)\)$", text, re.M))
    defaults = RolloutCollectionConfig(input_jsonl_fpath="in.jsonl", output_jsonl_fpath="out.jsonl")
    described = {name for name, field in RolloutCollectionConfig.model_fields.items() if field.description}
    advertised = set(re.findall(r"^  \+(\w+)", text, re.M))
    assert described <= advertised | {"skills"}, (
        described - advertised
    )  # every documented setting is in --help
    computed_at_run_time = {"num_samples_in_parallel", "rollout_timeout_s", "upload_rollouts_to_wandb"}
    checked = 0
    for name, value in shown.items():
        if name in computed_at_run_time:
            continue
        assert yaml.safe_load(value) == getattr(defaults, name), f"+{name}: help says {value}"
        checked += 1
    assert checked >= 10


def test_a_config_error_points_at_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = call(entry_point("ng_dump_config"), ["--verbose"], capsys)
    assert code == 2
    assert "not of the form key=value" in err and "ng_dump_config --help" in err


def test_installed_script_answers_help_in_a_fresh_process() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from nemo_gym.cli import ng_status; ng_status(sys.argv[1:])",
            "-h",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ng_status") and "NEMO_GYM_HEAD_PORT" in done.stdout


def test_a_command_without_a_help_entry_uses_its_docstring(capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_gym.console.command import console_command

    def _body(argv: list[str]) -> int:
        """Frobnicate the rollouts."""
        return 0

    code, out, _ = call(console_command(_body, "ng_frobnicate"), ["--help"], capsys)
    assert code == 0 and out.startswith("usage: ng_frobnicate") and "Frobnicate the rollouts." in out


# ---- the head server's address: one setting for every command -------------------------------


def test_head_port_as_documented_from_the_environment_and_env_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NEMO_GYM_HEAD_PORT", raising=False)
    monkeypatch.delenv("NEMO_GYM_HEAD_HOST", raising=False)
    assert head_server_address(load_config(["head_server.port=11300"], cwd=tmp_path)) == ("127.0.0.1", 11300)
    assert head_server_address(load_config([], cwd=tmp_path)) == ("127.0.0.1", 11000)
    monkeypatch.setenv("NEMO_GYM_HEAD_PORT", "12345")
    monkeypatch.setenv("NEMO_GYM_HEAD_HOST", "127.0.0.2")
    assert head_server_address(load_config([], cwd=tmp_path)) == ("127.0.0.2", 12345)
    # The config (command line, then env.yaml) wins over the environment.
    assert head_server_address(load_config(["head_server.port=11301"], cwd=tmp_path))[1] == 11301
    (tmp_path / "env.yaml").write_text("head_server:\n  port: 11302\n")
    assert head_server_address(load_config([], cwd=tmp_path))[1] == 11302
    monkeypatch.setenv("NEMO_GYM_HEAD_PORT", "eleven")
    with pytest.raises(ConfigError, match="NEMO_GYM_HEAD_PORT must be an integer"):
        head_server_address({})
    # A typo is not silently added.
    with pytest.raises(ConfigError, match=r"did you mean 'head_server.port'"):
        load_config(["head_server.prot=1"], cwd=tmp_path)
    # Other keys still need a '+' to be added.
    with pytest.raises(ConfigError, match=r"use \+policy_nmae"):
        load_config(["policy_nmae=x"], cwd=tmp_path)


@pytest.mark.slow
def test_ng_run_on_a_set_port_and_ng_status_finds_it_by_env_yaml_and_env_var(tmp_path: Path) -> None:
    port = free_port()
    configs = (
        "+config_paths=[resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,"
        "responses_api_models/scripted_model/configs/scripted_model.yaml]"
    )
    code = "import sys; from nemo_gym.cli import ng_run; ng_run(sys.argv[1:])"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEMO_GYM_HEAD")}
    run = subprocess.Popen(
        [sys.executable, "-c", code, configs, f"head_server.port={port}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert run.stdout is not None
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = run.stdout.readline()
            lines.append(line)
            if "servers healthy" in line or not line:
                break
        assert "servers healthy" in lines[-1], "".join(lines)
        assert f"127.0.0.1:{port}" in lines[-1]
        # The count is the table's rows (head server included); prefixed server logs may interleave.
        header = next(i for i, line in enumerate(lines) if line.startswith("NAME"))
        listed = [
            line
            for line in lines[header + 1 : -1]
            if len(line.split()) == 4 and line.split()[3].isdigit() and not line.startswith("(")
        ]
        assert len(listed) == 4 and lines[-1].startswith(f"All {len(listed)} servers healthy"), "".join(lines)
        status = "import sys; from nemo_gym.cli import ng_status; ng_status(sys.argv[1:])"
        by_env = subprocess.run(
            [sys.executable, "-c", status],
            cwd=tmp_path,
            env={**env, "NEMO_GYM_HEAD_PORT": str(port)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert by_env.returncode == 0, by_env.stdout + by_env.stderr
        table = by_env.stdout.splitlines()
        assert table[1].split()[:3] == ["head_server", "head", f"http://127.0.0.1:{port}"]
        assert table[1].split()[3] == str(run.pid)
        assert any(row.startswith("policy_model") for row in table)
        (tmp_path / "env.yaml").write_text(f"head_server:\n  port: {port}\n")
        by_file = subprocess.run(
            [sys.executable, "-c", status], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert by_file.returncode == 0 and by_file.stdout == by_env.stdout
    finally:
        run.send_signal(signal.SIGINT)
        run.wait(30)


# ---- gym: the grouped command line ----------------------------------------------------------


def gym(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return call(gym_main, args, capsys)


def test_gym_eval_run_help_agrees_with_itself(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = gym(["eval", "run", "--help"], capsys)
    assert code == 0 and "takes a free port unless head_server.port is set" in " ".join(out.split())
    port_line = out[out.index("head_server.port=N") :].split("head_server.host")[0]
    assert "(default: a free port)" in port_line and "11000" not in port_line
    example = out[out.index("example:") :].splitlines()[1].strip()
    assert example.startswith("gym eval run ") and "ng_e2e_collect_rollouts" not in out
    # A command that reaches a running stack keeps the fixed port.
    from nemo_gym.cli import ng_status

    assert "(default: 11000)" in call(ng_status, ["--help"], capsys)[1]


def test_gym_help_at_every_level(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = gym(["--help"], capsys)
    assert code == 0
    for group in ("env", "eval", "list", "dataset", "view"):
        assert f"\n  {group} " in out
    for shown in (
        "gym env start",
        "gym env resolve",
        "gym eval reverify",
        "gym eval profile",
        "gym list models",
    ):
        assert shown in out
    assert gym([], capsys)[0] == 2  # no group: the help, as a usage error
    for group, (_, commands) in GROUPS.items():
        named = [c for c in commands if c.name]
        if named:
            code, out, _ = gym([group, "-h"], capsys)
            assert code == 0 and out.startswith(f"usage: gym {group} <command>")
        for command in commands:
            words = [group, command.name] if command.name else [group]
            code, out, err = gym([*words, "--help"], capsys)
            assert code == 0, (words, err)
            assert out.startswith(f"usage: {' '.join(['gym', *words])}"), out[:100]
    code, out, _ = gym(["eval", "reverify", "help"], capsys)
    assert "+input_jsonl_fpath=PATH" in out and "--no-serve" in out


def test_gym_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = gym(["evl", "run"], capsys)
    assert code == 2 and "unknown group 'evl'; did you mean 'eval'?" in err
    code, _, err = gym(["eval", "reverfy"], capsys)
    assert code == 2 and "unknown command 'reverfy'; did you mean 'reverify'?" in err
    code, _, err = gym(["env", "resolve", "--agnt", "x"], capsys)
    assert code == 2 and "unknown flag '--agnt'; did you mean '--agent'?" in err
    code, _, err = gym(["env", "resolve", "--resources-server", "exmple_single_tool_call"], capsys)
    assert code == 2 and "did you mean 'example_single_tool_call'?" in err


def test_gym_runs_the_ng_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = gym(
        [
            "env",
            "resolve",
            "--resources-server",
            "example_single_tool_call",
            "--model-type",
            "scripted_model",
        ],
        capsys,
    )
    assert code == 0, err
    assert "example_single_tool_call_simple_agent:" in out and "scripted_model:" in out
    code, out, _ = gym(["list", "environments"], capsys)
    assert code == 0
    assert re.search(r"^example_single_tool_call +One get_weather tool; reward 1.0 when", out, re.MULTILINE)
    code, servers, _ = gym(["list", "resources-servers"], capsys)  # NeMo Gym 0.7.0's name, with domains
    names = {line.split()[0] for line in out.splitlines()}
    assert code == 0 and {line.split()[0] for line in servers.splitlines()[1:]} == names
    code, out, _ = gym(["list", "models"], capsys)
    assert code == 0 and {line.split()[0] for line in out.splitlines()} >= {"scripted_model", "openai_model"}
    code, out, _ = gym(["--version"], capsys)
    assert code == 0 and out.startswith("nemo_gym ")
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text('{"_ng_task_index": 0, "reward": 1.0}\n{"_ng_task_index": 0, "reward": 0.0}\n')
    code, out, _ = gym(["eval", "profile", f"+input_jsonl_fpath={rollouts}"], capsys)
    assert code == 0 and "mixed 1" in out and (tmp_path / "r.reward_profile.json").exists()
    # A config error from the ng_* command underneath keeps its exit code.
    assert gym(["eval", "profile"], capsys)[0] == 2


def test_gym_flags_become_overrides() -> None:
    run = next(c for c in GROUPS["eval"][1] if c.name == "run")
    args, no_serve = translate(
        [
            "--config",
            "a.yaml,b.yaml",
            "--agent",
            "my_agent",
            "--input=in.jsonl",
            "--limit",
            "2",
            "++x=1",
            "--no-serve",
        ],
        run,
    )
    assert args == [
        "+config_paths=[a.yaml,b.yaml]",
        "+agent_name=my_agent",
        "+input_jsonl_fpath=in.jsonl",
        "+limit=2",
        "++x=1",
    ]
    assert no_serve
    view = GROUPS["view"][1][0]
    assert translate(["--input", "a.jsonl"], view) == (["+input=a.jsonl"], False)
    test = next(c for c in GROUPS["env"][1] if c.name == "test")
    assert translate(["mcqa"], test) == (["+entrypoint=resources_servers/mcqa"], False)


def test_gym_view_runs_ng_viewer_when_it_is_installed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = gym(["view", "--help"], capsys)
    assert code == 0 and out.startswith("usage: gym view")
    if importlib.util.find_spec("nemo_gym.viewer") is None:
        code, _, err = gym(["view", "+input_jsonl_fpath=x.jsonl"], capsys)
        assert code == 2 and "ng_viewer is not part of this installation" in err


# ---- messages ---------------------------------------------------------------------------------

STACK_CONFIGS = [
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
]
EXAMPLES = project_root() / "resources_servers/example_single_tool_call/data/example.jsonl"


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    with running_stack(STACK_CONFIGS) as handle:
        yield handle


def collect(handle: Any, output: Path, **fields: Any) -> Any:
    from nemo_gym.rollout_collection import RolloutCollectionHelper

    config = {
        "agent_name": "example_single_tool_call_simple_agent",
        "input_jsonl_fpath": str(EXAMPLES),
        "output_jsonl_fpath": str(output),
        "head_server": handle.head_server_config,
        **fields,
    }
    return asyncio.run(RolloutCollectionHelper().run_from_config(config))


def test_a_mistyped_agent_gets_did_you_mean_and_only_agents(stack: Any, tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    with pytest.raises(ConfigError) as raised:
        collect(stack, output, agent_name="example_single_tool_call_simple_agnt")
    message = str(raised.value)
    assert "did you mean 'example_single_tool_call_simple_agent'?" in message
    assert "(registered agents: example_single_tool_call_simple_agent)" in message
    assert "policy_model" not in message
    # The rejected run leaves no empty failures file.
    assert not CollectionPaths.for_output(output).failures.exists()


def test_a_rejected_input_file_leaves_no_failures_file(stack: Any, tmp_path: Path) -> None:
    bad = tmp_path / "in.jsonl"
    bad.write_text(EXAMPLES.read_text() + "{not json\n")
    output = tmp_path / "out.jsonl"
    with pytest.raises(ConfigError, match=r"in.jsonl:6"):
        collect(stack, output, input_jsonl_fpath=str(bad), strict=True)
    assert not CollectionPaths.for_output(output).failures.exists()


def test_summary_and_metrics_speak_plainly(
    stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "in.jsonl"
    bad.write_text(EXAMPLES.read_text() + "{not json\n")
    summary = collect(stack, tmp_path / "out.jsonl", input_jsonl_fpath=str(bad), num_repeats=2)
    assert summary.succeeded == 10 and summary.malformed_lines == 1
    out = capsys.readouterr().out
    # One instruction: fix the line, then resume (it keeps its task index, so the resume collects it).
    assert out.count("Next:") == 1 and out.count("+resume_from_cache=true") == 1
    assert f"Next: fix input line 6 of {bad} (what is wrong with each is in {summary.paths.failures})" in out
    # One scale on the metrics line: fractions (the file keeps NeMo Gym's percentages).
    line = next(
        line for line in out.splitlines() if "example_single_tool_call_simple_agent: mean/reward" in line
    )
    assert "mean/reward=1.0000" in line and "pass@1[avg-of-2]/reward=1.0000" in line
    assert "fractions 0-1" in out
    (entry,) = json.loads(summary.paths.aggregate_metrics.read_text())
    assert entry["agent_metrics"]["pass@1[avg-of-2]/reward"] == pytest.approx(100.0)


def test_config_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(project_root())
    with pytest.raises(ConfigError) as raised:
        load_config(["+config_paths=[configs/nope.yaml]"])
    assert str(raised.value).count(str(project_root())) == 1
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as raised:
        load_config(["+config_paths=[configs/nope.yaml]"])
    assert str(tmp_path.resolve()) in str(raised.value) and str(project_root()) in str(raised.value)
    code, out, err = call(entry_point("ng_dump_config"), [], capsys)
    assert code == 1 and out == "" and "the config is empty" in err
    code, out, _ = call(entry_point("ng_dump_config"), ["+policy_model_name=m"], capsys)
    assert code == 0 and out == "policy_model_name: m\n"


def test_the_main_job_answers_help(capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_gym.tools.main_job import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: scripts/main_job.sh") and "+model=NAME_OR_PATH" in out
    assert main(["oops"]) == 2
    assert "scripts/main_job.sh --help" in capsys.readouterr().err


def test_gym_eval_run_collects_with_nemo_gym_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "rollouts.jsonl"
    code, out, err = gym(
        [
            "eval",
            "run",
            "--resources-server",
            "example_single_tool_call",
            "--model-type",
            "scripted_model",
            "--input",
            str(EXAMPLES),
            "--output",
            str(output),
            "--limit",
            "2",
            "--num-repeats",
            "2",
        ],
        capsys,
    )
    assert code == 0, out + err
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 4 and all(row["reward"] == 1.0 for row in rows)
    assert "Key metrics" in out


def test_ng_status_without_a_head_server_says_how_to_point_at_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = call(entry_point("ng_status"), [f"head_server.port={free_port()}"], capsys)
    assert code == 1 and "no head server at http://127.0.0.1:" in err and "NEMO_GYM_HEAD_PORT" in err


@pytest.mark.slow
def test_a_server_that_dies_at_start_is_a_clean_message_from_ng_run_and_gym_eval_run(tmp_path: Path) -> None:
    folder = tmp_path / "resources_servers" / "broken_env"
    folder.mkdir(parents=True)
    (folder / "app.py").write_text('raise RuntimeError("this environment cannot start: missing API key")\n')
    (tmp_path / "broken.yaml").write_text(
        "broken:\n  resources_servers:\n    broken_env:\n      entrypoint: app.py\n"
    )
    (tmp_path / "in.jsonl").write_text('{"responses_create_params": {"input": "hi"}}\n')
    bin_dir = Path(sys.executable).parent
    config = ["+config_paths=[broken.yaml]", "++head_server.port=0"]
    commands = {
        "ng_run": [str(bin_dir / "ng_run"), *config],
        "ng_e2e_collect_rollouts": [
            str(bin_dir / "gym"),
            "eval",
            "run",
            *config,
            "+agent_name=x",
            "+input_jsonl_fpath=in.jsonl",
            "+output_jsonl_fpath=out.jsonl",
        ],
    }
    for prog, argv in commands.items():
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=180)
        assert done.returncode == 1, done.stderr
        # The command's own words: which server, its exit code, and the end of what it printed.
        own = [line for line in done.stderr.splitlines() if not line.startswith("(broken)")]
        assert own[0].startswith(f"{prog}: server 'broken' (resources_servers, pid "), done.stderr
        assert "exited with code 1" in own[0] and "missing API key" in own[-1]
        assert len(own) <= 8 and "nemo_gym/launch" not in done.stderr, done.stderr  # no launcher traceback
