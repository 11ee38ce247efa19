"""The per-call capture context NeMo Gym's model adapters consult (``current_capture_context()``).

A context exists only while a call is being captured for training. nemo_gym does not capture
calls this way (see :mod:`nemo_gym.token_id_capture`), so outside tests that set one with
:func:`set_token_sink` there is none, and adapters take their ordinary path.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

# Request-body fields NeMo Gym's capture adds for an inference worker that stages tokens itself.
NG_CAPTURE_FIELD = "ng_capture"
NG_COMMIT_COORDS_FIELD = "ng_commit_coords"


@dataclass
class CaptureContext:
    """One model call being captured: its rollout, its id, and where its tokens go."""

    rollout_id: str
    model_call_id: str
    token_sink: Any = None
    lineage_store: Any = None
    model: str = ""
    committed: bool = False
    delta_records: bool = False
    prefix_requested: bool = False
    prefix_supplied: bool = False
    parent_resolution: Any = None
    external_staging: bool = False
    capture_admission: Any = None
    admitted_at: float | None = None
    parent_tokens: list[int] = field(default_factory=list)


_current: ContextVar[CaptureContext | None] = ContextVar("nemo_gym_token_capture", default=None)


def current_capture_context() -> CaptureContext | None:
    """The call being captured in this request, or None (always None unless one was set)."""
    return _current.get()


def set_token_sink(context: CaptureContext) -> Token[CaptureContext | None]:
    """Make ``context`` the current capture for this task; returns the token for :func:`reset_token_sink`."""
    return _current.set(context)


def reset_token_sink(token: Token[CaptureContext | None]) -> None:
    """Undo a :func:`set_token_sink`."""
    _current.reset(token)


def installed_token_sink() -> Any:
    """A process-wide token sink: none in nemo_gym."""
    return None


def installed_lineage_store() -> Any:
    """A process-wide lineage store: none in nemo_gym."""
    return None


async def resolve_parent(request_messages: list[dict[str, Any]]) -> None:
    """Find the captured call this request continues: nothing to find without a capture ledger."""


async def register_call_intent() -> None:
    """Announce a call to the capture ledger: there is none here."""


async def capture_tokens(response: Any, *, request_messages: list[dict[str, Any]] | None = None) -> None:
    """Record a response's tokens in the current capture: nothing is captured here (token IDs
    travel on the response items, docs/TOKEN_IDS.md)."""
