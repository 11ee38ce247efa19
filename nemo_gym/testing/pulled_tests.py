"""A pytest plugin for the tests of a folder pulled from a ``nemo-gym`` wheel (``gym env test``).

Some of NeMo Gym's folder tests check its source repository rather than the folder: a docs page
quotes the tool count (``fern/versions/latest/pages/...``). The wheel does not ship those
files, so such a test cannot pass outside NeMo Gym's git checkout. A test that fails only
because it opened a file under the project root whose top-level directory neither the wheel
nor this project has is reported as skipped, naming the file; every other failure stays one.

``gym env test`` loads it (``-p nemo_gym.testing.pulled_tests``) for pulled folders, with
``NEMO_GYM_PULLED_PROJECT`` naming the project root.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PROJECT_ENV = "NEMO_GYM_PULLED_PROJECT"


def repository_file(error: BaseException, project: Path) -> Path | None:
    """The project-relative path ``error`` failed to open, when it lies in a top-level directory
    the project does not have (a file of NeMo Gym's repository, not of the wheel); else None."""
    if not isinstance(error, FileNotFoundError) or not error.filename:
        return None
    path = Path(os.fsdecode(error.filename))
    if not path.is_absolute():
        return None
    try:
        relative = path.resolve().relative_to(project.resolve())
    except ValueError:
        return None
    if len(relative.parts) < 2 or (project / relative.parts[0]).exists():
        return None
    return relative


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Turn a failure caused by a file of NeMo Gym's repository into a skip that names it."""
    outcome: Any = yield
    report = outcome.get_result()
    project = os.environ.get(PROJECT_ENV)
    if not project or call.when != "call" or not report.failed or call.excinfo is None:
        return
    missing = repository_file(call.excinfo.value, Path(project))
    if missing is not None:
        report.outcome = "skipped"
        report.longrepr = (
            str(item.path),
            item.location[1] or 0,
            f"Skipped: reads {missing}, a file of NeMo Gym's source repository that the nemo-gym wheel does not ship",
        )
