"""A rollout's frozen capture turned into a trajectory: what a trainer reads back.

:func:`trajectories_from_source` freezes a :class:`~nemo_gym.token_id_capture.protocols.TokenSource`
(a trainer's own transport, or our file store) and :func:`trajectories_for_rollout` the file
store of the run's capture directory; both attribute the terminal call, build the chains
(:mod:`nemo_gym.token_id_capture.builder`), project the main chain to one contiguous Responses
object (``rebuilt_response``) and say whether to train on it (``mask_sample``), with metrics.
Missing records, an incomplete snapshot or a broken chain never raise: they mask the sample.
The snapshot's id and version come back under ``_capture_snapshot`` so the caller can retire
exactly what it consumed (``TokenSource.drop``) after a durable hand-off.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from nemo_gym.token_id_capture.builder import (
    assert_prefix_contiguity,
    project_main_chain_response,
    run_builder,
)
from nemo_gym.token_id_capture.protocols import TokenCaptureSnapshot, TokenSource
from nemo_gym.token_id_capture.records import TokenEntry
from nemo_gym.token_id_capture.store import TokenCaptureStore
from nemo_gym.token_id_capture.terminal import TerminalAttribution, resolve_terminal

logger = logging.getLogger(__name__)

_BUILD_ERRORS = (AssertionError, ValueError, KeyError, IndexError, TypeError)


def _failed_build(rollout_id: str, builder: str, error: str, *, n_calls: int = 0) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id, "builder": builder, "rebuilt_response": None, "mask_sample": True,
        "error": error, "metrics": {"n_calls": n_calls},
    }  # fmt: skip


def token_id_capture_dirs_from_config(global_config_dict: Any) -> list[Path]:
    """The run's capture directory as a list (empty when capture is off or a custom sink is set)."""
    from nemo_gym.token_id_capture.config import token_id_capture_config

    config = token_id_capture_config(global_config_dict)
    directory = config.resolved_dir()
    if not config.enabled or config.token_id_capture.sink is not None or directory is None:
        return []
    return [directory]


def clear_token_captures_for_rollouts(records: list[Any], token_capture_dirs: list[Path]) -> None:
    """Delete the records of rollouts about to be dispatched (ids are deterministic: a reused id
    would append to an earlier attempt's records)."""
    if not token_capture_dirs:
        return
    from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body

    for directory in token_capture_dirs:
        store = TokenCaptureStore(directory)
        for record in records:
            rollout_id = maybe_rollout_id_from_run_body(record)
            if rollout_id:
                store.delete(rollout_id)


def _assemble(
    rollout_id: str,
    entries: list[TokenEntry],
    builder: str,
    model: str,
    *,
    verified_response: dict[str, Any] | None = None,
    explicit_terminal_call_id: str | None = None,
    declared_response_id: str | None = None,
) -> dict[str, Any]:
    try:
        attribution = resolve_terminal(
            entries, verified_response, explicit_terminal_call_id, declared_response_id=declared_response_id
        )
    except Exception:
        logger.warning("terminal attribution failed for rollout %s", rollout_id, exc_info=True)
        attribution = TerminalAttribution(None, reason="attribution_error")

    def attribution_metric(chain: str) -> dict[str, Any]:
        return {
            "method": attribution.method or "none",
            "call_id": attribution.model_call_id,
            "reason": attribution.reason,
            "chain": chain,
        }

    out = None
    try:
        out = run_builder(entries, builder, terminal_call_id=attribution.model_call_id)
        for chain in out.chains:
            chain.validate()
        response = project_main_chain_response(rollout_id, out, model=model)
        assert_prefix_contiguity(response)
    except _BUILD_ERRORS as error:
        logger.warning(
            "no trajectory for rollout %s from %d captured call(s): %s", rollout_id, len(entries), error
        )
        failed = _failed_build(rollout_id, builder, f"{type(error).__name__}: {error}", n_calls=len(entries))
        failed["metrics"]["terminal_attribution"] = attribution_metric(
            (out.notes.terminal_chain if out else "") or "error"
        )
        return failed
    notes = out.notes
    metrics = {
        "n_calls": len(entries),
        "terminal_attribution": attribution_metric(notes.terminal_chain),
        "chains": notes.chains,
        "roots": notes.roots,
        "quarantined_calls": len(out.quarantined),
        "quarantined_fraction": round(len(out.quarantined) / len(entries), 4) if entries else 0.0,
        "delivered_fraction": notes.delivered_fraction,
        "generated_tokens_captured": notes.generated_tokens_captured,
        "generated_tokens_delivered": notes.generated_tokens_delivered,
        "parent_link_failures": dict(notes.parent_link_failures),
        "unresolved_parent_calls": len(notes.unresolved_parent_calls),
        "empty_generation_calls": len(notes.empty_generation_calls),
    }
    if notes.terminal_chain == "delivered":
        mask = False
    elif attribution.attributed or declared_response_id:
        mask = True  # the named terminal's chain did not survive
    else:
        mask = (
            bool(notes.unresolved_retries or notes.unresolved_parent_calls)
            or notes.roots != 1
            or notes.chains != 1
        )
    mask = mask or not any(item.get("generation_token_ids") for item in response["output"])
    return {
        "rollout_id": rollout_id,
        "builder": builder,
        "rebuilt_response": response,
        "metrics": metrics,
        "mask_sample": mask,
        "unresolved_retries": list(notes.unresolved_retries),
        "unresolved_parent_calls": list(notes.unresolved_parent_calls),
    }


