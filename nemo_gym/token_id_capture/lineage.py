"""Which captured call a request continues: request-time lineage, per rollout.

A committed entry is indexed by its continuation fingerprint (the model-authored turns of its
request plus its own output, :func:`stamp_continuation`). A later request whose model-authored
turns hash the same, and whose first ``context_len`` items still hash to the recorded context
digest (nothing summarized, redacted or rewritten), continues that call: RESOLVED, with the
parent's cumulative tokens (what the engine's prompt must begin with). A request with no
model-authored turn is a ROOT; anything else, including two candidates with different token
sequences, is UNRESOLVED. The builder re-verifies every claimed link by digest, so a resolver
only ever has to be safe, never clever.

Stores: :class:`InMemoryLineageStore` (one worker, bounded; tests and development),
:class:`IncrementalLineageStore` (any committed-entry backend behind two hooks) and
:class:`FileLineageStore` (over :class:`~nemo_gym.token_id_capture.store.TokenCaptureStore`'s
files, shared by every worker of a machine, and the capture ledger of worker-owned staging).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from nemo_gym.token_id_capture.fingerprint import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    canonicalize_tool_arguments,
    conversation_digest,
)
from nemo_gym.token_id_capture.protocols import LineageMatch, LineageResolution
from nemo_gym.token_id_capture.records import (
    ParentResolutionStatus,
    TokenEntry,
    compute_digest,
)

if TYPE_CHECKING:
    from nemo_gym.token_id_capture.staging.records import CaptureLedgerCommit

from nemo_gym.token_id_capture.lineage_index import (
    LineageIndex,
    LineageNode,
    RolloutLineage,
    custody_columns,
    manifest_from_rows,
    stamp_continuation,
)

__all__ = [
    "FileLineageStore",
    "IncrementalLineageStore",
    "InMemoryLineageStore",
    "LineageIndex",
    "LineageNode",
    "RolloutLineage",
    "canonicalize_tool_arguments",
    "stamp_continuation",
]


def _ledger_row(commit: CaptureLedgerCommit) -> dict[str, Any]:
    request = list(commit.request_items)
    return {
        "model_call_id": commit.record.model_call_id,
        "fingerprint": assistant_fingerprint(request + list(commit.response_items)),
        "context_len": len(request),
        "context_digest": conversation_digest(request),
        "digest": commit.record.cumulative_hash,
        **custody_columns(commit.record, commit.staging_chain),
    }


class InMemoryLineageStore:
    """A worker-local resolver and ledger (tests, single-worker development; not shared)."""

    def __init__(self, max_rollouts: int = 512, max_tokens: int = 8_000_000) -> None:
        self.index = LineageIndex(max_rollouts=max_rollouts, max_tokens=max_tokens)
        self._ledgers: dict[str, list[dict[str, Any]]] = {}

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> LineageResolution:
        """The request's parent among entries put here."""
        return self.index.for_rollout(rollout_id).resolve(request_items)

    async def put(self, entry: TokenEntry) -> None:
        """Index one committed entry."""
        self.index.for_rollout(entry.rollout_id).add_entry(entry)

    def is_process_shared(self) -> bool:
        """No: the index lives in this process."""
        return False

    async def record(self, commit: CaptureLedgerCommit) -> None:
        """Publish a staged call (identical repeats are no-ops)."""
        rows = self._ledgers.setdefault(commit.rollout_id, [])
        row = {
            "model_call_id": commit.record.model_call_id,
            **custody_columns(commit.record, commit.staging_chain),
        }
        known = next((r for r in rows if r["model_call_id"] == row["model_call_id"]), None)
        if known is not None:
            if known != row:
                raise ValueError(f"conflicting lineage record for model call {row['model_call_id']}")
            return
        self.index.for_rollout(commit.rollout_id).record(
            commit.record.model_call_id,
            [*commit.request_items, *commit.response_items],
            [],
            commit.record.cumulative_hash,
            context_len=len(commit.request_items),
            staging_key=commit.record.staging_key,
            parent_staging_chain=list(commit.staging_chain),
            cum_len=commit.record.cum_len,
            chain_hash=commit.record.chain_hash,
        )
        rows.append(row)

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        """Record a failed call (identical repeats are no-ops)."""
        rows = self._ledgers.setdefault(rollout_id, [])
        row = {"model_call_id": model_call_id, "failure_reason": reason}
        if row not in rows:
            rows.append(row)

    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        """The rollout's manifest."""
        return manifest_from_rows(rollout_id, list(self._ledgers.get(rollout_id) or []))

    async def has_rows(self, rollout_id: str) -> bool:
        """Whether anything was recorded for the rollout."""
        return bool(self._ledgers.get(rollout_id)) or bool(self.index.for_rollout(rollout_id).by_call_id)

    async def close(self) -> None:
        """Forget everything."""
        self.index.clear()
        self._ledgers.clear()


