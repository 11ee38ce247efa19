"""Compatibility: Which files an agent harness leaves behind are its deliverables (``nemo_gym.deliverables``):
every regular file except the harness's own bookkeeping (history, metadata, logs, the task's
reference files)."""

from __future__ import annotations

from pathlib import Path

IGNORE_FILES = frozenset(
    {
        "finish_params.json",
        "history.json",
        "history.pkl",
        "inprogress_history.json",
        "metadata.json",
        "log.txt",
        "reference_files",
    }
)


def is_deliverable(path: Path) -> bool:
    """Whether ``path`` is a regular file the agent produced (not one of :data:`IGNORE_FILES`)."""
    return path.is_file() and path.name not in IGNORE_FILES
