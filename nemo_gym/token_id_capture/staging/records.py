"""The versioned wire records of worker-owned token staging.

An inference worker stages each call's token delta in framework storage (a
:class:`StagedCallRecord`), and answers with token-free :class:`CommitCoords`; the model server
publishes a :class:`CallRecord` row for it in the rollout's capture ledger; at rollout end the
framework assembles a :class:`RolloutReceipt` and verifies the staged rows against it
(:mod:`nemo_gym.token_id_capture.staging.rebuild`). All records refuse unknown fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, model_validator

from nemo_gym.token_id_capture.records import (
    LEDGER_ROW_MISSING_CHAIN_HASH_REASON,
    LEDGER_ROW_MISSING_RESPONSE_ID_REASON,
    UNCOMMITTED_CALL_REASON,
    UNRESOLVED_PARENT_REASON,
)
from nemo_gym.token_id_capture.staging.digest import (
    EMPTY_EXTRAS_DIGEST,
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    compute_extras_digest,
    compute_staging_digest,
)

__all__ = [
    "INVALID_COMMIT_COORDS_REASON",
    "LEDGER_ROW_MISSING_CHAIN_HASH_REASON",
    "LEDGER_ROW_MISSING_RESPONSE_ID_REASON",
    "UNCOMMITTED_CALL_REASON",
    "UNRESOLVED_PARENT_REASON",
    "WORKER_CAPTURE_FAILED_REASON",
    "WORKER_MISSING_COMMIT_COORDS_REASON",
    "CallRecord",
    "CaptureAdmission",
    "CaptureDisposition",
    "CaptureLedgerCommit",
    "CaptureMode",
    "CommitCoords",
    "ManifestFailure",
    "RolloutManifest",
    "RolloutReceipt",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedCallRecord",
    "StagedCallSnapshot",
    "staging_key",
]

CaptureDisposition = Literal["staged", "capture_failed"]
CaptureMode = Literal["token_in", "text"]
Identifier = Annotated[StrictStr, Field(min_length=1)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
DigestHex = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]

WORKER_MISSING_COMMIT_COORDS_REASON = "worker_response_missing_commit_coordinates"
WORKER_CAPTURE_FAILED_REASON = "worker_capture_failed"
INVALID_COMMIT_COORDS_REASON = "invalid_worker_commit_coordinates"

TERMINAL_SELECTED = "selected"
TERMINAL_NO_RECORDS = "no_records"
TERMINAL_DUPLICATE_CALL_ID = "duplicate_call_id"
TERMINAL_ORPHANED_ROW = "orphaned_row"
TERMINAL_NO_ROOT = "no_root"
TERMINAL_AMBIGUOUS = "ambiguous_terminal"


def staging_key(rollout_id: str, model_call_id: str) -> str:
    """The default key of a staged call: ``<rollout_id>/<model_call_id>``."""
    if not rollout_id or not model_call_id:
        raise ValueError("rollout_id and model_call_id must be non-empty")
    return f"{rollout_id}/{model_call_id}"


def _check_shape(parent_call_id: str | None, prev_len: int, mode: str | None, what: str) -> None:
    if parent_call_id is None and prev_len != 0:
        raise ValueError(f"a parentless {what} must have prev_len == 0")
    if parent_call_id is not None and prev_len == 0:
        raise ValueError(f"a child {what} must have prev_len > 0")
    if mode is not None and parent_call_id is None and mode != "text":
        raise ValueError(f"a parentless {what} must use text mode")
    if mode is not None and parent_call_id is not None and mode != "token_in":
        raise ValueError(f"a child {what} must use token_in mode")


if (STAGING_SCHEMA_VERSION, STAGING_DIGEST_VERSION, EXTRAS_DIGEST_VERSION) != (2, 2, 1):
    raise ImportError("the staging wire records below name versions 2, 2 and 1: update them with digest.py")


class _WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    schema_version: Literal[2] = 2  # STAGING_SCHEMA_VERSION


class _DigestWireModel(_WireModel):
    digest_version: Literal[2] = 2  # STAGING_DIGEST_VERSION
    extras_digest_version: Literal[1] = 1  # EXTRAS_DIGEST_VERSION


class CaptureAdmission(_WireModel):
    """What the model server tells the worker about one call: its identity and exact prefix.

    A ``token_in`` call continues ``parent_call_id`` from ``prev_len`` tokens, carried inline in
    ``required_prefix_token_ids`` or named as the staged records of ``staging_chain``; a ``text``
    call is a root with no prefix.
    """

    rollout_id: Identifier
    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    prev_len: NonNegativeInt = 0
    mode: CaptureMode
    required_prefix_token_ids: list[StrictInt] = Field(default_factory=list)
    staging_chain: list[str] = Field(default_factory=list)
    parent_chain_hash: DigestHex | None = None

    @model_validator(mode="after")
    def _prefix_contract(self) -> Self:
        if any(t < 0 for t in self.required_prefix_token_ids):
            raise ValueError("required_prefix_token_ids must be non-negative")
        if self.mode == "token_in":
            if self.parent_call_id is None or self.prev_len == 0:
                raise ValueError("a token_in admission needs a parent_call_id and prev_len > 0")
            if self.parent_chain_hash is None:
                raise ValueError("a token_in admission needs the parent's chain hash")
            if not self.staging_chain and len(self.required_prefix_token_ids) != self.prev_len:
                raise ValueError("required_prefix_token_ids must have prev_len tokens")
        elif (
            self.parent_call_id is not None
            or self.prev_len
            or self.required_prefix_token_ids
            or self.staging_chain
            or self.parent_chain_hash is not None
        ):
            raise ValueError("a text admission is a parentless root with no prefix")
        return self


class StagedCallBaseSnapshot(_DigestWireModel):
    """One staged call's token columns and metadata (extras excluded); the digest is rechecked."""

    rollout_id: Identifier
    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    mode: CaptureMode
    prev_len: NonNegativeInt
    delta_len: NonNegativeInt
    cum_len: NonNegativeInt
    weight_version: NonNegativeInt
    digest: DigestHex
    token_ids_delta: list[StrictInt]
    token_mask_delta: list[StrictFloat]
    generation_log_probs_delta: list[StrictFloat]
    extras_digest: DigestHex = EMPTY_EXTRAS_DIGEST
    chain_hash: DigestHex
    cumulative_hash: DigestHex

    @property
    def staging_key(self) -> str:
        """Where the call is staged (``<rollout_id>/<model_call_id>``)."""
        return staging_key(self.rollout_id, self.model_call_id)

    @model_validator(mode="after")
    def _digest_matches(self) -> Self:
        _check_shape(self.parent_call_id, self.prev_len, self.mode, "staged call")
        fields = self.model_dump(exclude={"digest", "extras"})
        if compute_staging_digest(**fields) != self.digest:
            raise ValueError("digest does not match the staged call's contents")
        return self