class IncrementalLineageStore:
    """A resolver over any backend of committed entries, through two hooks.

    ``_fetch_new_entries(rollout_id, cursor)`` returns ``([(entry, ref), ...], new_cursor)``: the
    entries committed since ``cursor`` (None: from the start), each with a ``ref`` that
    ``_load_entry(rollout_id, ref)`` can load again; raise :class:`CursorReset` when the cursor
    no longer describes the backend. Optional: ``_load_entries`` (a batch), ``_read_locked`` (a
    lock held around fetch and resolve). The index keeps metadata only; a match loads just the
    winner's token chain and checks it against its digest.
    """

    class CursorReset(Exception):
        """The cursor no longer describes the backend: fetch from the start."""

    def __init__(self, *, max_cached_rollouts: int = 65536, max_cached_tokens: int = 8_000_000) -> None:
        if max_cached_rollouts < 1 or max_cached_tokens < 1:
            raise ValueError("max_cached_rollouts and max_cached_tokens must be positive")
        self._max_cached_rollouts = max_cached_rollouts
        self._max_cached_tokens = max_cached_tokens
        self._cache: OrderedDict[str, tuple[Any, dict[str, Any], RolloutLineage]] = OrderedDict()
        self._cache_guard = threading.Lock()
        self._rollout_locks = tuple(threading.Lock() for _ in range(64))

    def _fetch_new_entries(self, rollout_id: str, cursor: Any) -> tuple[list[tuple[TokenEntry, Any]], Any]:
        raise NotImplementedError

    def _load_entry(self, rollout_id: str, ref: Any) -> TokenEntry:
        raise NotImplementedError

    def _load_entries(self, rollout_id: str, refs: list[Any]) -> list[TokenEntry]:
        return [self._load_entry(rollout_id, ref) for ref in refs]

    def _read_locked(self, rollout_id: str) -> Any:
        return nullcontext()

    def _refresh(self, rollout_id: str) -> tuple[dict[str, Any], RolloutLineage]:
        with self._cache_guard:
            cursor, refs, lineage = self._cache.get(rollout_id, (None, {}, RolloutLineage()))
        try:
            items, cursor = self._fetch_new_entries(rollout_id, cursor)
        except IncrementalLineageStore.CursorReset:
            refs, lineage = {}, RolloutLineage()
            items, cursor = self._fetch_new_entries(rollout_id, None)
        for entry, ref in items:
            refs[entry.model_call_id] = ref
            lineage.add_entry(entry, store_tokens=False, entry_offset=ref)
        with self._cache_guard:
            self._cache[rollout_id] = (cursor, refs, lineage)
            self._cache.move_to_end(rollout_id)
            while len(self._cache) > self._max_cached_rollouts:
                self._cache.popitem(last=False)
        return refs, lineage

    def _materialize(
        self, rollout_id: str, node: LineageNode, refs: dict[str, Any], lineage: RolloutLineage
    ) -> list[int]:
        """The node's cumulative tokens, rebuilt through its delta chain and checked by digest."""
        chain = [node]
        while chain[-1].prompt_is_delta:
            parent_id = chain[-1].parent_call_id
            parent = lineage.by_call_id.get(parent_id) if parent_id else None
            if parent is None or parent in chain or len(chain) > 10_000:
                raise ValueError(f"the delta chain of model call {node.call_id} is broken")
            chain.append(parent)
        chain.reverse()
        missing = [n.call_id for n in chain if n.call_id not in refs]
        if missing:
            raise ValueError(f"lineage node {missing[0]} has no backend reference")
        tokens: list[int] = []
        for expected, entry in zip(
            chain, self._load_entries(rollout_id, [refs[n.call_id] for n in chain]), strict=True
        ):
            if entry.model_call_id != expected.call_id or entry.prompt_is_delta != expected.prompt_is_delta:
                raise ValueError(f"the stored entry of {expected.call_id} disagrees with its index")
            tokens += [*entry.prompt_token_ids, *entry.generation_token_ids]
        if node.digest and compute_digest(tokens) != node.digest:
            raise ValueError(f"the loaded tokens of model call {node.call_id} fail their digest")
        return tokens

    def _resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> LineageResolution:
        lock = self._rollout_locks[hash(rollout_id) % len(self._rollout_locks)]
        with lock, self._read_locked(rollout_id):
            refs, lineage = self._refresh(rollout_id)
            status, node, reason = lineage.resolve_node(request_items)
            if node is None:
                return LineageResolution(status, reason=reason)
            tokens = (
                node.cum_tokens
                if node.cum_tokens is not None
                else self._materialize(rollout_id, node, refs, lineage)
            )
            return LineageResolution(status, match=LineageMatch(node.call_id, tuple(tokens), node.digest))

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> LineageResolution:
        """The request's parent among the backend's committed entries."""
        return await asyncio.to_thread(self._resolve, rollout_id, request_items)

    def is_process_shared(self) -> bool:
        """Yes: the backend is the shared source of truth."""
        return True

    async def close(self) -> None:
        """Drop the cache."""
        with self._cache_guard:
            self._cache.clear()


