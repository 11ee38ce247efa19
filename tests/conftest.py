"""Fixtures shared by the test files under ``tests/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.tools.env_pull import PullError, fetch_wheel

NEMO_GYM_VERSION = "0.7.0"


@pytest.fixture
def nemo_gym_wheel() -> Path:
    """The unpacked ``nemo-gym`` 0.7.0 wheel (``pip download``, never installed; cached between
    runs), or a skip saying why when pip cannot reach the package index."""
    try:
        return fetch_wheel(NEMO_GYM_VERSION)
    except PullError as exc:
        pytest.skip(
            f"cannot fetch the nemo-gym {NEMO_GYM_VERSION} wheel (pip cannot reach the package index?): {exc}"
        )
