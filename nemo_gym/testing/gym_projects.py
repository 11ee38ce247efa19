"""A fresh project directory to pull NeMo Gym's folders into and run ``gym`` in, for tests.

A test that pulls one of NeMo Gym's folders by name (``gym env pull NAME==VERSION``) and runs it
needs a project as a user has one: a directory holding what the folder runs beside (the scripted
model, the bundled folders, the lint and test settings), a ``PYTHONPATH`` that reaches this
package (and the user's own modules), and ``gym`` run there as a real subprocess with a timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nemo_gym.launch.config import project_root

GYM_MAIN = "from nemo_gym.tools.gym_cli import main; main()"


@dataclass(frozen=True)
class GymProject:
    """A project directory (``root``) and the environment ``gym`` runs with there."""

    root: Path
    env: dict[str, str]
    python: str = sys.executable

    def gym(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``gym ARGS...`` run in the project (its output captured as text)."""
        return subprocess.run(
            [self.python, "-c", GYM_MAIN, *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def pull(self, spec: str, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``gym env pull SPEC +project_dir=<root> OVERRIDES...``."""
        return self.gym("env", "pull", spec, f"+project_dir={self.root}", *overrides, timeout=timeout)


def gym_project(
    root: Path,
    copies: Sequence[str] = (),
    python_path: Sequence[str | Path] = (),
    python: str | Path | None = None,
) -> GymProject:
    """Make ``root`` a project holding copies of this project's ``copies`` (folders or files,
    relative paths such as ``responses_api_models/scripted_model`` or ``pyproject.toml``), whose
    ``gym`` runs under ``python`` (default: this interpreter) with this package and
    ``python_path`` on ``PYTHONPATH``."""
    root.mkdir(parents=True, exist_ok=True)
    for relative in copies:
        source, target = project_root() / relative, root / relative
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    paths = [str(project_root()), *(str(p) for p in python_path)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    return GymProject(root, env, str(python or sys.executable))


def write_files(files: Mapping[Path, str]) -> None:
    """Write each file's text, making its directories: a wheel's or a project's folders, as a
    test lays them out (``{wheel / "resources_servers/x/app.py": "..."}``)."""
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
