"""The vocabulary of rollout health checks (NeMo Gym 0.7.0's ``nemo_gym.health``): what a check
is (:class:`CheckSpec`), what it reports (:class:`Finding`), one rollout's outcome
(:class:`RolloutDigest`) and a run's (:class:`HealthCheckResult`), and the registry of checks.

A check never emits a verdict; a rollout is ``unhealthy`` when any check found something,
``unobserved`` when some check could not run for lack of evidence, else ``healthy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_gym.collection.row_keys import ROLLOUT_ID_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

__all__ = ["ROLLOUT_ID_KEY", "ROLLOUT_INDEX_KEY", "TASK_INDEX_KEY"]

QUALITY_SUMMARY_FILENAME = "quality_summary.json"
ROLLOUT_VERDICTS_FILENAME = "rollout_verdicts.jsonl"

Verdict = Literal["healthy", "unhealthy", "unobserved"]


class CheckScope(StrEnum):
    """What a check judges: one rollout, one task's repeats, or the run."""

    ROLLOUT = "rollout"
    TASK = "task"
    RUN = "run"


class CheckSubject(StrEnum):
    """What a finding is about."""

    CHECK_EXECUTION = "check_execution"
    RECORD = "record"
    ROLLOUT = "rollout"
    AGENT_TURN = "agent_turn"
    MODEL_CALL = "model_call"
    TRAJECTORY_CAPTURE = "trajectory_capture"
    TASK = "task"


class CheckInput(StrEnum):
    """The evidence a check needs; without it the check is unobserved for that rollout."""

    RECORD = "record"
    TRAJECTORY = "trajectory"
    AGENT_TURNS = "agent_turns"
    BOUND_CALLS = "bound_calls"
    """Captured model calls that the rollout's turns reference."""
    OWNED_MODEL_CALLS = "owned_model_calls"
    """Captured model calls that its turns or agent invocations reference."""
    OBSERVED_MODEL_CALLS = "observed_model_calls"
    """Captured model calls, referenced or not."""
    REPEAT_VERDICTS = "repeat_verdicts"
    REPEAT_DIGESTS = "repeat_digests"


CALL_BINDING_INPUTS = frozenset({CheckInput.BOUND_CALLS, CheckInput.OWNED_MODEL_CALLS})


class CheckSpec(BaseModel):
    """One check: its stable id, scope, subject and the evidence it reads."""

    model_config = ConfigDict(frozen=True)

    id: str
    evaluation_scope: CheckScope
    subject: CheckSubject
    reads: frozenset[CheckInput]

    @field_validator("reads")
    @classmethod
    def _one_binding_view(cls, reads: frozenset[CheckInput]) -> frozenset[CheckInput]:
        if len(reads & CALL_BINDING_INPUTS) > 1:
            raise ValueError("a check reads either turn-bound or invocation-owned calls, not both")
        return reads


class Finding(BaseModel):
    """What a check found: the check, its subject (task and rollout), where, and details."""

    check: str
    subject: dict[str, int | str]
    locator: dict[str, int | str] | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class RolloutDigest(BaseModel):
    """One rollout record's verdict, findings and call statistics."""

    task_index: int | str
    rollout_index: int | str
    stage_index: int | str | None = None
    rollout_id: str
    verdict: Verdict
    findings: list[Finding]
    unobserved: list[str]
    capture_observed: bool
    policy_calls_observed: bool = False
    model_calls: int = 0
    successful_model_calls: int = 0
    model_call_errors: int = 0
    errors_by_status: dict[str, int] = Field(default_factory=dict)
    ended_on_error: bool = False
    duplicated_calls: int = 0
    transcript_prompt_tokens: int = 0
    transcript_completion_tokens: int = 0
    capture_prompt_tokens: int = 0
    capture_completion_tokens: int = 0


class HealthCheckResult(BaseModel):
    """A run's health: the summary written to ``quality_summary.json``, every rollout's digest,
    and the two report files."""

    summary: dict[str, Any]
    rollouts: list[RolloutDigest]
    summary_path: Path
    verdicts_path: Path


