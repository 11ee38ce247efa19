"""NeMo Gym's model-call capture of a rollout: installed on a model server, read back into its row.

With ``observability_enabled`` a model server records every call of a correlated rollout
(:mod:`nemo_gym.models.call_records`); :func:`install_model_call_capture` puts that recorder and
the training-token capture middleware on an app, and the collector side clears a rollout's old
records before it runs and merges its calls into the result row afterwards. Served at NeMo Gym's
path, :mod:`nemo_gym.base_responses_api_model`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from nemo_gym.models.fastapi_dispatch import plain_config

if TYPE_CHECKING:
    from pathlib import Path

    from nemo_gym.models.call_records import CaptureStore, ModelCallCaptureConfig

logger = logging.getLogger(__name__)


def make_capture_store(config: ModelCallCaptureConfig) -> CaptureStore | None:
    """The capture store of a run with observability on (None when off or not creatable)."""
    from nemo_gym.models.call_records import CaptureStore

    if not config.observability_enabled or config.model_call_capture_dir is None:
        return None
    try:
        return CaptureStore(config.model_call_capture_dir)
    except OSError:
        logger.warning(
            "model-call capture disabled: cannot create %s", config.model_call_capture_dir, exc_info=True
        )
        return None


def install_model_call_capture(
    app: Any,
    config: ModelCallCaptureConfig,
    *,
    model_server_name: str | None = None,
    global_config_dict: Any = None,
    num_workers: int | None = None,
    non_generating_requests: frozenset[tuple[str, str]] | set[tuple[str, str]] = frozenset(),
) -> None:
    """Add the capture middleware to a FastAPI/starlette app.

    It strips ``/ng-rollout/<id>`` before routing; when ``config`` turns observability on it
    stores every model call of that rollout (:class:`~nemo_gym.models.call_capture.CaptureMiddleware`),
    and when the run's ``token_id_capture`` block turns training-token capture on it captures
    each ``/training-token-capture`` call's tokens
    (:class:`~nemo_gym.token_id_capture.middleware.TokenCaptureMiddleware`).
    ``non_generating_requests`` are the routes whose answers never carry generated text;
    ``num_workers`` is accepted for NeMo Gym's signature.
    """
    from nemo_gym.token_id_capture.middleware import install_token_capture_middleware

    install_token_capture_middleware(
        app,
        plain_config(global_config_dict) or {},
        store=make_capture_store(config),
        model_server_name=model_server_name,
        non_generating_requests=frozenset(non_generating_requests),
    )


def model_call_capture_dirs_from_config(global_config_dict: Any) -> list[Path]:
    """The run's capture directory as a list (empty with observability off)."""
    from nemo_gym.models.call_records import ModelCallCaptureConfig

    config = ModelCallCaptureConfig.model_validate(plain_config(global_config_dict) or {})
    if not config.observability_enabled or config.model_call_capture_dir is None:
        return []
    return [config.model_call_capture_dir]


def observability_enabled_from_config(global_config_dict: Any) -> bool:
    """The run's ``observability_enabled`` flag."""
    from nemo_gym.models.call_records import ModelCallCaptureConfig

    return ModelCallCaptureConfig.model_validate(plain_config(global_config_dict) or {}).observability_enabled


def _store_holding(rollout_id: str, capture_dirs: list[Path]) -> CaptureStore | None:
    from nemo_gym.models.call_records import CaptureStore

    for directory in capture_dirs:
        store = CaptureStore(directory)
        if store.path_for(rollout_id).exists() or store.is_incomplete(rollout_id):
            return store
    return None


def clear_model_call_captures_for_rollouts(records: list[Any], capture_dirs: list[Path]) -> None:
    """Delete earlier captures of these rows' rollouts before they run (ids repeat across runs)."""
    from nemo_gym.models.call_records import CaptureStore
    from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body

    for directory in capture_dirs:
        store = CaptureStore(directory)
        for record in records:
            if rollout_id := maybe_rollout_id_from_run_body(record):
                store.path_for(rollout_id).unlink(missing_ok=True)
                store.incomplete_path_for(rollout_id).unlink(missing_ok=True)


