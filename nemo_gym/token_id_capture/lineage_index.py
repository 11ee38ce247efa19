"""Request-time lineage of one rollout's calls: which committed call a request continues.

The resolution half of :mod:`nemo_gym.token_id_capture.lineage` (whose stores keep these per
rollout): a committed entry is indexed by its continuation fingerprint
(:func:`stamp_continuation`), and :class:`RolloutLineage` resolves a request to RESOLVED, ROOT or
UNRESOLVED by fingerprint and context digest; :class:`LineageIndex` holds the rollouts of one store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nemo_gym.token_id_capture.fingerprint import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    conversation_digest,
)
from nemo_gym.token_id_capture.protocols import LineageMatch, LineageResolution
from nemo_gym.token_id_capture.records import (
    LEDGER_ROW_MISSING_CHAIN_HASH_REASON,
    LEDGER_ROW_MISSING_RESPONSE_ID_REASON,
    ParentResolutionStatus,
    TokenEntry,
    cumulative_tokens,
)

if TYPE_CHECKING:
    from nemo_gym.token_id_capture.staging.records import CallRecord


# A ledger row's custody columns: the CallRecord's fields (its digest as ``staging_digest``,
# ``digest`` being the row's lineage digest) plus the staging chain.
_CUSTODY_RENAMES = {"digest": "staging_digest"}
_CUSTODY_FIELDS = (
    "parent_call_id", "staging_key", "weight_version", "prev_len", "delta_len", "cum_len", "digest",
    "extras_digest", "mode", "admitted_at", "chain_hash", "cumulative_hash", "response_id",
    "output_fingerprint", "continuation_fingerprint", "fingerprint_version",
)  # fmt: skip


def custody_columns(record: CallRecord, staging_chain: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """The ledger columns of one committed call (a lossless round trip with :func:`manifest_from_rows`)."""
    columns = {_CUSTODY_RENAMES.get(name, name): getattr(record, name) for name in _CUSTODY_FIELDS}
    columns["staging_chain"] = list(staging_chain)
    for name in ("output_fingerprint", "continuation_fingerprint"):
        columns[name] = columns[name] or None
    return columns


def manifest_from_rows(rollout_id: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rollout's manifest (``RolloutManifest`` as plain data) from its ledger rows.

    A custody row without a response id or chain digests is a writer's bug: it poisons the
    rollout as a failure rather than failing the manifest read.
    """
    from nemo_gym.token_id_capture.staging.records import CallRecord, ManifestFailure, RolloutManifest

    records, failures = [], []
    for row in rows:
        call_id = str(row["model_call_id"])
        if row.get("failure_reason") is not None:
            failures.append(ManifestFailure(model_call_id=call_id, reason=str(row["failure_reason"])))
        elif row.get("staging_key") is not None:
            if not row.get("response_id"):
                failures.append(
                    ManifestFailure(model_call_id=call_id, reason=LEDGER_ROW_MISSING_RESPONSE_ID_REASON)
                )
            elif not row.get("chain_hash") or not row.get("cumulative_hash"):
                failures.append(
                    ManifestFailure(model_call_id=call_id, reason=LEDGER_ROW_MISSING_CHAIN_HASH_REASON)
                )
            else:
                fields: dict[str, Any] = {
                    name: row.get(_CUSTODY_RENAMES.get(name, name)) for name in _CUSTODY_FIELDS
                }
                fields["fingerprint_version"] = int(fields["fingerprint_version"] or 0)
                records.append(CallRecord.model_validate({"model_call_id": call_id, **fields}))
    return RolloutManifest(rollout_id=rollout_id, records=records, failures=failures).model_dump(mode="json")


def stamp_continuation(entry: TokenEntry, request_items: list[dict[str, Any]]) -> TokenEntry:
    """Set what resolution finds the entry by: its continuation fingerprint and request context."""
    entry.continuation_fingerprint = assistant_fingerprint([*request_items, *entry.output_items])
    entry.continuation_context_len = len(request_items)
    entry.continuation_context_digest = conversation_digest(request_items)
    entry.fingerprint_version = FINGERPRINT_VERSION
    return entry


@dataclass
class LineageNode:
    """One committed call as the index knows it (``cum_tokens`` None: load them on a match)."""

    call_id: str
    cum_tokens: list[int] | None
    cum_len: int
    digest: str
    entry_offset: Any = -1
    context_len: int = 0
    context_digest: str = ""
    parent_call_id: str | None = None
    prompt_is_delta: bool = False
    staging_key: str = ""
    staging_chain: list[str] = field(default_factory=list)
    chain_hash: str = ""

    def continued_by(self, messages: list[dict[str, Any]]) -> bool:
        """Whether ``messages`` begins with this call's recorded request context, unchanged."""
        return (
            bool(self.context_digest)
            and len(messages) >= self.context_len
            and conversation_digest(messages[: self.context_len]) == self.context_digest
        )

    def match(self, tokens: list[int] | tuple[int, ...]) -> LineageMatch:
        """This node as a resolution's match, with the given cumulative tokens."""
        return LineageMatch(
            model_call_id=self.call_id,
            cumulative_token_ids=tuple(tokens),
            digest=self.digest,
            staging_chain=tuple(self.staging_chain),
            prev_len=self.cum_len,
            chain_hash=self.chain_hash,
        )


