"""NeMo Gym's training-token capture (``nemo_gym.token_id_capture``): exact token IDs of every
model call of a rollout, kept beside the rollout instead of on the agent's hop.

The capture middleware opens a :class:`CaptureContext` for each call on
``/ng-rollout/<id>/training-token-capture/...``; the model server resolves the call's parent
before dispatch and hands its complete answer to :func:`capture_tokens`, which writes a
:class:`TokenEntry` through a :class:`TokenSink` (our :class:`TokenCaptureStore` file store, or a
trainer's transport). A trainer freezes a :class:`TokenSource` and reads the rollout back as one
contiguous sequence (:func:`trajectories_from_source`), retiring exactly the snapshot it consumed.
With ``external_staging`` the engine's inference worker stages the tokens itself
(:mod:`nemo_gym.token_id_capture.staging`) and the model server keeps a token-free ledger.
docs/TOKEN_IDS.md compares this with ``return_token_id_information``, which carries the same IDs
on the response items. Names load on first use: a model server imports this package for its
config types only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_gym.token_id_capture.builder import (
        Chain,
        assert_prefix_contiguity,
        prefix_merging,
        project_chain_to_output_items,
        project_main_chain_response,
        run_builder,
    )
    from nemo_gym.token_id_capture.config import (
        TOKEN_ID_CAPTURE_BLOCK,
        TokenIdCaptureConfig,
        TokenIdCaptureSettings,
        token_id_capture_config,
    )
    from nemo_gym.token_id_capture.consumer import (
        clear_token_captures_for_rollouts,
        token_id_capture_dirs_from_config,
        trajectories_for_rollout,
        trajectories_from_source,
    )
    from nemo_gym.token_id_capture.fingerprint import (
        assistant_fingerprint,
        canonicalize_tool_arguments,
    )
    from nemo_gym.token_id_capture.lineage import (
        FileLineageStore,
        IncrementalLineageStore,
        InMemoryLineageStore,
        LineageIndex,
        RolloutLineage,
        stamp_continuation,
    )
    from nemo_gym.token_id_capture.protocols import (
        CaptureLedger,
        LineageMatch,
        LineageResolution,
        LineageResolver,
        LineageStore,
        TokenCaptureSnapshot,
        TokenSink,
        TokenSource,
        install_lineage_store,
        install_token_sink,
        install_token_source,
        installed_lineage_store,
        installed_token_sink,
        installed_token_source,
    )
    from nemo_gym.token_id_capture.records import (
        TOKEN_ENTRY_MIN_SCHEMA_VERSION,
        TOKEN_ENTRY_RECORD_SCHEMA_VERSION,
        TOKEN_FIELDS,
        UNCOMMITTED_CALL_REASON,
        UNRESOLVED_PARENT_REASON,
        ParentResolutionStatus,
        TokenEntry,
        compute_digest,
        cumulative_tokens,
        extract_token_fields,
        stamp_lineage,
    )
    from nemo_gym.token_id_capture.sink import (
        NG_CAPTURE_FIELD,
        NG_COMMIT_COORDS_FIELD,
        CaptureContext,
        capture_health_snapshot,
        capture_tokens,
        commit_entry,
        current_capture_context,
        mark_external_staging_committed,
        register_call_intent,
        reset_token_sink,
        resolve_parent,
        set_token_sink,
    )
    from nemo_gym.token_id_capture.staging.records import (
        CallRecord,
        CaptureLedgerCommit,
    )
    from nemo_gym.token_id_capture.store import (
        TokenCaptureStore,
        make_token_store,
        validate_rollout_id,
    )

_LAZY = {
    "Chain": "nemo_gym.token_id_capture.builder",
    "assert_prefix_contiguity": "nemo_gym.token_id_capture.builder",
    "prefix_merging": "nemo_gym.token_id_capture.builder",
    "project_chain_to_output_items": "nemo_gym.token_id_capture.builder",
    "project_main_chain_response": "nemo_gym.token_id_capture.builder",
    "run_builder": "nemo_gym.token_id_capture.builder",
    "TokenIdCaptureConfig": "nemo_gym.token_id_capture.config",
    "TokenIdCaptureSettings": "nemo_gym.token_id_capture.config",
    "TOKEN_ID_CAPTURE_BLOCK": "nemo_gym.token_id_capture.config",
    "token_id_capture_config": "nemo_gym.token_id_capture.config",
    "clear_token_captures_for_rollouts": "nemo_gym.token_id_capture.consumer",
    "token_id_capture_dirs_from_config": "nemo_gym.token_id_capture.consumer",
    "trajectories_for_rollout": "nemo_gym.token_id_capture.consumer",
    "trajectories_from_source": "nemo_gym.token_id_capture.consumer",
    "assistant_fingerprint": "nemo_gym.token_id_capture.fingerprint",
    "canonicalize_tool_arguments": "nemo_gym.token_id_capture.fingerprint",
    "FileLineageStore": "nemo_gym.token_id_capture.lineage",
    "IncrementalLineageStore": "nemo_gym.token_id_capture.lineage",
    "InMemoryLineageStore": "nemo_gym.token_id_capture.lineage",
    "LineageIndex": "nemo_gym.token_id_capture.lineage",
    "RolloutLineage": "nemo_gym.token_id_capture.lineage",
    "stamp_continuation": "nemo_gym.token_id_capture.lineage",
    "CaptureLedger": "nemo_gym.token_id_capture.protocols",
    "LineageMatch": "nemo_gym.token_id_capture.protocols",
    "LineageResolution": "nemo_gym.token_id_capture.protocols",
    "LineageResolver": "nemo_gym.token_id_capture.protocols",
    "LineageStore": "nemo_gym.token_id_capture.protocols",
    "TokenCaptureSnapshot": "nemo_gym.token_id_capture.protocols",
    "TokenSink": "nemo_gym.token_id_capture.protocols",
    "TokenSource": "nemo_gym.token_id_capture.protocols",
    "install_lineage_store": "nemo_gym.token_id_capture.protocols",
    "install_token_sink": "nemo_gym.token_id_capture.protocols",
    "install_token_source": "nemo_gym.token_id_capture.protocols",
    "installed_lineage_store": "nemo_gym.token_id_capture.protocols",
    "installed_token_sink": "nemo_gym.token_id_capture.protocols",
    "installed_token_source": "nemo_gym.token_id_capture.protocols",
    "TOKEN_ENTRY_MIN_SCHEMA_VERSION": "nemo_gym.token_id_capture.records",
    "TOKEN_ENTRY_RECORD_SCHEMA_VERSION": "nemo_gym.token_id_capture.records",
    "TOKEN_FIELDS": "nemo_gym.token_id_capture.records",
    "UNCOMMITTED_CALL_REASON": "nemo_gym.token_id_capture.records",
    "UNRESOLVED_PARENT_REASON": "nemo_gym.token_id_capture.records",
    "ParentResolutionStatus": "nemo_gym.token_id_capture.records",
    "TokenEntry": "nemo_gym.token_id_capture.records",
    "compute_digest": "nemo_gym.token_id_capture.records",
    "cumulative_tokens": "nemo_gym.token_id_capture.records",
    "extract_token_fields": "nemo_gym.token_id_capture.records",
    "stamp_lineage": "nemo_gym.token_id_capture.records",
    "NG_CAPTURE_FIELD": "nemo_gym.token_id_capture.sink",
    "NG_COMMIT_COORDS_FIELD": "nemo_gym.token_id_capture.sink",
    "CaptureContext": "nemo_gym.token_id_capture.sink",
    "capture_health_snapshot": "nemo_gym.token_id_capture.sink",
    "capture_tokens": "nemo_gym.token_id_capture.sink",
    "commit_entry": "nemo_gym.token_id_capture.sink",
    "current_capture_context": "nemo_gym.token_id_capture.sink",
    "mark_external_staging_committed": "nemo_gym.token_id_capture.sink",
    "register_call_intent": "nemo_gym.token_id_capture.sink",
    "reset_token_sink": "nemo_gym.token_id_capture.sink",
    "resolve_parent": "nemo_gym.token_id_capture.sink",
    "set_token_sink": "nemo_gym.token_id_capture.sink",
    "CallRecord": "nemo_gym.token_id_capture.staging.records",
    "CaptureLedgerCommit": "nemo_gym.token_id_capture.staging.records",
    "TokenCaptureStore": "nemo_gym.token_id_capture.store",
    "make_token_store": "nemo_gym.token_id_capture.store",
    "validate_rollout_id": "nemo_gym.token_id_capture.store",
}

__all__ = [
    "CallRecord",
    "CaptureContext",
    "CaptureLedger",
    "CaptureLedgerCommit",
    "Chain",
    "FileLineageStore",
    "InMemoryLineageStore",
    "IncrementalLineageStore",
    "LineageIndex",
    "LineageMatch",
    "LineageResolution",
    "LineageResolver",
    "LineageStore",
    "NG_CAPTURE_FIELD",
    "NG_COMMIT_COORDS_FIELD",
    "ParentResolutionStatus",
    "RolloutLineage",
    "TOKEN_ENTRY_MIN_SCHEMA_VERSION",
    "TOKEN_ENTRY_RECORD_SCHEMA_VERSION",
    "TOKEN_FIELDS",
    "TOKEN_ID_CAPTURE_BLOCK",
    "TokenCaptureSnapshot",
    "TokenCaptureStore",
    "TokenEntry",
    "TokenIdCaptureConfig",
    "TokenIdCaptureSettings",
    "TokenSink",
    "TokenSource",
    "UNCOMMITTED_CALL_REASON",
    "UNRESOLVED_PARENT_REASON",
    "assert_prefix_contiguity",
    "assistant_fingerprint",
    "canonicalize_tool_arguments",
    "capture_health_snapshot",
    "capture_tokens",
    "clear_token_captures_for_rollouts",
    "commit_entry",
    "compute_digest",
    "cumulative_tokens",
    "current_capture_context",
    "extract_token_fields",
    "install_lineage_store",
    "install_token_sink",
    "install_token_source",
    "installed_lineage_store",
    "installed_token_sink",
    "installed_token_source",
    "make_token_store",
    "mark_external_staging_committed",
    "prefix_merging",
    "project_chain_to_output_items",
    "project_main_chain_response",
    "register_call_intent",
    "reset_token_sink",
    "resolve_parent",
    "run_builder",
    "set_token_sink",
    "stamp_continuation",
    "stamp_lineage",
    "token_id_capture_config",
    "token_id_capture_dirs_from_config",
    "trajectories_for_rollout",
    "trajectories_from_source",
    "validate_rollout_id",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
