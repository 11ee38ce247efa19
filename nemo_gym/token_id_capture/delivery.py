"""A finished rollout record given its captured tokens: the finalizer a collector (or trainer) runs.

:func:`finalize_rollout_token_capture` freezes the rollout's capture through a ``TokenSource``
and replaces the record's ``response.output`` with the rebuilt contiguous items; the reward and
everything else the harness and verifier wrote stay. A record that already carries token IDs
(``return_token_id_information``: what the policy sampled) is left as it is. Anything that
cannot be rebuilt masks the record (``mask_sample: true``, reasons under ``_ng_token_capture``)
and keeps the capture as evidence; nothing here raises. The frozen snapshot is retired only by
:func:`retire_rollout_token_capture`, after the record is durably handed off.
"""

from __future__ import annotations

import warnings
from typing import Any

from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body
from nemo_gym.token_id_capture.consumer import trajectories_from_source
from nemo_gym.token_id_capture.protocols import TokenSource

TOKEN_CAPTURE_KEY = "_ng_token_capture"
MASK_SAMPLE_KEY = "mask_sample"
TERMINAL_CALL_KEY = "_ng_terminal_model_call_id"
TERMINAL_RESPONSE_ID_KEY = "terminal_response_id"
_REDUNDANT_CAPTURE_KEY = "_redundant_capture"


def rollout_carries_token_ids(result: dict[str, Any]) -> bool:
    """Whether the record's response already has generated token IDs on an output item."""
    response = result.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    return any(isinstance(item, dict) and item.get("generation_token_ids") for item in output or [])


def _unusable(result: dict[str, Any], error: str, message: str) -> dict[str, Any]:
    warnings.warn(message, stacklevel=3)
    metrics = {"n_calls": 0, "error": error}
    result[MASK_SAMPLE_KEY] = True
    result[TOKEN_CAPTURE_KEY] = metrics
    return {"rebuilt_response": None, MASK_SAMPLE_KEY: True, "error": error, "metrics": metrics}


async def finalize_rollout_token_capture(
    result: dict[str, Any], source: TokenSource | None
) -> dict[str, Any] | None:
    """Rebuild one finished record's ``response.output`` from its captured tokens (in place).

    Returns the build (``rebuilt_response``, ``mask_sample``, ``metrics``, the frozen snapshot's
    identity), or None when there is no source (this caller does not rebuild).
    """
    if source is None:
        return None
    try:
        rollout_id = maybe_rollout_id_from_run_body(result)
    except (TypeError, ValueError) as exc:
        return _unusable(
            result,
            f"malformed rollout id: {exc}",
            f"a rollout record's id is malformed ({exc}): its tokens cannot be looked up",
        )
    if rollout_carries_token_ids(result):
        if rollout_id is None:
            return None
        try:
            snapshot = await source.freeze(rollout_id)
        except Exception:  # noqa: BLE001 - the record has its own tokens; the capture is only redundant
            warnings.warn(f"could not freeze the redundant capture of rollout {rollout_id}", stacklevel=2)
            return None
        identity = {"snapshot_id": snapshot.snapshot_id, "version": snapshot.version}
        return {
            "rebuilt_response": None,
            MASK_SAMPLE_KEY: False,
            _REDUNDANT_CAPTURE_KEY: True,
            "_capture_snapshot": identity,
        }
    if rollout_id is None:
        return _unusable(
            result,
            "no capture key",
            "a rollout record has no id and no task/rollout indices: its tokens cannot be looked up",
        )
    given = result.get("response")
    response: dict[str, Any] = given if isinstance(given, dict) else {}
    explicit, declared = result.get(TERMINAL_CALL_KEY), result.get(TERMINAL_RESPONSE_ID_KEY)
    try:
        built = await trajectories_from_source(
            rollout_id,
            source,
            model=str(response.get("model") or ""),
            verified_response=response or None,
            explicit_terminal_call_id=str(explicit) if explicit else None,
            declared_response_id=str(declared) if declared else None,
        )
    except Exception as exc:  # noqa: BLE001 - a broken source masks the record, never the collection
        return _unusable(
            result,
            f"{type(exc).__name__}: {exc}",
            f"could not read the capture of rollout {rollout_id}: {exc}",
        )
    if built is None:
        return _unusable(
            result, "nothing recorded", f"rollout {rollout_id} has no token ids and none were captured"
        )
    if built["rebuilt_response"] is not None:
        if isinstance(result.get("response"), dict):
            result["response"]["output"] = built["rebuilt_response"]["output"]
        else:
            result["response"] = built["rebuilt_response"]
    metrics = dict(built.get("metrics") or {})
    if built.get("error"):
        metrics["error"] = built["error"]
    if built.get(MASK_SAMPLE_KEY):
        result[MASK_SAMPLE_KEY] = True
        warnings.warn(
            f"rollout {rollout_id} was captured incompletely or ambiguously ({metrics}): masked", stacklevel=2
        )
    result[TOKEN_CAPTURE_KEY] = metrics
    return built


def capture_build_can_retire(built: dict[str, Any] | None) -> bool:
    """Whether a build consumed its snapshot (a masked or failed build keeps it as evidence)."""
    if built is None or built.get(MASK_SAMPLE_KEY):
        return False
    return built.get("rebuilt_response") is not None or bool(built.get(_REDUNDANT_CAPTURE_KEY))


async def retire_rollout_token_capture(
    rollout_id: str, source: TokenSource | None, built: dict[str, Any] | None
) -> bool:
    """Retire exactly the snapshot a build consumed; call only after the record is durable."""
    if source is None or not capture_build_can_retire(built):
        return False
    assert built is not None
    snapshot = built.get("_capture_snapshot")
    if not isinstance(snapshot, dict):
        warnings.warn(f"rollout {rollout_id} has no frozen capture identity to retire", stacklevel=2)
        return False
    try:
        return await source.drop(
            rollout_id, snapshot_id=str(snapshot["snapshot_id"]), version=int(snapshot["version"])
        )
    except Exception:  # noqa: BLE001 - the records stay; retiring is housekeeping
        warnings.warn(f"could not retire the capture of rollout {rollout_id}", stacklevel=2)
        return False
