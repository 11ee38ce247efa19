"""The contracts between capture, storage and trainers: sinks, sources, lineage resolvers, ledgers.

A :class:`TokenSink` receives each captured call's :class:`TokenEntry` (our file store, or a
trainer's own transport); ``put`` returns only once the entry is durable and visible to every
worker's :class:`LineageResolver`, so the next turn, on any worker, finds its parent. A sink may
also offer ``begin_call(rollout_id, model_call_id)``: a durable intent, so a call whose entry is
lost masks the rollout instead of leaving a silent hole. A :class:`TokenSource` is what a trainer
reads through: ``freeze`` gives an atomic :class:`TokenCaptureSnapshot`, ``drop`` retires exactly
that snapshot (by id and version) after durable hand-off. A :class:`CaptureLedger` is the
resolver of worker-owned staging: it records token-free rows and failures and serves the
rollout's manifest. :mod:`nemo_gym.token_id_capture.conformance` checks a transport against these.

The process-wide defaults below are set only by the process that owns them (a model server, or
a trainer's inference worker); a request's own capture context takes precedence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from nemo_gym.token_id_capture.records import ParentResolutionStatus, TokenEntry
from nemo_gym.token_id_capture.staging.records import CaptureLedgerCommit


@dataclass(frozen=True)
class TokenCaptureSnapshot:
    """One rollout's frozen entries, whether a call was lost, and the snapshot's identity."""

    rollout_id: str
    entries: tuple[TokenEntry, ...]
    incomplete: bool
    snapshot_id: str
    version: int


@dataclass(frozen=True)
class LineageMatch:
    """The one captured call a request continues (token-free for staged rows)."""

    model_call_id: str
    cumulative_token_ids: tuple[int, ...]
    digest: str
    staging_chain: tuple[str, ...] = ()
    prev_len: int = 0
    chain_hash: str = ""


@dataclass(frozen=True)
class LineageResolution:
    """A request's parent decision; ``match`` is set exactly when it is RESOLVED."""

    status: ParentResolutionStatus
    match: LineageMatch | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if (self.status == ParentResolutionStatus.RESOLVED) != (self.match is not None):
            raise ValueError(
                f"a {self.status.value} lineage decision {'needs' if self.match is None else 'cannot carry'} a match"
            )


@runtime_checkable
class LineageResolver(Protocol):
    """Finds, among committed entries, the one call a request continues; never guesses."""

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> LineageResolution:
        """ROOT (no model-authored history), RESOLVED (one verified parent) or UNRESOLVED."""
        ...

    def is_process_shared(self) -> bool:
        """Whether separate server workers see each other's committed entries."""
        ...

    async def close(self) -> None:
        """Release resources (idempotent)."""
        ...


# NeMo Gym 0.6.0's name for the same protocol (its vllm_model's tests import it).
LineageStore = LineageResolver


@runtime_checkable
class CaptureLedger(LineageResolver, Protocol):
    """The resolver of worker-owned staging: token-free call rows, failures and the manifest."""

    async def record(self, commit: CaptureLedgerCommit) -> None:
        """Publish a staged call (repeating identical data is a no-op, conflicting data fails)."""
        ...

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        """Record a call whose capture did not complete (it poisons the rollout)."""
        ...

    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        """``{"rollout_id", "records": [CallRecord...], "failures": [...]}`` as plain data."""
        ...

    async def has_rows(self, rollout_id: str) -> bool:
        """Whether any row, committed or failed, exists for the rollout."""
        ...


@runtime_checkable
class TokenSink(Protocol):
    """Where captured entries go."""

    async def put(self, entry: TokenEntry) -> None:
        """Store one entry durably, visible to every resolver, before returning."""
        ...

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record durably that a call of the rollout lost its capture (changes the version)."""
        ...

    async def close(self) -> None:
        """Release resources (idempotent)."""
        ...


@runtime_checkable
class TokenSource(Protocol):
    """What a trajectory builder freezes, reads and retires."""

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Freeze the rollout (idempotent) and return one atomic snapshot."""
        ...

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly that snapshot; False when the state changed after it."""
        ...

    async def close(self) -> None:
        """Release resources (idempotent)."""
        ...


@dataclass
class _Installed:
    sink: TokenSink | None = None
    source: TokenSource | None = None
    lineage_store: LineageResolver | None = None


# The one process-wide registry the capture protocol defines (a serving process installs its
# own sink; uvicorn workers are spawned, so each builds it from config instead of inheriting it).
_INSTALLED = _Installed()


def install_token_sink(sink: TokenSink | None) -> None:
    """Set (or clear with None) this process's default sink."""
    if sink is not None:
        missing = [m for m in ("put", "mark_incomplete", "close") if not callable(getattr(sink, m, None))]
        if missing:
            raise TypeError(f"the token sink {type(sink).__name__} lacks {', '.join(missing)}")
    _INSTALLED.sink = sink


def installed_token_sink() -> TokenSink | None:
    """This process's default sink, if one was installed."""
    return _INSTALLED.sink


def install_token_source(source: TokenSource | None) -> None:
    """Set (or clear) the caller-owned source of this process (never closed by us)."""
    _INSTALLED.source = source


def installed_token_source() -> TokenSource | None:
    """This process's source, if one was installed."""
    return _INSTALLED.source


def install_lineage_store(store: LineageResolver | None) -> None:
    """Set (or clear) this process's lineage resolver."""
    _INSTALLED.lineage_store = store


def installed_lineage_store() -> LineageResolver | None:
    """This process's lineage resolver, if one was installed."""
    return _INSTALLED.lineage_store