def _spec(check: str, scope: CheckScope, subject: CheckSubject, *reads: CheckInput) -> CheckSpec:
    return CheckSpec(id=check, evaluation_scope=scope, subject=subject, reads=frozenset(reads))


_R, _T = CheckScope.ROLLOUT, CheckScope.TASK
_RECORD, _TRAJ = CheckInput.RECORD, CheckInput.TRAJECTORY
CHECK_REGISTRY: tuple[CheckSpec, ...] = (
    _spec("check_execution_error", _R, CheckSubject.CHECK_EXECUTION, _RECORD),
    _spec("record_unreadable", _R, CheckSubject.RECORD, _RECORD),
    _spec("rollout_duplicate_identity", _R, CheckSubject.ROLLOUT, _RECORD),
    _spec("rollout_missing_agent_turns", _R, CheckSubject.ROLLOUT, _RECORD, _TRAJ, CheckInput.AGENT_TURNS),
    _spec(
        "rollout_ended_on_failed_model_call",
        _R,
        CheckSubject.ROLLOUT,
        _RECORD,
        _TRAJ,
        CheckInput.OBSERVED_MODEL_CALLS,
    ),
    _spec("agent_turn_hollow", _R, CheckSubject.AGENT_TURN, _RECORD, _TRAJ, CheckInput.AGENT_TURNS),
    _spec(
        "model_call_zero_completion_tokens",
        _R,
        CheckSubject.MODEL_CALL,
        _RECORD,
        _TRAJ,
        CheckInput.OWNED_MODEL_CALLS,
    ),
    _spec(
        "model_call_missing_token_counts",
        _R,
        CheckSubject.MODEL_CALL,
        _RECORD,
        _TRAJ,
        CheckInput.OWNED_MODEL_CALLS,
    ),
    _spec(
        "trajectory_capture_mismatch",
        _R,
        CheckSubject.TRAJECTORY_CAPTURE,
        _RECORD,
        _TRAJ,
        CheckInput.OWNED_MODEL_CALLS,
    ),
    _spec("model_call_failed", _R, CheckSubject.MODEL_CALL, _RECORD, _TRAJ, CheckInput.OWNED_MODEL_CALLS),
    _spec("rollout_token_count_mismatch", _R, CheckSubject.ROLLOUT, _RECORD, _TRAJ, CheckInput.BOUND_CALLS),
    _spec(
        "model_call_runaway_generation",
        _R,
        CheckSubject.MODEL_CALL,
        _RECORD,
        _TRAJ,
        CheckInput.OWNED_MODEL_CALLS,
    ),
    _spec("task_consistently_unhealthy", _T, CheckSubject.TASK, CheckInput.REPEAT_VERDICTS),
    _spec("task_no_successful_model_calls", _T, CheckSubject.TASK, CheckInput.REPEAT_DIGESTS),
)
ROLLOUT_SPECS = tuple(spec for spec in CHECK_REGISTRY if spec.evaluation_scope == CheckScope.ROLLOUT)
TASK_SPECS = tuple(spec for spec in CHECK_REGISTRY if spec.evaluation_scope == CheckScope.TASK)


def normalize_ignored_checks(checks: Sequence[str] | str | None) -> tuple[str, ...]:
    """Check ids to ignore, from a list or a comma-separated string, deduplicated in order;
    ``ValueError`` names any id that is not a check."""
    if checks is None:
        return ()
    raw = checks.split(",") if isinstance(checks, str) else checks
    ids = tuple(dict.fromkeys(check.strip() for check in raw if check.strip()))
    unknown = sorted(set(ids) - {spec.id for spec in CHECK_REGISTRY})
    if unknown:
        raise ValueError(
            f"Unknown rollout health check(s): {', '.join(unknown)} (known: {', '.join(s.id for s in CHECK_REGISTRY)})"
        )
    return ids


def subject_of(task_index: int | str, rollout_index: int | str | None = None) -> dict[str, int | str]:
    """A finding's subject: the task, and the rollout when the finding is about one."""
    subject: dict[str, int | str] = {TASK_INDEX_KEY: task_index}
    if rollout_index is not None:
        subject[ROLLOUT_INDEX_KEY] = rollout_index
    return subject