class StagedCallRecord(StagedCallBaseSnapshot):
    """One staged call with its optional engine extras (checked against ``extras_digest``)."""

    extras: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _extras_match(self) -> Self:
        if compute_extras_digest(self.extras) != self.extras_digest:
            raise ValueError("extras_digest does not match extras")
        return self


class StagedCallSnapshot(StagedCallRecord):
    """A staged call as a framework's source returns it."""


class StageResult(_WireModel):
    """A staging sink's answer: ``ok`` with the key, or the error."""

    ok: bool
    staging_key: Identifier | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.ok and self.staging_key is None:
            raise ValueError("a successful stage result needs staging_key")
        if not self.ok and not self.error:
            raise ValueError("a failed stage result needs an error")
        return self


class CommitCoords(_DigestWireModel):
    """The worker's token-free acknowledgement of one staged (or failed) call."""

    rollout_id: Identifier
    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    prev_len: NonNegativeInt
    delta_len: NonNegativeInt
    cum_len: NonNegativeInt
    weight_version: NonNegativeInt
    disposition: CaptureDisposition = "staged"
    digest: DigestHex | None = None
    extras_digest: DigestHex | None = None
    staging_key: Identifier | None = None
    chain_hash: DigestHex | None = None
    cumulative_hash: DigestHex | None = None

    @model_validator(mode="after")
    def _disposition_consistent(self) -> Self:
        _check_shape(self.parent_call_id, self.prev_len, None, "coordinate")
        if self.cum_len != self.prev_len + self.delta_len:
            raise ValueError("cum_len must equal prev_len + delta_len")
        staged = (self.digest, self.extras_digest, self.staging_key, self.chain_hash, self.cumulative_hash)
        if self.disposition == "staged":
            if any(v is None for v in staged):
                raise ValueError(
                    "staged coordinates need digest, extras_digest, staging_key, chain_hash and cumulative_hash"
                )
            if self.delta_len == 0:
                raise ValueError("staged coordinates need a non-empty delta")
        elif any(v is not None for v in staged):
            raise ValueError("capture_failed coordinates cannot carry staged payload metadata")
        elif self.delta_len:
            raise ValueError("capture_failed coordinates cannot carry token deltas")
        return self


