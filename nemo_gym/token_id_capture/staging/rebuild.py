"""Verify a rollout's staged calls against its receipt and linearize the terminal chain.

Every snapshot must match its manifest row field for field and its own digest; the manifest
must form a graph whose children start where their parents end; the terminal's ancestry,
replayed from the root, must reproduce each row's chain hash and the terminal's cumulative hash.
Only then is the training row (token ids, 0/1 loss mask, log-probs, per-call weight versions)
returned. Extras are never read: their receipt-bound digests come back for the consumer to check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from nemo_gym.token_id_capture.staging.digest import (
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    compute_chain_hash,
    compute_staging_digest,
    hash_token_ids,
)
from nemo_gym.token_id_capture.staging.records import CallRecord, RolloutReceipt, StagedCallBaseSnapshot


class ReceiptVerificationError(ValueError):
    """A receipt or staged snapshot broke a custody invariant (``code`` names which)."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        super().__init__(f"{code}: {detail}")


class RebuildError(ReceiptVerificationError):
    """A verified manifest cannot form the declared terminal's ancestry."""


@dataclass(frozen=True)
class WeightVersionSpan:
    """The weight version of the tokens one call contributed (``[start, end)``)."""

    model_call_id: str
    start: int
    end: int
    weight_version: int


@dataclass(frozen=True)
class ExtrasCommitment:
    """What one selected call's extras must hash to."""

    model_call_id: str
    extras_digest_version: int
    extras_digest: str


@dataclass(frozen=True)
class LinearizedRow:
    """A verified terminal chain, ready to train on."""

    rollout_id: str
    token_ids: list[int]
    token_mask: list[float]
    logprobs: list[float]
    model_call_ids: list[str]
    prompt_len: int
    weight_versions: list[int]
    weight_version_spans: list[WeightVersionSpan]
    link_spans: list[tuple[str, int, int]] = field(default_factory=list)
    extras_commitments: list[ExtrasCommitment] = field(default_factory=list)

    @property
    def call_ids(self) -> list[str]:
        """Another name for ``model_call_ids``."""
        return self.model_call_ids


_COMPARED = (
    "model_call_id", "parent_call_id", "mode", "prev_len", "delta_len", "cum_len", "weight_version", "digest",
    "extras_digest", "chain_hash", "cumulative_hash",
)  # fmt: skip
_VERSIONS = ("schema_version", "digest_version", "extras_digest_version")


def _check_versions(receipt: RolloutReceipt) -> None:
    for code, got, want in (
        ("unsupported_schema", receipt.schema_version, STAGING_SCHEMA_VERSION),
        ("unsupported_digest", receipt.digest_version, STAGING_DIGEST_VERSION),
        ("unsupported_extras_digest", receipt.extras_digest_version, EXTRAS_DIGEST_VERSION),
    ):
        if got != want:
            raise ReceiptVerificationError(code, f"receipt version {got}")


def _check_snapshot(receipt: RolloutReceipt, record: CallRecord, snapshot: StagedCallBaseSnapshot) -> None:
    call_id = record.model_call_id
    if snapshot.rollout_id != receipt.rollout_id:
        raise ReceiptVerificationError(
            "wrong_rollout", f"snapshot {call_id} belongs to {snapshot.rollout_id}"
        )
    for name in _COMPARED:
        if getattr(snapshot, name) != getattr(record, name):
            raise ReceiptVerificationError(
                f"wrong_{name}",
                f"call {call_id}: snapshot {getattr(snapshot, name)!r}, manifest {getattr(record, name)!r}",
            )
    for name in _VERSIONS:
        values = {getattr(snapshot, name), getattr(record, name), getattr(receipt, name)}
        if len(values) != 1:
            raise ReceiptVerificationError(
                f"wrong_{name}", f"call {call_id}: {name} differs between snapshot, manifest and receipt"
            )
    try:
        digest = compute_staging_digest(**snapshot.model_dump(exclude={"digest", "extras"}))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ReceiptVerificationError("invalid_snapshot", f"call {call_id}: {exc}") from exc
    if digest != snapshot.digest:
        raise ReceiptVerificationError("corrupt_digest", f"call {call_id}: staged digest mismatch")


def _terminal_chain(receipt: RolloutReceipt, records: dict[str, CallRecord]) -> list[CallRecord]:
    for call_id, record in records.items():
        if record.parent_call_id is not None:
            parent = records.get(record.parent_call_id)
            if parent is None:
                raise RebuildError(
                    "missing_parent", f"call {call_id} names absent parent {record.parent_call_id}"
                )
            if parent.cum_len != record.prev_len:
                raise RebuildError(
                    "parent_length_mismatch",
                    f"call {call_id} starts at {record.prev_len}, its parent ends at {parent.cum_len}",
                )
        seen: set[str] = set()
        cursor: CallRecord | None = record
        while cursor is not None:
            if cursor.model_call_id in seen:
                raise RebuildError("lineage_cycle", f"a cycle reaches call {cursor.model_call_id}")
            seen.add(cursor.model_call_id)
            cursor = records.get(cursor.parent_call_id) if cursor.parent_call_id else None
    terminal = receipt.terminal_model_call_id
    if terminal is None or terminal not in records:
        raise RebuildError(
            "missing_terminal",
            f"terminal call {terminal} is absent" if terminal else "the receipt names no terminal call",
        )
    chain = [records[terminal]]
    while chain[-1].parent_call_id is not None:
        chain.append(records[chain[-1].parent_call_id])
    return chain[::-1]


