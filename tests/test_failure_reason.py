"""``failure_reason``: the line the corpus tables give as a folder's failure, read from real output.

Each case runs the real command (``gym env test`` on a folder written here, or pytest as ng_test
runs it, or a Python import) and reads its output, so the shapes are pytest's and ng_test's own.
The lines that misled the old picker are in every case: a logger's ``[other-name] ...`` line, a
source line ``[`` of a list literal in the traceback, and a short test summary cut to 80 columns.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from nemo_gym.testing import gym_project, write_files
from nemo_gym.tools.authoring import NEMO_GYM_PYTEST_INI, pytest_command
from nemo_gym.tools.failure_reason import failure_reason

TESTS = """
import helper


def test_dumps_match():
    print("[multistage-elo] starting fresh: resume_from_cache not set")
    expected = [
        {"role": "assistant", "content": "hi"},
    ]
    assert [{"role": "assistant", "content": "hi", "tool_calls": []}] == expected


def test_conversion():
    helper.convert(
        [
            "required",
        ]
    )
"""
HELPER = """
def convert(choices):
    raise ValueError(f"tool_choice={choices[0]!r} needs at least one tool, but 'tools' is empty")
"""


def run_pytest(folder: Path, tmp_path: Path, *args: str) -> str:
    """The folder's tests run exactly as ``ng_test`` runs them; their whole output."""
    ini = tmp_path / "pytest.ini"
    ini.write_text(NEMO_GYM_PYTEST_INI)
    command, env = pytest_command(folder, ini, list(args))
    # Under CI pytest writes its short summary uncut; these tests read the cut form users see.
    env = {k: v for k, v in env.items() if k not in ("CI", "BUILD_NUMBER")}
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    return done.stdout + done.stderr


def test_the_first_failures_error_line_not_a_log_or_source_line(tmp_path: Path) -> None:
    folder = tmp_path / "resources_servers" / "demo"
    write_files({folder / "helper.py": HELPER, folder / "tests/test_app.py": TESTS})
    out = run_pytest(folder, tmp_path)
    # What misled the old picker: the log line and the source line "[" (both start with a bracket).
    assert "\n[multistage-elo] starting fresh" in out and re.search(r"\n +\[\n", out)
    assert re.search(r"\nFAILED tests/test_app.py::test_dumps_match - .*\.\.\.\n", out)  # cut short
    assert failure_reason(out, "demo") == (
        "AssertionError: assert [{'role': 'as...l_calls': []}] == [{'role': 'as...ntent': 'hi'}]"
    )
    # The second test alone: the exception its helper raised, whole.
    alone = run_pytest(folder, tmp_path, "-k", "conversion")
    assert failure_reason(alone, "demo") == (
        "ValueError: tool_choice='required' needs at least one tool, but 'tools' is empty"
    )


def test_a_collection_error_and_a_plain_traceback(tmp_path: Path) -> None:
    folder = tmp_path / "resources_servers" / "gpu_only"
    write_files({folder / "tests/test_app.py": "import vllm_not_installed_here\n\ndef test_x():\n    pass\n"})
    out = run_pytest(folder, tmp_path)
    assert failure_reason(out, "gpu_only") == "ModuleNotFoundError: No module named 'vllm_not_installed_here'"

    write_files({tmp_path / "lib.py": "import json\nfrom json import not_a_name\n"})
    done = subprocess.run(
        [sys.executable, "-c", "import lib"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert failure_reason(done.stderr).startswith("ImportError: cannot import name 'not_a_name' from 'json'")


def test_ng_tests_own_finding_comes_first_and_a_cut_run_says_so(tmp_path: Path) -> None:
    project = gym_project(tmp_path / "project")
    folder = project.root / "resources_servers" / "demo"
    write_files(
        {folder / "app.py": "X = 1\n", folder / "helper.py": HELPER, folder / "tests/test_app.py": TESTS}
    )
    done = project.gym("env", "test", "resources_servers/demo", timeout=180)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "[demo] FAILED: 0 example rows, tests: 2 failed" in out
    assert failure_reason(out, "demo") == (
        f"[demo] {folder}/configs: no YAML config (expected configs/demo.yaml)"
    )
    # Another folder's name: ng_test's lines about "demo" are not its findings; pytest's error is.
    assert failure_reason(out, "other").startswith("AssertionError: assert [{'role'")
    assert failure_reason(out + "\n[timed out after 240 s]", "other") == "timed out after 240 s"


def test_a_pull_error_names_what_failed() -> None:
    out = (
        "ng_pull_environment: pip could not install switchyard_model's requirements "
        "['nemo-switchyard==0.2.0']: ERROR: No matching distribution found for nemo-switchyard==0.2.0\n"
    )
    assert failure_reason(out).startswith("pip could not install switchyard_model's requirements")
    assert failure_reason("") == ""