class CallRecord(_DigestWireModel):
    """One committed call's token-free row in a rollout's capture ledger."""

    model_call_id: Identifier
    parent_call_id: Identifier | None = None
    prev_len: NonNegativeInt
    delta_len: NonNegativeInt
    cum_len: NonNegativeInt
    weight_version: NonNegativeInt
    digest: DigestHex
    extras_digest: DigestHex
    staging_key: Identifier
    mode: CaptureMode = "token_in"
    chain_hash: DigestHex
    cumulative_hash: DigestHex
    response_id: Identifier
    admitted_at: StrictFloat | None = None
    output_fingerprint: DigestHex | None = None
    continuation_fingerprint: DigestHex | None = None
    fingerprint_version: NonNegativeInt = 0

    @model_validator(mode="after")
    def _contiguous(self) -> Self:
        if self.delta_len == 0 or self.cum_len != self.prev_len + self.delta_len:
            raise ValueError("manifest lengths must describe a non-empty contiguous delta")
        _check_shape(self.parent_call_id, self.prev_len, self.mode, "manifest row")
        return self


class CaptureLedgerCommit(_WireModel):
    """A staged call handed to ``CaptureLedger.record``: its row plus what parent resolution needs."""

    rollout_id: Identifier
    record: CallRecord
    staging_chain: tuple[Identifier, ...] = ()
    request_items: list[dict[str, Any]]
    response_items: list[dict[str, Any]]


class ManifestFailure(_WireModel):
    """A call whose capture did not complete, and why."""

    model_call_id: Identifier
    reason: Identifier


class RolloutManifest(_WireModel):
    """A rollout's ledger: committed rows and failures (never token arrays)."""

    rollout_id: Identifier
    records: list[CallRecord] = Field(default_factory=list)
    failures: list[ManifestFailure] = Field(default_factory=list)


class RolloutReceipt(_DigestWireModel):
    """The token-free manifest a framework assembles at rollout end, naming the terminal call."""

    rollout_id: Identifier
    reward: float | None = None
    terminal_model_call_id: Identifier | None = None
    manifest: list[CallRecord] = Field(default_factory=list)
    capture_poisoned: bool = False
    failure_reason: str | None = None
    terminal_selection: Literal["declared", "response_id", "content", "heuristic"] | None = None
    terminal_attribution_reason: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        ids = [r.model_call_id for r in self.manifest]
        if len(ids) != len(set(ids)):
            raise ValueError("the receipt's manifest repeats a model_call_id")
        if self.terminal_model_call_id is not None and self.terminal_model_call_id not in ids:
            raise ValueError("terminal_model_call_id is not in the receipt's manifest")
        if not self.capture_poisoned:
            if self.failure_reason is not None:
                raise ValueError("an unpoisoned receipt cannot carry a failure_reason")
            if self.terminal_model_call_id is None or self.terminal_selection is None:
                raise ValueError(
                    "an unpoisoned receipt must name terminal_model_call_id and terminal_selection"
                )
        if self.terminal_selection is None:
            if self.terminal_model_call_id is not None:
                raise ValueError("terminal_model_call_id needs a terminal_selection")
            if self.failure_reason is None:
                raise ValueError(
                    "a receipt with no terminal selection must be poisoned with a failure_reason"
                )
        return self