def merge_model_call_capture_into_record(
    record: dict[str, Any], capture_dirs: list[Path], *, include_payloads: bool = False
) -> dict[str, Any]:
    """Attach a rollout's captured model calls to its result row, in place, and return it.

    Adds ``ng_model_call_capture = {rollout_id, metrics, calls[, gaps]}``: the totals, one record
    per call (without request/response payloads unless ``include_payloads``), and a gap for
    each thing that could not be read. The row's answer and reward are left alone.
    """
    from nemo_gym.models.call_records import (
        ModelCallRecord,
        aggregate_model_call_records,
        read_available_model_call_records,
    )
    from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body
    from nemo_gym.rollout_observability import AgentObservationBundle, ObservationGap

    rollout_id = maybe_rollout_id_from_run_body(record) if capture_dirs else None
    if rollout_id is None:
        return record
    gaps: list[ObservationGap] = []
    calls: list[ModelCallRecord] = []
    store = _store_holding(rollout_id, capture_dirs)
    if store is None:
        gaps.append(ObservationGap(code="model_call_capture_no_records"))
    else:
        try:
            calls, unreadable = read_available_model_call_records(store, rollout_id)
        except OSError:
            logger.warning("cannot read the model-call capture of rollout %s", rollout_id, exc_info=True)
            gaps.append(ObservationGap(code="model_call_capture_unreadable"))
        else:
            if unreadable:
                gaps.append(
                    ObservationGap(code="model_call_capture_records_unreadable", detail=f"count={unreadable}")
                )
            if store.is_incomplete(rollout_id):
                gaps.append(ObservationGap(code="model_call_capture_incomplete"))
            elif not calls and not unreadable:
                gaps.append(ObservationGap(code="model_call_capture_no_records"))
    observations = record.get("ng_agent_observations")
    if observations is not None:
        from nemo_gym.rollout_observability import join_model_call_observations

        try:
            bundle = AgentObservationBundle.model_validate(observations)
            bundle = _producer_pass(bundle, calls, rollout_id)
            bundle = join_model_call_observations(bundle, calls)
            record["ng_agent_observations"] = bundle.model_dump(mode="json")
        except Exception:  # noqa: BLE001 - a join failure is a gap, never a lost row
            logger.warning("cannot join agent observations of rollout %s", rollout_id, exc_info=True)
            gaps.append(ObservationGap(code="agent_observation_join_failed"))
    payloads = None if include_payloads else {"request", "response", "request_raw", "response_raw"}
    capture: dict[str, Any] = {
        "rollout_id": rollout_id,
        "metrics": aggregate_model_call_records(calls),
        "calls": [call.model_dump(exclude=payloads) for call in calls],
    }
    if gaps:
        capture["gaps"] = [gap.model_dump(mode="json", exclude_none=True) for gap in gaps]
    record["ng_model_call_capture"] = capture
    return record


def _producer_pass(bundle: Any, calls: list[Any], rollout_id: str) -> Any:
    """``bundle`` after its producer's own association of compaction calls, when the producing
    agent folder defines one (:mod:`nemo_gym.collection.observation_producers`); a pass that
    fails leaves the bundle to the generic join, with a ``compaction_model_call_join_failed`` gap."""
    from nemo_gym.collection.observation_producers import compaction_call_association
    from nemo_gym.rollout_observability import ObservationGap

    try:
        associate = compaction_call_association(bundle.source)
        if associate is None:
            return bundle
        return associate(bundle, calls)
    except Exception:  # noqa: BLE001 - the producer's failure is a gap, never a lost row
        logger.warning(
            "cannot associate %s compaction calls of rollout %s", bundle.source, rollout_id, exc_info=True
        )
        bundle.gaps.append(ObservationGap(code="compaction_model_call_join_failed"))
        return bundle
