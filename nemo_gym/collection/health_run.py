"""A run's rollout health (NeMo Gym 0.7.0's ``run_health_checks``): every record of the rollout
files through the rollout checks (in worker processes when there are several records), the
records that claim the same rollout flagged, each task's repeats judged, and two reports written:
``quality_summary.json`` (counts, coverage of each check, per-task verdicts) and
``rollout_verdicts.jsonl`` (one line per record: verdict, findings, unobserved checks).
"""

from __future__ import annotations

import os
import warnings
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collection.health_rollout import digest_rollout
from nemo_gym.collection.health_types import (
    CHECK_REGISTRY,
    QUALITY_SUMMARY_FILENAME,
    ROLLOUT_INDEX_KEY,
    ROLLOUT_SPECS,
    ROLLOUT_VERDICTS_FILENAME,
    TASK_INDEX_KEY,
    TASK_SPECS,
    Finding,
    HealthCheckResult,
    RolloutDigest,
    Verdict,
    normalize_ignored_checks,
    subject_of,
)

MAX_WORKERS = 8


@dataclass(frozen=True)
class LineRef:
    """Where one record is: file, byte offset and length, its position overall, file number, line."""

    path: str
    offset: int
    length: int
    ordinal: int
    file_number: int
    line: int


@dataclass(frozen=True)
class _Job:
    line: LineRef
    ignored: frozenset[str]


def index_lines(paths: Sequence[Path]) -> list[LineRef]:
    """Every non-blank line of ``paths``, in order."""
    refs: list[LineRef] = []
    for file_number, path in enumerate(paths):
        with path.open("rb") as handle:
            line = 0
            while True:
                offset = handle.tell()
                text = handle.readline()
                if not text:
                    break
                line += 1
                if text.strip():
                    refs.append(LineRef(str(path), offset, len(text), len(refs), file_number, line))
    return refs


def _check_line(job: _Job) -> RolloutDigest:
    ref = job.line
    with open(ref.path, "rb") as handle:
        handle.seek(ref.offset)
        raw = handle.read(ref.length).strip()
    record: dict[str, Any] = {}
    error = None
    try:
        parsed = orjson.loads(raw)
        if not isinstance(parsed, dict):
            raise ValueError("rollout line is not an object")
        record = parsed
    except Exception as exc:  # noqa: BLE001 - an unreadable line is a finding
        error = type(exc).__name__
    return digest_rollout(
        record, error, ordinal=ref.ordinal, source=(ref.path, ref.file_number, ref.line), ignored=job.ignored
    )


