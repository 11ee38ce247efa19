"""NeMo Gym's token-capture interfaces (sinks, sources, lineage resolvers), for type checks only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from nemo_gym.token_id_capture.records import TokenEntry


@runtime_checkable
class TokenSink(Protocol):
    """Where a model server would write each captured call's tokens."""

    async def write(self, entry: TokenEntry) -> None:
        """Store one entry."""
        ...

    async def mark_incomplete(self, rollout_id: str, reason: str) -> None:
        """Record that a call of this rollout was lost."""
        ...


@runtime_checkable
class LineageResolver(Protocol):
    """What finds the captured call a request continues."""

    async def resolve(self, rollout_id: str, messages: list[dict[str, Any]]) -> Any:
        """The parent of a request, if one was captured."""
        ...


@dataclass(frozen=True)
class TokenCaptureSnapshot:
    """A frozen view of one rollout's captured entries."""

    rollout_id: str
    entries: list[TokenEntry] = field(default_factory=list)
    incomplete: bool = False
    snapshot_id: str = ""


@runtime_checkable
class TokenSource(Protocol):
    """What a consumer reads captured entries from."""

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        """An atomic snapshot of a rollout's entries."""
        ...
