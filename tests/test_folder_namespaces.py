"""The environment trees (``resources_servers``, ``responses_api_agents``, ...) extend their path as
NeMo Gym's namespace packages do: a copy of the tree earlier on ``sys.path`` supplies modules this
project lacks. NeMo Gym 0.7.0's harness_agent stages agents in a ``gym_mount`` folder put first on
``sys.path`` by its runner and imports them from there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.launch.config import project_root

TREES = ["benchmarks", "resources_servers", "responses_api_agents", "responses_api_models"]


@pytest.mark.parametrize("tree", TREES)
def test_a_staged_copy_of_a_tree_supplies_what_the_project_lacks(tmp_path: Path, tree: str) -> None:
    staged = tmp_path / "gym_mount" / tree
    staged.mkdir(parents=True)  # no __init__.py: a namespace portion, as NeMo Gym ships it
    (staged / "runner_probe.py").write_text("source = 'staged'\n")
    script = (
        f"import sys\nsys.path.insert(0, {str(tmp_path / 'gym_mount')!r})\n"
        f"from {tree}.runner_probe import source\n"
        "assert source == 'staged', source\n"
        f"import {tree}\n"
        f"assert {tree}.__path__[0] == {str(project_root() / tree)!r}, {tree}.__path__\n"
    )
    env = dict(os.environ, PYTHONPATH=str(project_root()))  # a clone, run from elsewhere
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_the_projects_own_folder_still_wins(tmp_path: Path) -> None:
    staged = tmp_path / "gym_mount" / "responses_api_agents" / "simple_agent"
    staged.mkdir(parents=True)
    (staged / "app.py").write_text("raise SystemExit('the staged copy shadowed the project')\n")
    script = (
        f"import sys\nsys.path.insert(0, {str(tmp_path / 'gym_mount')!r})\n"
        "import responses_api_agents.simple_agent.app as app\n"
        f"assert app.__file__.startswith({str(project_root())!r}), app.__file__\n"
    )
    env = dict(os.environ, PYTHONPATH=str(project_root()))
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_a_folder_the_project_pulled_is_not_shadowed_by_this_repositorys_bundled_one(tmp_path: Path) -> None:
    """A user's project keeps this repository's tree ``__init__.py`` (a regular package) and pulls
    NeMo Gym's ``math_with_judge`` into it without one; this repository, on ``PYTHONPATH``, bundles
    its own ``math_with_judge`` as a regular package. The project's pulled folder is the one imported:
    another regular tree is a different package, not a portion to merge."""
    tree = tmp_path / "project" / "resources_servers"
    (tree / "math_with_judge").mkdir(parents=True)
    (tree / "__init__.py").write_text((project_root() / "resources_servers" / "__init__.py").read_text())
    (tree / "math_with_judge" / "app.py").write_text("source = 'pulled'\n")
    assert (project_root() / "resources_servers" / "math_with_judge" / "__init__.py").is_file()
    script = "from resources_servers.math_with_judge.app import source\nassert source == 'pulled', source\n"
    env = dict(os.environ, PYTHONPATH=str(project_root()))
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tree.parent, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