def _carry_length(snapshot: StagedCallBaseSnapshot) -> int:
    mask = snapshot.token_mask_delta
    carry = next((i for i, m in enumerate(mask) if m != 0.0), len(mask))
    if any(m != 1.0 for m in mask[carry:]):
        raise RebuildError(
            "invalid_mask_order", f"call {snapshot.model_call_id}'s mask is not carry-then-generation"
        )
    if carry == len(mask):
        raise RebuildError(
            "empty_generation", f"call {snapshot.model_call_id} contains no policy-generated token"
        )
    return carry


def verify_and_linearize(
    receipt: RolloutReceipt, snapshots: Sequence[StagedCallBaseSnapshot]
) -> LinearizedRow:
    """The terminal chain's training row, once every custody check passes (else a ``ReceiptVerificationError``).

    ``snapshots`` are untrusted, one per manifest row, in manifest order.
    """
    if not isinstance(receipt, RolloutReceipt):
        raise TypeError("receipt must be a RolloutReceipt")
    _check_versions(receipt)
    if receipt.failure_reason is not None:
        raise ReceiptVerificationError("rollout_failed", receipt.failure_reason)
    if receipt.capture_poisoned:
        raise ReceiptVerificationError("capture_poisoned", "the receipt marks token capture as poisoned")
    if not receipt.manifest:
        raise ReceiptVerificationError("empty_manifest", "the receipt has no committed calls")
    records: dict[str, CallRecord] = {}
    for record in receipt.manifest:
        if record.model_call_id in records:
            raise ReceiptVerificationError("duplicate_manifest_row", "model_call_id values are not unique")
        records[record.model_call_id] = record
    if len({r.staging_key for r in receipt.manifest}) != len(receipt.manifest):
        raise ReceiptVerificationError("duplicate_staging_key", "staging keys are not unique")
    if len(snapshots) != len(receipt.manifest):
        raise ReceiptVerificationError(
            "row_count_mismatch", f"{len(snapshots)} snapshots for {len(receipt.manifest)} manifest rows"
        )
    by_id: dict[str, StagedCallBaseSnapshot] = {}
    for record, snapshot in zip(receipt.manifest, snapshots, strict=True):
        if not isinstance(snapshot, StagedCallBaseSnapshot):
            raise TypeError("snapshots must be StagedCallBaseSnapshot values")
        if snapshot.model_call_id in by_id:
            raise ReceiptVerificationError("duplicate_snapshot", "model_call_id values are not unique")
        if snapshot.model_call_id not in records:
            raise ReceiptVerificationError(
                "snapshot_identity_mismatch", f"snapshot {snapshot.model_call_id} is not in the manifest"
            )
        if snapshot.model_call_id != record.model_call_id:
            raise ReceiptVerificationError(
                "snapshot_order_mismatch",
                f"key {record.staging_key} expected {record.model_call_id}, got {snapshot.model_call_id}",
            )
        by_id[snapshot.model_call_id] = snapshot
        _check_snapshot(receipt, record, snapshot)
    chain = _terminal_chain(receipt, records)

    ids: list[int] = []
    mask: list[float] = []
    logprobs: list[float] = []
    spans: list[WeightVersionSpan] = []
    links: list[tuple[str, int, int]] = []
    prompt_len = 0
    chain_hash: str | None = None
    for index, record in enumerate(chain):
        snapshot = by_id[record.model_call_id]
        chain_hash = compute_chain_hash(chain_hash, snapshot.token_ids_delta)
        if record.chain_hash != chain_hash:
            raise RebuildError(
                "chain_hash_mismatch",
                f"call {record.model_call_id} does not extend its parent's staged chain",
            )
        carry = _carry_length(snapshot)
        start = len(ids)
        ids += snapshot.token_ids_delta
        mask += snapshot.token_mask_delta
        logprobs += snapshot.generation_log_probs_delta
        if index == 0:
            prompt_len = carry
        spans.append(WeightVersionSpan(record.model_call_id, start, len(ids), record.weight_version))
        links.append((record.model_call_id, carry, record.delta_len - carry))
    if not any(mask):
        raise RebuildError("empty_training_row", "the terminal chain has no generated tokens")
    if chain[-1].cumulative_hash != hash_token_ids(ids):
        raise RebuildError(
            "cumulative_hash_mismatch",
            f"terminal call {chain[-1].model_call_id}'s cumulative hash does not cover the row",
        )
    return LinearizedRow(
        rollout_id=receipt.rollout_id,
        token_ids=ids,
        token_mask=mask,
        logprobs=logprobs,
        model_call_ids=[r.model_call_id for r in chain],
        prompt_len=prompt_len,
        weight_versions=[r.weight_version for r in chain],
        weight_version_spans=spans,
        link_spans=links,
        extras_commitments=[
            ExtrasCommitment(r.model_call_id, r.extras_digest_version, r.extras_digest) for r in chain
        ],
    )


def linearize(
    rollout_id: str,
    snapshots: list[StagedCallBaseSnapshot],
    manifest: list[CallRecord],
    *,
    terminal_hint: str | None = None,
) -> LinearizedRow:
    """:func:`verify_and_linearize` with a receipt declaring ``terminal_hint``."""
    if terminal_hint is None:
        raise ReceiptVerificationError("missing_terminal", "the receipt names no terminal call")
    receipt = RolloutReceipt(
        rollout_id=rollout_id,
        terminal_model_call_id=terminal_hint,
        manifest=manifest,
        terminal_selection="declared",
    )
    return verify_and_linearize(receipt, snapshots)
