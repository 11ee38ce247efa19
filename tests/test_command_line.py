"""The command line: --help on every command, the grouped ``gym`` CLI, the head port setting."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from collections.abc import Callable
from typing import Any

import pytest

from nemo_gym.command_help import COMMANDS
from nemo_gym.config import project_root

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
    from nemo_gym.cli import console_command

    def _body(argv: list[str]) -> int:
        """Frobnicate the rollouts."""
        return 0

    code, out, _ = call(console_command(_body, "ng_frobnicate"), ["--help"], capsys)
    assert code == 0 and out.startswith("usage: ng_frobnicate") and "Frobnicate the rollouts." in out