@dataclass
class RolloutLineage:
    """One rollout's append-only index of committed calls, by fingerprint and by call id."""

    by_fingerprint: dict[str, list[str]] = field(default_factory=dict)
    by_call_id: dict[str, LineageNode] = field(default_factory=dict)
    total_tokens: int = 0

    def resolve_node(
        self, messages: list[dict[str, Any]]
    ) -> tuple[ParentResolutionStatus, LineageNode | None, str]:
        """The decision and the winning node, without touching token arrays."""
        fingerprint = assistant_fingerprint(messages)
        if not fingerprint:
            return ParentResolutionStatus.ROOT, None, ""
        candidates = [
            node
            for call_id in dict.fromkeys(self.by_fingerprint.get(fingerprint) or [])
            if (node := self.by_call_id.get(call_id)) is not None and node.continued_by(messages)
        ]
        # Candidates with the same full token sequence are interchangeable; others are not.
        if (
            len(candidates) > 1
            and candidates[0].digest
            and len({(n.digest, n.cum_len) for n in candidates}) == 1
        ):
            candidates = [min(candidates, key=lambda n: n.call_id)]
        if len(candidates) != 1:
            return ParentResolutionStatus.UNRESOLVED, None, "ambiguous" if candidates else "no_match"
        return ParentResolutionStatus.RESOLVED, candidates[0], ""

    def resolve(self, messages: list[dict[str, Any]]) -> LineageResolution:
        """The request's parent decision (nodes must hold their tokens)."""
        status, node, reason = self.resolve_node(messages)
        if node is None:
            return LineageResolution(status, reason=reason)
        if node.cum_tokens is None:
            raise ValueError("this lineage node holds no tokens: the store must load them")
        return LineageResolution(status, match=node.match(node.cum_tokens))

    def _add(self, node: LineageNode, fingerprint: str) -> None:
        known = self.by_call_id.get(node.call_id)
        if known is not None:
            if known != node:
                raise ValueError(f"conflicting lineage record for model call {node.call_id}")
            return
        self.by_call_id[node.call_id] = node
        self.total_tokens += node.cum_len
        if fingerprint:
            self.by_fingerprint.setdefault(fingerprint, []).append(node.call_id)

    def add_entry(self, entry: TokenEntry, *, store_tokens: bool = True, entry_offset: Any = -1) -> None:
        """Index a committed entry (one without a fingerprint, or of another version, is skipped)."""
        if not entry.continuation_fingerprint:
            return
        if entry.fingerprint_version is not None and entry.fingerprint_version != FINGERPRINT_VERSION:
            return
        if entry.prompt_is_delta and store_tokens:
            raise ValueError("delta records need a lineage store backed by the durable log")
        tokens = cumulative_tokens(entry) if store_tokens else None
        node = LineageNode(
            call_id=entry.model_call_id,
            cum_tokens=tokens,
            cum_len=entry.cum_len if entry.cum_len is not None else len(cumulative_tokens(entry)),
            digest=entry.digest or "",
            entry_offset=entry_offset,
            context_len=entry.continuation_context_len,
            context_digest=entry.continuation_context_digest,
            parent_call_id=entry.parent_call_id,
            prompt_is_delta=entry.prompt_is_delta,
        )
        self._add(node, entry.continuation_fingerprint)

    def record(
        self,
        call_id: str,
        messages: list[dict[str, Any]],
        cum_tokens: list[int],
        digest: str,
        *,
        context_len: int | None = None,
        staging_key: str = "",
        parent_staging_chain: list[str] | None = None,
        cum_len: int | None = None,
        chain_hash: str = "",
    ) -> None:
        """Index a call from its request + output ``messages`` (``context_len``: request items;
        default all but the last)."""
        if context_len is None:
            context_len = max(len(messages) - 1, 0)
        node = LineageNode(
            call_id=call_id,
            cum_tokens=list(cum_tokens),
            cum_len=cum_len if cum_len is not None else len(cum_tokens),
            digest=digest,
            context_len=context_len,
            context_digest=conversation_digest(messages[:context_len]),
            staging_key=staging_key,
            staging_chain=list(parent_staging_chain or []),
            chain_hash=chain_hash,
        )
        self._add(node, assistant_fingerprint(messages))


class LineageIndex:
    """Worker-local lineage, bounded by rollouts and tokens (the oldest rollout goes first, never
    the only one; an evicted parent leaves its continuations unresolved, hence masked)."""

    def __init__(self, max_rollouts: int = 512, max_tokens: int = 8_000_000) -> None:
        self._max_rollouts = max_rollouts
        self._max_tokens = max_tokens
        self._rollouts: dict[str, RolloutLineage] = {}

    def for_rollout(self, rollout_id: str) -> RolloutLineage:
        """The rollout's lineage (created empty)."""
        lineage = self._rollouts.setdefault(rollout_id, RolloutLineage())
        while len(self._rollouts) > 1 and (
            len(self._rollouts) > self._max_rollouts or self.total_tokens > self._max_tokens
        ):
            self._rollouts.pop(next(iter(self._rollouts)))
        return lineage

    @property
    def total_tokens(self) -> int:
        """Tokens indexed across rollouts."""
        return sum(lineage.total_tokens for lineage in self._rollouts.values())

    def drop(self, rollout_id: str) -> None:
        """Forget a rollout (its records were retired)."""
        self._rollouts.pop(rollout_id, None)

    def clear(self) -> None:
        """Forget everything."""
        self._rollouts.clear()

    def __len__(self) -> int:
        return len(self._rollouts)
