"""``gym dev test`` (``ng_dev_test``): run the framework's own tests with pytest.

NeMo Gym 0.7.0 runs ``pytest --cov=. --durations=10`` in the project. Here the paths, a ``-k``
expression and coverage are settings, so a contributor can run one file the same way; pytest
runs in the project root with this interpreter and its exit status is the command's.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.console.settings_command import settings_command
from nemo_gym.launch.config import ConfigError, project_root


class DevTestSettings(BaseModel):
    """The arguments of ``gym dev test``."""

    model_config = ConfigDict(extra="ignore")

    paths: str | list[str] = Field(
        default="tests",
        description="Test files or folders, relative to the project root (a list or one path).",
    )
    keyword: str | None = Field(default=None, description="Only tests matching this pytest -k expression.")
    durations: int = Field(default=10, ge=0, description="Show the N slowest tests (pytest --durations).")
    coverage: bool = Field(default=False, description="Measure coverage of nemo_gym (needs pytest-cov).")


def pytest_command(settings: DevTestSettings) -> list[str]:
    """The pytest command line the settings stand for; a path that does not exist is a ConfigError."""
    root = project_root()
    paths = [settings.paths] if isinstance(settings.paths, str) else list(settings.paths)
    missing = [path for path in paths if not (root / path).exists()]
    if missing:
        raise ConfigError(f"+paths: not in {root}: {', '.join(missing)}")
    command = [sys.executable, "-m", "pytest", *paths, f"--durations={settings.durations}"]
    if settings.keyword:
        command += ["-k", settings.keyword]
    if settings.coverage:
        if importlib.util.find_spec("pytest_cov") is None:
            raise ConfigError("+coverage=true needs pytest-cov: pip install pytest-cov")
        command.append("--cov=nemo_gym")
    return command


def _dev_test(settings: DevTestSettings) -> int:
    return subprocess.call(pytest_command(settings), cwd=project_root())


ng_dev_test = settings_command(
    _dev_test,
    DevTestSettings,
    "ng_dev_test",
    "Run the framework's tests with pytest in the project root (all of tests/ unless +paths names some).",
    examples=("ng_dev_test +paths=tests/test_gym_cli.py", "gym dev test +keyword=prompt"),
)
