"""The project's test run leaves out folders brought in by ``gym env pull``.

A pulled folder holds ``.nemo_gym_source.json``. Its tests are NeMo Gym's, written to run the way
NeMo Gym runs them (``gym env test NAME`` does that); collected as part of this project's suite
they would fail on imports such as ``from app import ...`` and break ``scripts/test.sh``. A test
run started inside a pulled folder (or naming a path in it) still collects it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SOURCE_RECORD = ".nemo_gym_source.json"
ROOT = Path(__file__).resolve().parent


def _pulled_folder(path: Path) -> Path | None:
    for parent in [path, *path.parents]:
        if parent == ROOT or ROOT not in parent.parents:
            return None
        if (parent / SOURCE_RECORD).is_file():
            return parent
    return None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Skip a pulled folder unless the run was asked for something inside it."""
    folder = _pulled_folder(collection_path)
    if folder is None:
        return None
    asked = [Path(str(arg).split("::")[0]).resolve() for arg in config.args]
    if any(a == folder or folder in a.parents for a in asked):
        return None
    return True
