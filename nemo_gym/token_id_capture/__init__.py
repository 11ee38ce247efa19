"""NeMo Gym's training-token capture interface (``nemo_gym.token_id_capture``), as far as this
project serves it.

NeMo Gym can record each model call's token IDs in a per-rollout store on the model server
(``/ng-rollout/<id>/training-token-capture/...`` paths, a ``token_id_capture:`` config block) and
rebuild the rollout from it. nemo_gym carries token IDs on the response items instead
(``return_token_id_information: true``, spliced across turns: docs/TOKEN_IDS.md), so the capture
ledger itself is not implemented here: the config block is read and a run that turns capture on
is refused at start with that explanation, never silently ignored. What model adapters call on
every request works: :func:`current_capture_context` is None (no call is being captured), and
the capture hooks of the model base do nothing. NeMo Gym's capture components (lineage and token
stores, staging handlers, engine adapters) exist by name, so code that imports them loads; any
use of one raises :class:`TokenIdCaptureUnavailable` with the same explanation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_gym.token_id_capture.config import (
        TOKEN_ID_CAPTURE_BLOCK,
        TokenIdCaptureConfig,
        TokenIdCaptureSettings,
        TokenIdCaptureUnavailable,
        token_id_capture_config,
    )
    from nemo_gym.token_id_capture.consumer import trajectories_from_source
    from nemo_gym.token_id_capture.lineage import FileLineageStore, InMemoryLineageStore
    from nemo_gym.token_id_capture.protocols import (
        LineageResolver,
        TokenCaptureSnapshot,
        TokenSink,
        TokenSource,
    )
    from nemo_gym.token_id_capture.records import UNCOMMITTED_CALL_REASON, ParentResolutionStatus, TokenEntry
    from nemo_gym.token_id_capture.sink import (
        NG_CAPTURE_FIELD,
        NG_COMMIT_COORDS_FIELD,
        CaptureContext,
        capture_tokens,
        current_capture_context,
        installed_lineage_store,
        installed_token_sink,
        register_call_intent,
        reset_token_sink,
        resolve_parent,
        set_token_sink,
    )
    from nemo_gym.token_id_capture.store import TokenCaptureStore

# Loaded on first use: a model server imports this package for its config types only.
_LAZY = {
    "CaptureContext": "nemo_gym.token_id_capture.sink",
    "FileLineageStore": "nemo_gym.token_id_capture.lineage",
    "InMemoryLineageStore": "nemo_gym.token_id_capture.lineage",
    "LineageResolver": "nemo_gym.token_id_capture.protocols",
    "NG_CAPTURE_FIELD": "nemo_gym.token_id_capture.sink",
    "NG_COMMIT_COORDS_FIELD": "nemo_gym.token_id_capture.sink",
    "ParentResolutionStatus": "nemo_gym.token_id_capture.records",
    "TOKEN_ID_CAPTURE_BLOCK": "nemo_gym.token_id_capture.config",
    "TokenCaptureSnapshot": "nemo_gym.token_id_capture.protocols",
    "TokenCaptureStore": "nemo_gym.token_id_capture.store",
    "TokenEntry": "nemo_gym.token_id_capture.records",
    "TokenIdCaptureConfig": "nemo_gym.token_id_capture.config",
    "TokenIdCaptureSettings": "nemo_gym.token_id_capture.config",
    "TokenIdCaptureUnavailable": "nemo_gym.token_id_capture.config",
    "TokenSink": "nemo_gym.token_id_capture.protocols",
    "TokenSource": "nemo_gym.token_id_capture.protocols",
    "UNCOMMITTED_CALL_REASON": "nemo_gym.token_id_capture.records",
    "capture_tokens": "nemo_gym.token_id_capture.sink",
    "current_capture_context": "nemo_gym.token_id_capture.sink",
    "installed_lineage_store": "nemo_gym.token_id_capture.sink",
    "installed_token_sink": "nemo_gym.token_id_capture.sink",
    "register_call_intent": "nemo_gym.token_id_capture.sink",
    "reset_token_sink": "nemo_gym.token_id_capture.sink",
    "resolve_parent": "nemo_gym.token_id_capture.sink",
    "set_token_sink": "nemo_gym.token_id_capture.sink",
    "token_id_capture_config": "nemo_gym.token_id_capture.config",
    "trajectories_from_source": "nemo_gym.token_id_capture.consumer",
}

__all__ = [
    "NG_CAPTURE_FIELD",
    "NG_COMMIT_COORDS_FIELD",
    "TOKEN_ID_CAPTURE_BLOCK",
    "UNCOMMITTED_CALL_REASON",
    "CaptureContext",
    "FileLineageStore",
    "InMemoryLineageStore",
    "LineageResolver",
    "ParentResolutionStatus",
    "TokenCaptureSnapshot",
    "TokenCaptureStore",
    "TokenEntry",
    "TokenSink",
    "TokenSource",
    "TokenIdCaptureConfig",
    "TokenIdCaptureSettings",
    "TokenIdCaptureUnavailable",
    "capture_tokens",
    "current_capture_context",
    "installed_lineage_store",
    "installed_token_sink",
    "register_call_intent",
    "reset_token_sink",
    "resolve_parent",
    "set_token_sink",
    "token_id_capture_config",
    "trajectories_from_source",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
