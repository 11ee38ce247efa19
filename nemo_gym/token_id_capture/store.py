"""The file store of captured entries: one JSONL file per rollout, a sink and a source at once.

``<rollout_id>.tokens.jsonl`` holds the entries, each line fsynced before ``put`` returns (the
durability promise); ``.tokens.state.json`` holds the lifecycle (frozen, retired, incomplete,
snapshot id, version) and an index of each call's payload digest, rebuilt from the file's tail
when a writer stopped between the two; ``.tokens.intents`` the calls announced before dispatch;
``.tokens.incomplete`` the calls that lost their capture. An exclusive ``flock`` per rollout
serializes writers of one rollout across processes; different rollouts write concurrently.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

import orjson

from nemo_gym.token_id_capture.protocols import TokenCaptureSnapshot
from nemo_gym.token_id_capture.records import TokenEntry

logger = logging.getLogger(__name__)


def validate_rollout_id(rollout_id: str) -> str:
    """The id, if it is a safe file-name stem (ASCII letters, digits, ``.``, ``_``, ``-``)."""
    if not rollout_id or not all(c.isascii() and (c.isalnum() or c in "._-") for c in rollout_id):
        raise ValueError(f"invalid rollout id {rollout_id!r}: use ASCII letters, digits, '.', '_' and '-'")
    return rollout_id


def _fresh_state() -> dict[str, Any]:
    return {
        "frozen": False, "retired": False, "incomplete": False, "snapshot_id": "", "version": 0,
        "entry_digests": {}, "indexed_size": 0,
    }  # fmt: skip


def _fsync_append(path: Path, data: bytes) -> int:
    with path.open("ab") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
        return handle.tell()


class TokenCaptureStore:
    """Durable, rollout-keyed JSONL store of :class:`TokenEntry` records (a TokenSink and TokenSource)."""

    def __init__(self, root: str | Path) -> None:
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True)

    @property
    def root(self) -> Path:
        """The store's directory."""
        return self._root

    def _path(self, rollout_id: str, suffix: str) -> Path:
        return self._root / f"{validate_rollout_id(rollout_id)}.tokens{suffix}"

    def path_for(self, rollout_id: str) -> Path:
        """The rollout's entries file."""
        return self._path(rollout_id, ".jsonl")

    def incomplete_path_for(self, rollout_id: str) -> Path:
        """The rollout's lost-capture marker."""
        return self._path(rollout_id, ".incomplete")

    def intents_path_for(self, rollout_id: str) -> Path:
        """The rollout's announced calls."""
        return self._path(rollout_id, ".intents")

    def state_path_for(self, rollout_id: str) -> Path:
        """The rollout's lifecycle state."""
        return self._path(rollout_id, ".state.json")

    def lock_path_for(self, rollout_id: str) -> Path:
        """The rollout's lock file (kept, so every process locks one inode)."""
        return self._path(rollout_id, ".lock")

    @contextmanager
    def _locked(self, rollout_id: str, *, shared: bool = False) -> Iterator[None]:
        with self.lock_path_for(rollout_id).open("a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    # ---- state ---------------------------------------------------------------------------
    def _read_state(self, rollout_id: str) -> dict[str, Any]:
        path = self.state_path_for(rollout_id)
        if not path.exists():
            return _fresh_state()
        state = orjson.loads(path.read_bytes())
        if not isinstance(state, dict):
            raise ValueError(f"the token-capture state of rollout {rollout_id} is not an object: {path}")
        return {**_fresh_state(), **state}

    def _write_state(self, rollout_id: str, state: dict[str, Any], *, durable: bool = True) -> None:
        data = orjson.dumps(state, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE)
        fd, temporary = tempfile.mkstemp(dir=self._root, prefix=".tokens-state-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                if durable:
                    os.fsync(handle.fileno())
            os.replace(temporary, self.state_path_for(rollout_id))
        finally:
            Path(temporary).unlink(missing_ok=True)
        if durable:
            self._fsync_root()

    def _fsync_root(self) -> None:
        fd = os.open(self._root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _bump(self, state: dict[str, Any], by: int = 1) -> None:
        state["version"] = int(state["version"]) + by

    def _index_tail(self, rollout_id: str, state: dict[str, Any]) -> bool:
        """Index entries written after the state last was (a writer may have stopped in between).

        A torn last line is cut off; a call id written twice with different payloads marks the
        rollout incomplete and raises. Returns whether the index changed.
        """
        path = self.path_for(rollout_id)
        size = path.stat().st_size if path.exists() else 0
        indexed = int(state["indexed_size"])
        if not 0 <= indexed <= size:
            raise ValueError(f"the token-capture index of rollout {rollout_id} points past its file")
        if indexed == size:
            return False
        with path.open("rb") as handle:
            handle.seek(indexed)
            tail = handle.read()
        lines = tail.split(b"\n")
        offset, recovered = indexed, 0
        for number, line in enumerate(lines):
            payload = line.strip()
            if payload:
                try:
                    entry = TokenEntry.model_validate(orjson.loads(payload))
                except orjson.JSONDecodeError:
                    if any(rest.strip() for rest in lines[number + 1 :]):
                        raise
                    os.truncate(path, offset)
                    logger.warning("cut %d torn trailing bytes off %s", size - offset, path)
                    size = offset
                    break
                digest = hashlib.sha256(payload).hexdigest()
                known = state["entry_digests"].get(entry.model_call_id)
                if known is not None and known != digest:
                    state["incomplete"] = True
                    self._bump(state)
                    self._write_state(rollout_id, state)
                    raise ValueError(
                        f"model call {entry.model_call_id!r} of rollout {rollout_id!r} has two different payloads"
                    )
                state["entry_digests"][entry.model_call_id] = digest
                recovered += 1
            offset += len(line) + 1
        state["indexed_size"] = size
        self._bump(state, recovered)
        return True

    def _refuse_closed(self, rollout_id: str, state: dict[str, Any], *, frozen_too: bool) -> None:
        if state["retired"]:
            raise RuntimeError(f"token capture for rollout {rollout_id} is retired")
        if frozen_too and state["frozen"]:
            raise RuntimeError(f"token capture for rollout {rollout_id} is already frozen")

    # ---- the sink ------------------------------------------------------------------------
    def append(self, entry: TokenEntry) -> None:
        """Append one entry and fsync it (the same payload again is a no-op; a different one fails)."""
        payload = orjson.dumps(entry.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        digest = hashlib.sha256(payload).hexdigest()
        rollout_id = entry.rollout_id
        with self._locked(rollout_id):
            state = self._read_state(rollout_id)
            self._refuse_closed(rollout_id, state, frozen_too=True)
            changed = self._index_tail(rollout_id, state)
            known = state["entry_digests"].get(entry.model_call_id)
            if known == digest:
                if changed:
                    self._write_state(rollout_id, state)
                return
            if known is not None:
                state["incomplete"] = True
                self._bump(state)
                self._write_state(rollout_id, state)
                raise ValueError(
                    f"model call id {entry.model_call_id!r} was reused with a different payload in rollout {rollout_id!r}"
                )
            state["indexed_size"] = _fsync_append(self.path_for(rollout_id), payload + b"\n")
            state["entry_digests"][entry.model_call_id] = digest
            self._bump(state)
            # The entry line is durable; the index is rebuilt from the tail if this write is lost.
            self._write_state(rollout_id, state, durable=False)

    async def put(self, entry: TokenEntry) -> None:
        """:meth:`append` off the event loop."""
        await asyncio.to_thread(self.append, entry)

    def _mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        with self._locked(rollout_id):
            state = self._read_state(rollout_id)
            self._refuse_closed(rollout_id, state, frozen_too=False)
            state["incomplete"] = True
            self._bump(state)
            self._write_state(rollout_id, state)
            _fsync_append(self.incomplete_path_for(rollout_id), f"{model_call_id}\n".encode())
            self._fsync_root()

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record durably that a call of the rollout lost its capture (allowed after freeze)."""
        await asyncio.to_thread(self._mark_incomplete, rollout_id, model_call_id)

    def is_incomplete(self, rollout_id: str) -> bool:
        """Whether a call of the rollout lost its capture."""
        with self._locked(rollout_id, shared=True):
            return bool(self._read_state(rollout_id)["incomplete"])

    def _begin_call(self, rollout_id: str, model_call_id: str) -> None:
        with self._locked(rollout_id):
            self._refuse_closed(rollout_id, self._read_state(rollout_id), frozen_too=True)
            _fsync_append(self.intents_path_for(rollout_id), model_call_id.encode() + b"\n")

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Announce a call before it is dispatched: one whose entry never arrives masks the rollout."""
        await asyncio.to_thread(self._begin_call, rollout_id, model_call_id)

    # ---- the source ----------------------------------------------------------------------
    def freeze_now(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Freeze the rollout (once; later calls return the same snapshot identity) and read it."""
        with self._locked(rollout_id):
            state = self._read_state(rollout_id)
            self._refuse_closed(rollout_id, state, frozen_too=False)
            changed = self._index_tail(rollout_id, state)
            if not state["frozen"]:
                state.update(frozen=True, snapshot_id=uuid4().hex)
                self._bump(state)
                changed = True
            if changed:
                self._write_state(rollout_id, state)
            entries = tuple(self._read_entries_unlocked(rollout_id))
            recorded = {e.model_call_id for e in entries}
            intents = self.intents_path_for(rollout_id)
            dangling = intents.exists() and any(
                line.strip() and line.strip().decode() not in recorded
                for line in intents.read_bytes().splitlines()
            )
            return TokenCaptureSnapshot(
                rollout_id=rollout_id,
                entries=entries,
                incomplete=bool(state["incomplete"]) or dangling,
                snapshot_id=str(state["snapshot_id"]),
                version=int(state["version"]),
            )

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        """:meth:`freeze_now` off the event loop."""
        return await asyncio.to_thread(self.freeze_now, rollout_id)

    def _drop(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        with self._locked(rollout_id):
            state = self._read_state(rollout_id)
            if not state["frozen"] or state["snapshot_id"] != snapshot_id or int(state["version"]) != version:
                return False
            for path in (
                self.path_for(rollout_id),
                self.incomplete_path_for(rollout_id),
                self.intents_path_for(rollout_id),
            ):
                path.unlink(missing_ok=True)
            state.update(indexed_size=0, entry_digests={}, retired=True)
            self._write_state(rollout_id, state)
            return True

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly the snapshot consumed (payloads deleted, the state kept as a tombstone)."""
        return await asyncio.to_thread(self._drop, rollout_id, snapshot_id, version)

    async def close(self) -> None:
        """Nothing to release: every write was durable when it returned."""

    def delete(self, rollout_id: str) -> None:
        """Remove a rollout's records unconditionally (a rollout id about to be reused)."""
        with self._locked(rollout_id):
            for suffix in (".jsonl", ".incomplete", ".intents", ".state.json"):
                self._path(rollout_id, suffix).unlink(missing_ok=True)
            self._fsync_root()

    def sweep_retired(self, older_than_seconds: float) -> int:
        """Remove the tombstones of retired rollouts older than the cutoff; returns how many."""
        cutoff = time.time() - older_than_seconds
        removed = 0
        for state_path in self._root.glob("*.tokens.state.json"):
            rollout_id = state_path.name.removesuffix(".tokens.state.json")
            try:
                validate_rollout_id(rollout_id)
                with self._locked(rollout_id):
                    if state_path.stat().st_mtime > cutoff or not self._read_state(rollout_id)["retired"]:
                        continue
                    for suffix in (".state.json", ".intents", ".incomplete", ".lock"):
                        self._path(rollout_id, suffix).unlink(missing_ok=True)
                    removed += 1
            except (ValueError, FileNotFoundError):
                continue
        if removed:
            self._fsync_root()
        return removed

    def read_entries(self, rollout_id: str) -> list[TokenEntry]:
        """The rollout's entries in write order."""
        with self._locked(rollout_id, shared=True):
            return self._read_entries_unlocked(rollout_id)

    def _read_entries_unlocked(self, rollout_id: str) -> list[TokenEntry]:
        path = self.path_for(rollout_id)
        if not path.exists():
            return []
        return [
            TokenEntry.model_validate(orjson.loads(line))
            for line in path.read_bytes().splitlines()
            if line.strip()
        ]


def make_token_store(global_config_dict: Any) -> TokenCaptureStore | None:
    """The run's file store: None when capture is off, a custom sink is configured, or no directory."""
    from nemo_gym.token_id_capture.config import token_id_capture_config

    config = token_id_capture_config(global_config_dict)
    if not config.enabled or config.token_id_capture.sink is not None:
        return None
    directory = config.resolved_dir()
    return TokenCaptureStore(directory) if directory is not None else None
