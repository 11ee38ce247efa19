"""NeMo Gym 0.7.0's command names: every ``ng_*`` / ``nemo_gym_*`` console script its wheel ships
is one of ours and answers ``--help``, and ``nemo_gym.cli``'s 0.7.0 submodules resolve every name."""

from __future__ import annotations

import importlib
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The console scripts of the nemo-gym 0.7.0 wheel (its entry_points.txt), prefix dropped.
NEMO_GYM_070_COMMANDS = (
    "aggregate_rollouts collect_rollouts delete_dataset_from_gitlab dev_test download_dataset_from_gitlab "
    "download_dataset_from_hf dump_config e2e_collect_rollouts gitlab_to_hf_dataset help "
    "init_resources_server list_benchmarks materialize_prompts pip_list prepare_benchmark prepare_data "
    "reinstall reward_profile run status test test_all upload_dataset_to_gitlab upload_dataset_to_hf "
    "validate version"
).split()
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
NAMES = [f"{prefix}_{name}" for name in NEMO_GYM_070_COMMANDS for prefix in ("ng", "nemo_gym")] + [
    "gym",
    "ng",
]


def load(target: str):
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


@pytest.mark.parametrize("name", NAMES)
def test_every_070_console_script_exists_and_answers_help(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert name in SCRIPTS, f"{name} (a nemo-gym 0.7.0 console script) is missing from [project.scripts]"
    entry = load(SCRIPTS[name])
    monkeypatch.setattr(sys, "argv", [f"/venv/bin/{name}", "--help"])
    with pytest.raises(SystemExit) as done:
        entry()
    out, err = capsys.readouterr()
    assert done.value.code in (0, None), (name, err)
    assert out.startswith("usage:"), (name, out[:200])


def test_legacy_names_run_their_gym_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nemo_gym.cli import legacy

    monkeypatch.setattr(
        sys, "argv", ["ng_pip_list", "+entrypoint=resources_servers/math_with_judge", "+format=json"]
    )
    with pytest.raises(SystemExit) as done:
        legacy.main()
    assert done.value.code == 0 and '"math-verify"' in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["nemo_gym_no_such_command"])
    with pytest.raises(SystemExit) as done:
        legacy.main()
    assert done.value.code == 2 and "no gym command" in capsys.readouterr().err


CLI_MODULES = (
    "main",
    "legacy",
    "env",
    "eval",
    "dataset",
    "dev",
    "general",
    "agents",
    "models",
    "resources_servers",
    "setup_command",
)


@pytest.mark.parametrize("module", CLI_MODULES)
def test_nemo_gym_cli_070_module_paths_resolve(module: str) -> None:
    loaded = importlib.import_module(f"nemo_gym.cli.{module}")
    names = [n for n in dir(loaded) if not n.startswith("_")]
    assert names
    for name in names:
        assert getattr(loaded, name) is not None, f"nemo_gym.cli.{module}.{name}"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        loaded.nope  # noqa: B018


def test_cli_070_names_are_ours() -> None:
    from nemo_gym.cli import RunHelper, ng_run, setup_env_command
    from nemo_gym.cli.env import RunHelper as env_run_helper
    from nemo_gym.cli.env import run
    from nemo_gym.cli.setup_command import setup_env_command as moved
    from nemo_gym.cli_setup_command import setup_env_command as older

    assert env_run_helper is RunHelper and run is ng_run
    assert setup_env_command is moved is older