class FileLineageStore(IncrementalLineageStore):
    """Lineage over a :class:`TokenCaptureStore` directory, and the ledger of worker-owned staging.

    Entries are read from the store's JSONL under its shared lock (a committed ``put`` is
    visible at once). Staged calls' token-free rows go to ``<rollout_id>.lineage.jsonl`` beside
    them, appended and fsynced under the same per-rollout lock.
    """

    def __init__(
        self, root: str | Path, *, max_cached_rollouts: int = 65536, max_cached_tokens: int = 8_000_000
    ) -> None:
        from nemo_gym.token_id_capture.store import TokenCaptureStore

        super().__init__(max_cached_rollouts=max_cached_rollouts, max_cached_tokens=max_cached_tokens)
        self._store = TokenCaptureStore(root)
        self._ledger_root = Path(root)
        self._rows: dict[str, tuple[int, int, list[dict[str, Any]]]] = {}

    def _read_locked(self, rollout_id: str) -> Any:
        return self._store._locked(rollout_id, shared=True)

    def _fetch_new_entries(self, rollout_id: str, cursor: Any) -> tuple[list[tuple[TokenEntry, Any]], Any]:
        path = self._store.path_for(rollout_id)
        if not path.exists():
            if cursor is not None:
                raise IncrementalLineageStore.CursorReset
            return [], None
        stat = path.stat()
        inode, offset = cursor if cursor is not None else (stat.st_ino, 0)
        if inode != stat.st_ino or not 0 <= offset <= stat.st_size:
            raise IncrementalLineageStore.CursorReset
        items = []
        with path.open("rb") as handle:
            handle.seek(offset)
            while line := handle.readline():
                if line.strip():
                    items.append((TokenEntry.model_validate(orjson.loads(line)), offset))
                offset = handle.tell()
        return items, (inode, offset)

    def _load_entries(self, rollout_id: str, refs: list[Any]) -> list[TokenEntry]:
        with self._store.path_for(rollout_id).open("rb") as handle:
            loaded = []
            for ref in refs:
                handle.seek(ref)
                loaded.append(TokenEntry.model_validate(orjson.loads(handle.readline())))
            return loaded

    def _load_entry(self, rollout_id: str, ref: Any) -> TokenEntry:
        return self._load_entries(rollout_id, [ref])[0]

    # ---- the capture ledger --------------------------------------------------------------
    def _ledger_path(self, rollout_id: str) -> Path:
        from nemo_gym.token_id_capture.store import validate_rollout_id

        return self._ledger_root / f"{validate_rollout_id(rollout_id)}.lineage.jsonl"

    @contextmanager
    def _locked(self, rollout_id: str) -> Iterator[None]:
        with self._store._locked(rollout_id):
            yield

    def _read(self, rollout_id: str) -> list[dict[str, Any]]:
        """The rollout's ledger rows (cached through the last offset read)."""
        path = self._ledger_path(rollout_id)
        if not path.exists():
            self._rows.pop(rollout_id, None)
            return []
        stat = path.stat()
        inode, offset, rows = self._rows.get(rollout_id, (stat.st_ino, 0, []))
        if inode != stat.st_ino or offset > stat.st_size:
            inode, offset, rows = stat.st_ino, 0, []
        if offset < stat.st_size:
            rows = list(rows)
            with path.open("rb") as handle:
                handle.seek(offset)
                for line in handle:
                    if line.strip():
                        row = json.loads(line)
                        if not isinstance(row, dict):
                            raise ValueError(f"a ledger row of rollout {rollout_id} is not an object: {path}")
                        rows.append(row)
                offset = handle.tell()
            self._rows[rollout_id] = (inode, offset, rows)
        return rows

    def _append(self, rollout_id: str, row: dict[str, Any]) -> None:
        path = self._ledger_path(rollout_id)
        created = not path.exists()
        with path.open("ab") as handle:
            handle.write(json.dumps(row, sort_keys=True, separators=(",", ":")).encode() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        if created:
            self._store._fsync_root()
        self._read(rollout_id)

    def _resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> LineageResolution:
        resolution = super()._resolve(rollout_id, request_items)
        if resolution.status != ParentResolutionStatus.UNRESOLVED:
            return resolution
        match = self._resolve_row(rollout_id, request_items)
        return LineageResolution(ParentResolutionStatus.RESOLVED, match=match) if match else resolution

    def _resolve_row(self, rollout_id: str, request_items: list[dict[str, Any]]) -> LineageMatch | None:
        fingerprint = assistant_fingerprint(request_items)
        if not fingerprint:
            return None
        with self._locked(rollout_id):
            rows = [
                r for r in self._read(rollout_id)
                if r.get("fingerprint") == fingerprint and r.get("fingerprint_version") == FINGERPRINT_VERSION
            ]  # fmt: skip
        if len(rows) != 1:
            return None
        row = rows[0]
        context_len = int(row["context_len"])
        if (
            len(request_items) < context_len
            or conversation_digest(request_items[:context_len]) != row["context_digest"]
        ):
            return None
        return LineageMatch(
            model_call_id=str(row["model_call_id"]),
            cumulative_token_ids=tuple(int(t) for t in row.get("cumulative_token_ids") or ()),
            digest=str(row["digest"]),
            staging_chain=tuple(row.get("staging_chain") or ()),
            prev_len=int(row.get("cum_len") or 0),
            chain_hash=str(row.get("chain_hash") or ""),
        )

    def _record(self, commit: CaptureLedgerCommit) -> None:
        row = _ledger_row(commit)
        with self._locked(commit.rollout_id):
            known = [r for r in self._read(commit.rollout_id) if r["model_call_id"] == row["model_call_id"]]
            if known:
                if known[0] != row:
                    raise ValueError(f"conflicting lineage record for model call {row['model_call_id']}")
                return
            self._append(commit.rollout_id, row)

    async def record(self, commit: CaptureLedgerCommit) -> None:
        """Publish a staged call (durable and visible to every worker on return)."""
        await asyncio.to_thread(self._record, commit)

    def _record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        # No fingerprint: a failure row can never resolve as a parent.
        row = {"model_call_id": model_call_id, "failure_reason": reason}
        with self._locked(rollout_id):
            if row not in self._read(rollout_id):
                self._append(rollout_id, row)

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        """Record a call whose capture failed (identical repeats are no-ops)."""
        await asyncio.to_thread(self._record_failure, rollout_id, model_call_id, reason)

    def _manifest(self, rollout_id: str) -> dict[str, Any]:
        with self._locked(rollout_id):
            rows = list(self._read(rollout_id))
        return manifest_from_rows(rollout_id, rows)

    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        """The rollout's token-free manifest."""
        return await asyncio.to_thread(self._manifest, rollout_id)

    def _has_rows(self, rollout_id: str) -> bool:
        with self._locked(rollout_id):
            return bool(self._read(rollout_id))

    async def has_rows(self, rollout_id: str) -> bool:
        """Whether any ledger row exists for the rollout."""
        return await asyncio.to_thread(self._has_rows, rollout_id)
