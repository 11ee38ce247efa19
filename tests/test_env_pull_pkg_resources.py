"""A pulled folder importing ``pkg_resources`` gets a setuptools that still ships it."""

from __future__ import annotations

from pathlib import Path

from nemo_gym.tools.env_pull_requirements import pkg_resources_setuptools

SHIM = "try:\n    import pkg_resources  # noqa: F401\nexcept ImportError:\n    pass\n"


def _folder(tmp_path: Path, code: str) -> Path:
    (tmp_path / "env").mkdir(parents=True)
    (tmp_path / "env" / "app.py").write_text(code)
    return tmp_path / "env"


def test_its_setuptools_range_is_narrowed_below_81_when_the_environment_has_none(tmp_path: Path) -> None:
    """0.7.0's grl_sokoban: ``setuptools>=70`` with setuptools 84 installed is met, yet
    ``gym_sokoban`` needs ``pkg_resources`` (its fallback needs Python 3.12)."""
    folder = _folder(tmp_path, SHIM)
    reqs = ["gym-sokoban==0.0.6", "setuptools>=70"]
    assert pkg_resources_setuptools(folder, reqs, available=False) == [
        "gym-sokoban==0.0.6",
        "setuptools>=70,<81",
    ]
    assert pkg_resources_setuptools(folder, ["numpy"], available=False) == ["numpy", "setuptools<81"]


def test_nothing_changes_when_pkg_resources_is_there_or_unused(tmp_path: Path) -> None:
    assert pkg_resources_setuptools(_folder(tmp_path, SHIM), ["setuptools>=70"], available=True) == [
        "setuptools>=70"
    ]
    unused = _folder(tmp_path / "b", "import os\n")
    assert pkg_resources_setuptools(unused, ["setuptools>=70"], available=False) == ["setuptools>=70"]


def test_a_range_leaving_no_such_setuptools_is_kept(tmp_path: Path) -> None:
    folder = _folder(tmp_path, SHIM)
    assert pkg_resources_setuptools(folder, ["setuptools>=82"], available=False) == ["setuptools>=82"]