def _from_snapshot(snapshot: TokenCaptureSnapshot, builder: str, assemble: Any) -> dict[str, Any]:
    built = (
        assemble(list(snapshot.entries))
        if snapshot.entries
        else _failed_build(snapshot.rollout_id, builder, "capture contains no token records")
    )
    if snapshot.incomplete:
        built["mask_sample"] = True
        built.setdefault("metrics", {})["capture_incomplete"] = True
    built["_capture_snapshot"] = {"snapshot_id": snapshot.snapshot_id, "version": snapshot.version}
    return built


def trajectories_for_rollout(
    rollout_id: str,
    token_capture_dirs: list[Path],
    *,
    builder: str = "prefix_merging",
    model: str = "",
    verified_response: dict[str, Any] | None = None,
    explicit_terminal_call_id: str | None = None,
) -> dict[str, Any] | None:
    """Build from the file store's frozen snapshot (None only when no directory is configured)."""
    for directory in token_capture_dirs[:1]:
        try:
            snapshot = TokenCaptureStore(directory).freeze_now(rollout_id)
        except Exception as error:
            logger.warning("could not freeze the token capture of rollout %s", rollout_id, exc_info=True)
            return _failed_build(rollout_id, builder, f"{type(error).__name__}: {error}")
        return _from_snapshot(
            snapshot,
            builder,
            lambda entries: _assemble(
                rollout_id, entries, builder, model,
                verified_response=verified_response, explicit_terminal_call_id=explicit_terminal_call_id,
            ),
        )  # fmt: skip
    return None


async def trajectories_from_source(
    rollout_id: str,
    source: TokenSource,
    *,
    builder: str = "prefix_merging",
    model: str = "",
    verified_response: dict[str, Any] | None = None,
    explicit_terminal_call_id: str | None = None,
    declared_response_id: str | None = None,
) -> dict[str, Any] | None:
    """Build from a source's frozen snapshot (``declared_response_id``: the id the harness kept;
    one that matches no entry masks the rollout)."""
    try:
        snapshot = await source.freeze(rollout_id)
    except Exception as error:
        logger.warning("could not freeze the token capture of rollout %s", rollout_id, exc_info=True)
        return _failed_build(rollout_id, builder, f"{type(error).__name__}: {error}")

    def assemble(entries: list[TokenEntry]) -> dict[str, Any]:
        return _assemble(
            rollout_id, entries, builder, model, verified_response=verified_response,
            explicit_terminal_call_id=explicit_terminal_call_id, declared_response_id=declared_response_id,
        )  # fmt: skip

    return await asyncio.to_thread(_from_snapshot, snapshot, builder, assemble)