def _map(jobs: list[_Job], workers: int) -> list[RolloutDigest]:
    if len(jobs) <= 1 or workers == 1:
        return [_check_line(job) for job in jobs]
    chunk = max(1, min(-(-len(jobs) // (workers * 4)), 128))
    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(_check_line, jobs, chunksize=chunk))
    except (BrokenProcessPool, OSError, NotImplementedError) as exc:
        warnings.warn(
            f"process pool failed ({exc}); checking rollouts serially", RuntimeWarning, stacklevel=3
        )
        return [_check_line(job) for job in jobs]


def flag_duplicate_identities(digests: list[RolloutDigest], ignored: frozenset[str]) -> None:
    """Mark every record that shares ``(stage, task, rollout)`` with another one unhealthy."""
    if "rollout_duplicate_identity" in ignored:
        return
    groups: dict[tuple[Any, Any, Any], list[RolloutDigest]] = defaultdict(list)
    for digest in digests:
        groups[(digest.stage_index, digest.task_index, digest.rollout_index)].append(digest)
    for copies in groups.values():
        for digest in copies if len(copies) > 1 else []:
            digest.findings.append(
                Finding(
                    check="rollout_duplicate_identity",
                    subject=subject_of(digest.task_index, digest.rollout_index),
                    detail={"duplicate_count": len(copies)},
                )
            )
            digest.verdict = "unhealthy"


@dataclass(frozen=True)
class _Repeat:
    verdict: Verdict
    policy_calls_observed: bool
    successful_model_calls: int


def _repeats(records: list[RolloutDigest]) -> list[_Repeat]:
    """One repeat per rollout index; copies that disagree make it unobserved."""
    by_index: dict[Any, list[RolloutDigest]] = defaultdict(list)
    for record in records:
        by_index[record.rollout_index].append(record)
    out = []
    for copies in by_index.values():
        verdicts = {copy.verdict for copy in copies}
        out.append(
            _Repeat(
                verdict=verdicts.pop() if len(verdicts) == 1 else "unobserved",
                policy_calls_observed=all(copy.policy_calls_observed for copy in copies),
                successful_model_calls=max(copy.successful_model_calls for copy in copies),
            )
        )
    return out


def _task_checks(
    tasks: dict[Any, list[_Repeat]], ignored: frozenset[str]
) -> tuple[dict[Any, list[Finding]], dict[str, dict[str, int]]]:
    findings: dict[Any, list[Finding]] = defaultdict(list)
    coverage = {spec.id: {"evaluated": 0, "unobserved": 0, "ignored": 0} for spec in TASK_SPECS}
    for task, repeats in tasks.items():
        if "task_consistently_unhealthy" in ignored:
            coverage["task_consistently_unhealthy"]["ignored"] += 1
        else:
            judged = [r for r in repeats if r.verdict != "unobserved"]
            state = "evaluated" if len(judged) >= 2 else "unobserved"
            coverage["task_consistently_unhealthy"][state] += 1
            if len(judged) >= 2 and all(r.verdict == "unhealthy" for r in judged):
                detail = {"computable_repeats": len(judged)}
                findings[task].append(
                    Finding(check="task_consistently_unhealthy", subject=subject_of(task), detail=detail)
                )
        if "task_no_successful_model_calls" in ignored:
            coverage["task_no_successful_model_calls"]["ignored"] += 1
        elif repeats and all(r.policy_calls_observed for r in repeats):
            coverage["task_no_successful_model_calls"]["evaluated"] += 1
            if not any(r.successful_model_calls for r in repeats):
                findings[task].append(
                    Finding(
                        check="task_no_successful_model_calls",
                        subject=subject_of(task),
                        detail={"repeats": len(repeats)},
                    )
                )
        else:
            coverage["task_no_successful_model_calls"]["unobserved"] += 1
    return findings, coverage


def summarize(digests: list[RolloutDigest], ignored: frozenset[str]) -> dict[str, Any]:
    """The ``quality_summary.json`` document."""
    by_task: dict[Any, list[RolloutDigest]] = defaultdict(list)
    for digest in digests:
        by_task[digest.task_index].append(digest)
    tasks = {task: _repeats(records) for task, records in by_task.items()}
    task_findings, task_coverage = _task_checks(tasks, ignored)
    coverage = {spec.id: {"evaluated": 0, "unobserved": 0, "ignored": 0} for spec in CHECK_REGISTRY}
    for digest in digests:
        for spec in ROLLOUT_SPECS:
            state = (
                "ignored"
                if spec.id in ignored
                else "unobserved"
                if spec.id in digest.unobserved
                else "evaluated"
            )
            coverage[spec.id][state] += 1
    coverage.update(task_coverage)
    issues = Counter(f.check for d in digests for f in d.findings)
    issues.update(f.check for found in task_findings.values() for f in found)
    verdicts = Counter(d.verdict for d in digests)
    statuses: Counter[str] = Counter()
    for digest in digests:
        statuses.update(digest.errors_by_status)
    per_task = {}
    for task in sorted(tasks, key=lambda t: (isinstance(t, str), str(t))):
        counted = Counter(r.verdict for r in tasks[task])
        per_task[str(task)] = {
            "repeats": len(tasks[task]),
            **{v: counted[v] for v in ("healthy", "unhealthy", "unobserved")},
            "flags": [f.check for f in task_findings[task]],
        }
    return {
        "run": {
            "ignored_checks": sorted(ignored),
            "artifacts": {
                "records": len(digests),
                "captures": sum(d.capture_observed for d in digests),
                "coverage": coverage,
            },
            "verdicts": {v: verdicts[v] for v in ("healthy", "unhealthy", "unobserved")},
            "issues": {spec.id: issues[spec.id] for spec in CHECK_REGISTRY},
            "stats": {
                "model_call_errors": {
                    "total": sum(d.model_call_errors for d in digests),
                    "by_status": dict(sorted(statuses.items())),
                    "rollouts_affected": sum(bool(d.model_call_errors) for d in digests),
                    "ended_on_error": sum(d.ended_on_error for d in digests),
                },
                "duplicated_calls": {
                    "replayed": sum(d.duplicated_calls for d in digests),
                    "rollouts": sum(bool(d.duplicated_calls) for d in digests),
                },
                "tokens": {
                    "prompt": sum(d.transcript_prompt_tokens for d in digests),
                    "completion": sum(d.transcript_completion_tokens for d in digests),
                    "capture_prompt": sum(d.capture_prompt_tokens for d in digests),
                    "capture_completion": sum(d.capture_completion_tokens for d in digests),
                },
            },
        },
        "tasks": per_task,
    }


def _order(digest: RolloutDigest) -> tuple[tuple[int, Any], ...]:
    def part(value: Any) -> tuple[int, Any]:
        return (0, value) if isinstance(value, int) else (1, str(value))

    return part(digest.task_index), part(digest.rollout_index), part(digest.stage_index)


def write_reports(summary: dict[str, Any], digests: list[RolloutDigest], folder: Path) -> tuple[Path, Path]:
    """Write ``quality_summary.json`` and ``rollout_verdicts.jsonl`` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    summary_path, verdicts_path = folder / QUALITY_SUMMARY_FILENAME, folder / ROLLOUT_VERDICTS_FILENAME
    summary_path.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    with verdicts_path.open("wb") as out:
        for digest in sorted(digests, key=_order):
            row: dict[str, Any] = {
                TASK_INDEX_KEY: digest.task_index,
                ROLLOUT_INDEX_KEY: digest.rollout_index,
                "rollout_id": digest.rollout_id,
                "verdict": digest.verdict,
                "findings": [
                    f.model_dump(mode="json", exclude={"subject"}, exclude_none=True) for f in digest.findings
                ],
                "unobserved": digest.unobserved,
            }
            if digest.stage_index is not None:
                row["stage_index"] = digest.stage_index
            out.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
    return summary_path, verdicts_path


def run_health_checks(
    rollout_paths: Path | Sequence[Path],
    *,
    output_dir: Path | None = None,
    workers: int | None = None,
    ignored_checks: Sequence[str] = (),
) -> HealthCheckResult:
    """Check every record of ``rollout_paths`` and write both reports (into ``output_dir``, default
    the first file's folder). ``FileNotFoundError`` names a missing file; ``ValueError`` an unknown
    check id or ``workers`` < 1."""
    ignored = frozenset(normalize_ignored_checks(ignored_checks))
    paths = [rollout_paths] if isinstance(rollout_paths, Path) else [Path(p) for p in rollout_paths]
    if not paths:
        raise ValueError("at least one rollout JSONL path is required")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"Rollout JSONL not found: {path}")
    count = workers if workers is not None else min(os.cpu_count() or 1, MAX_WORKERS)
    if count < 1:
        raise ValueError("workers must be at least 1")
    digests = _map([_Job(line, ignored) for line in index_lines(paths)], count)
    flag_duplicate_identities(digests, ignored)
    summary = summarize(digests, ignored)
    summary_path, verdicts_path = write_reports(summary, digests, output_dir or paths[0].parent)
    return HealthCheckResult(
        summary=summary, rollouts=digests, summary_path=summary_path, verdicts_path=verdicts_path
    )
