"""NeMo Gym's staged-capture wire records, as data (nothing stages them here)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

WORKER_MISSING_COMMIT_COORDS_REASON = "worker_response_missing_commit_coordinates"
WORKER_CAPTURE_FAILED_REASON = "worker_capture_failed"


class CaptureAdmission(BaseModel):
    """A model call admitted for capture by a staging inference worker."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(min_length=1)
    model_call_id: str = Field(min_length=1)
    parent_call_id: str | None = None
    prev_len: int = Field(default=0, ge=0)
    mode: Literal["token_in", "text"]
    required_prefix_token_ids: list[int] = Field(default_factory=list)
    staging_chain: list[str] = Field(default_factory=list)
    parent_chain_hash: str | None = None


class StageResult(BaseModel):
    """A worker's answer to a staging request."""

    ok: bool
    staging_key: str | None = None
    error: str | None = None


class StagedCallBaseSnapshot(BaseModel):
    """The identity of one staged call."""

    model_config = ConfigDict(extra="allow")

    rollout_id: str
    model_call_id: str
    parent_call_id: str | None = None
    mode: Literal["token_in", "text"] = "token_in"


class RolloutManifest(BaseModel):
    """A rollout's committed and failed capture records."""

    rollout_id: str
    records: list[dict[str, Any]] = Field(default_factory=list)
    failures: list[dict[str, Any]] = Field(default_factory=list)


class RolloutReceipt(BaseModel):
    """What the capture ledger hands back when a rollout ends."""

    model_config = ConfigDict(extra="allow")

    rollout_id: str
    reward: float | None = None
    terminal_model_call_id: str | None = None
    manifest: list[dict[str, Any]] = Field(default_factory=list)
    capture_poisoned: bool = False
    failure_reason: str | None = None
