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

from nemo_gym.token_id_capture.config import (
    TOKEN_ID_CAPTURE_BLOCK,
    TokenIdCaptureConfig,
    TokenIdCaptureSettings,
    TokenIdCaptureUnavailable,
    token_id_capture_config,
)
from nemo_gym.token_id_capture.consumer import trajectories_from_source
from nemo_gym.token_id_capture.lineage import FileLineageStore, InMemoryLineageStore
from nemo_gym.token_id_capture.protocols import LineageResolver, TokenCaptureSnapshot, TokenSink, TokenSource
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
