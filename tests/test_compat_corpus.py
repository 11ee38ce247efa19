"""The NeMo Gym compatibility corpus is kept inside the project, so a fresh clone skips no compat test."""

from __future__ import annotations

import os

import orjson
import pytest

from nemo_gym.launch.config import project_root
from nemo_gym.testing import compat_dir, compat_root

KEPT = project_root() / "tests" / "compat" / "nemo_gym"


def test_the_tests_read_the_copy_inside_the_project(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEMO_GYM_COMPAT_DIR", raising=False)
    assert compat_root() == KEPT
    assert compat_dir("mcqa") == KEPT / "mcqa"
    monkeypatch.setenv("NEMO_GYM_COMPAT_DIR", "/elsewhere")
    assert str(compat_dir("mcqa")) == os.path.join("/elsewhere", "mcqa")


def test_every_environment_has_its_rows_rollouts_metrics_and_the_licence() -> None:
    assert "Apache License" in (KEPT / "LICENSE").read_text()
    assert "NeMo Gym" in (KEPT / "README.md").read_text()
    environments = sorted(p for p in KEPT.iterdir() if p.is_dir())
    assert len(environments) >= 12
    for folder in environments:
        for name in ("example.jsonl", "example_rollouts.jsonl", "example_metrics.json"):
            assert (folder / name).stat().st_size > 0, folder / name


def test_the_copy_is_whole() -> None:
    """Every line parses, and every recorded rollout carries its response and NeMo Gym's reward."""
    for path in sorted(KEPT.glob("*/example*.jsonl")):
        rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        assert rows and all(isinstance(row, dict) for row in rows), path
        if path.name == "example_rollouts.jsonl":
            assert all(isinstance(row.get("reward"), int | float) and "response" in row for row in rows), path
