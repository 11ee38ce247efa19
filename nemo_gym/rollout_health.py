"""Compatibility: NeMo Gym's rollout health checks (``nemo_gym.rollout_health``): is each rollout of a run
what it claims to be, judged from its ``ng_trajectory`` (turns and captured model calls)?

:func:`run_health_checks` checks rollout files and writes ``quality_summary.json`` and
``rollout_verdicts.jsonl``; :func:`health_check_run_dir` does it for a run folder and prints a
line (``gym eval health-check``). The checks live in :mod:`nemo_gym.collection.health_rollout`,
the run in :mod:`nemo_gym.collection.health_run`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson

from nemo_gym.collection.health_run import run_health_checks
from nemo_gym.collection.health_types import (
    CHECK_REGISTRY,
    CheckInput,
    CheckScope,
    CheckSpec,
    CheckSubject,
    Finding,
    HealthCheckResult,
    RolloutDigest,
    Verdict,
    normalize_ignored_checks,
)

__all__ = [
    "CHECK_REGISTRY",
    "CheckInput",
    "CheckScope",
    "CheckSpec",
    "CheckSubject",
    "Finding",
    "HealthCheckResult",
    "RolloutDigest",
    "Verdict",
    "format_health_report",
    "health_check_run_dir",
    "normalize_ignored_checks",
    "run_health_checks",
]

DEFAULT_ROLLOUT_FILE = "rollouts.jsonl"


def format_health_report(result: HealthCheckResult) -> str:
    """Two lines: how many rollouts were healthy, unhealthy and unobserved; where the summary is."""
    run = result.summary["run"]
    verdicts = run["verdicts"]
    ignored = f" (ignored: {', '.join(run['ignored_checks'])})" if run.get("ignored_checks") else ""
    return (
        f"Rollout health: {sum(verdicts.values())} checked, {verdicts['healthy']} healthy, "
        f"{verdicts['unhealthy']} unhealthy, {verdicts['unobserved']} unobserved{ignored}\n"
        f"Quality summary: {result.summary_path}"
    )


def health_check_run_dir(
    run_dir: str | Path,
    *,
    rollout_file: str | Path | None = None,
    workers: int | None = None,
    ignored_checks: Sequence[str] = (),
    json_output: bool = False,
) -> HealthCheckResult:
    """Check ``run_dir``'s rollouts (``rollout_file``, relative to it; default ``rollouts.jsonl``),
    write the reports there and print the summary (as JSON with ``json_output``)."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"Run directory not found: {folder}")
    chosen = Path(rollout_file) if rollout_file is not None else Path(DEFAULT_ROLLOUT_FILE)
    path = chosen if chosen.is_absolute() else folder / chosen
    if not path.is_file():
        raise FileNotFoundError(f"Rollout JSONL not found: {path}")
    result = run_health_checks(path, output_dir=folder, workers=workers, ignored_checks=ignored_checks)
    print(orjson.dumps(result.summary).decode() if json_output else format_health_report(result))
    return result
