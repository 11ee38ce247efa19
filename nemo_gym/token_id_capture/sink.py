"""Capturing one model call: the request-scoped :class:`CaptureContext` and what fills its sink.

The capture middleware opens a context for each call on a ``/ng-rollout/<id>/training-token-capture``
path. Before dispatch the model server calls :func:`resolve_parent` once with the request as
received (prefix supply and capture then share that one decision) and :func:`register_call_intent`;
after the complete answer exists it calls :func:`capture_tokens`, which builds the
:class:`TokenEntry` from the answer's token fields (the same fields ``return_token_id_information``
puts on the last output item) and writes it through the context's sink. A capture failure never
fails the model call: the rollout is marked incomplete instead, so a trainer masks it rather than
training on a chain with a hole. Under worker-owned staging (``external_staging``) the engine's
worker stages the tokens and :mod:`nemo_gym.token_id_capture.external_capture` commits them.
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.token_id_capture.fingerprint import assistant_fingerprint
from nemo_gym.token_id_capture.lineage import stamp_continuation
from nemo_gym.token_id_capture.protocols import CaptureLedger, LineageResolution, LineageResolver, TokenSink
from nemo_gym.token_id_capture.records import (
    UNRESOLVED_PARENT_REASON,
    ParentResolutionStatus,
    TokenEntry,
    extract_token_fields,
    response_to_output_items,
    stamp_lineage,
    strip_token_fields,
)
from nemo_gym.token_id_capture.staging.records import CaptureAdmission

logger = logging.getLogger(__name__)

# The admission rides the engine-bound request under NG_CAPTURE_FIELD; the worker's
# token-free acknowledgement rides its answer under NG_COMMIT_COORDS_FIELD.
NG_CAPTURE_FIELD = "ng_capture"
NG_COMMIT_COORDS_FIELD = "ng_commit_coords"


@dataclass
class CaptureContext:
    """One model call being captured for training: its identity, destination and parent decision."""

    rollout_id: str
    model_call_id: str
    # None: another process (an inference worker) stages the tokens.
    token_sink: TokenSink | None
    lineage_store: LineageResolver | CaptureLedger | None = None
    model: str = ""
    committed: bool = False
    delta_records: bool = False
    # The server asked the engine for the parent's prefix / the generation proved it was used.
    prefix_requested: bool = False
    prefix_supplied: bool = False
    parent_resolution: LineageResolution | None = None
    external_staging: bool = False
    admitted_at: float | None = None
    capture_admission: CaptureAdmission | None = None
    parent_staging_chain: list[str] = field(default_factory=list)
    parent_chain_hash: str = ""
    # The request items as received, for the ledger row the next request must resolve against.
    request_items: list[dict[str, Any]] | None = None
    # The worker's acknowledgement, held until the answer is converted for the client.
    external_commit_coords: dict[str, Any] | None = None
    # A real worker completion arrived (a completion the server made up itself leaves this False).
    external_worker_response_seen: bool = False
    # capture_tokens ran for this call (the middleware captures a streamed answer otherwise).
    capture_attempted: bool = False

    @property
    def parent_call_id(self) -> str | None:
        """The resolved parent's call id, if any."""
        match = self.parent_resolution.match if self.parent_resolution is not None else None
        return match.model_call_id if match is not None else None

    @property
    def parent_tokens(self) -> list[int]:
        """The resolved parent's cumulative tokens (what the prompt must begin with), if any."""
        match = self.parent_resolution.match if self.parent_resolution is not None else None
        return list(match.cumulative_token_ids) if match is not None else []


_CAPTURE_CONTEXT: ContextVar[CaptureContext | None] = ContextVar("nemo_gym_capture_context", default=None)


@dataclass
class _Health:
    resolutions: dict[str, int] = field(default_factory=lambda: {"root": 0, "resolved": 0, "unresolved": 0})
    capture_failures: int = 0
    warned_no_resolver: bool = False


# This worker's capture health counters (read by metrics endpoints).
_HEALTH = _Health()


def capture_health_snapshot() -> dict[str, Any]:
    """This worker's parent decisions by kind and its capture failures so far."""
    return {"resolutions": dict(_HEALTH.resolutions), "capture_failures": _HEALTH.capture_failures}


def set_token_sink(context: CaptureContext) -> Token[CaptureContext | None]:
    """Make ``context`` the call being captured in this task (undo with :func:`reset_token_sink`)."""
    return _CAPTURE_CONTEXT.set(context)


def reset_token_sink(token: Token[CaptureContext | None]) -> None:
    """Undo a :func:`set_token_sink`."""
    _CAPTURE_CONTEXT.reset(token)


def current_capture_context() -> CaptureContext | None:
    """The call being captured in this request, or None for uncaptured traffic."""
    return _CAPTURE_CONTEXT.get()


def mark_external_staging_committed(*, rollout_id: str, model_call_id: str) -> None:
    """Mark the current call committed by a worker (its identity must match the context's)."""
    context = _CAPTURE_CONTEXT.get()
    if context is None:
        raise RuntimeError("no training-token capture context is active")
    if (context.rollout_id, context.model_call_id) != (rollout_id, model_call_id):
        raise ValueError(
            f"the staging acknowledgement for {rollout_id}/{model_call_id} does not match the active "
            f"capture {context.rollout_id}/{context.model_call_id}"
        )
    context.committed = True


async def _decide_parent(
    context: CaptureContext, request_messages: list[dict[str, Any]]
) -> LineageResolution:
    if not assistant_fingerprint(request_messages):
        return LineageResolution(ParentResolutionStatus.ROOT)
    if context.lineage_store is None:
        if not _HEALTH.warned_no_resolver:
            _HEALTH.warned_no_resolver = True
            logger.warning(
                "no lineage resolver: every continuation is UNRESOLVED and multi-call rollouts are masked "
                "(token_id_capture.allow_unresolved_continuations is set)"
            )
        return LineageResolution(ParentResolutionStatus.UNRESOLVED, reason="resolver_unavailable")
    return await context.lineage_store.resolve(context.rollout_id, request_messages)


async def resolve_parent(request_messages: list[dict[str, Any]] | None) -> None:
    """Decide, once and before dispatch, which captured call this request continues.

    Under worker-owned staging the decision also admits the call: a unique parent gives a
    ``token_in`` admission, a request with no model-authored turn (or the first call of a rollout
    with no ledger rows) a ``text`` root; anything else is recorded as a failure and the call
    goes to the engine unadmitted. An unresolved continuation never becomes a new root: its
    earlier generated tokens would train as prompt.
    """
    context = _CAPTURE_CONTEXT.get()
    if context is None or request_messages is None:
        return
    context.request_items = list(request_messages)
    try:
        context.parent_resolution = await _decide_parent(context, request_messages)
        status = context.parent_resolution.status.value
        _HEALTH.resolutions[status] = _HEALTH.resolutions.get(status, 0) + 1
    except Exception as exc:
        if context.external_staging:  # the ledger's ancestry guarantee fails closed
            raise RuntimeError(f"ledger lineage resolution failed for rollout {context.rollout_id}") from exc
        logger.warning(
            "could not resolve the parent of a call of rollout %s", context.rollout_id, exc_info=True
        )
        context.parent_resolution = LineageResolution(
            ParentResolutionStatus.UNRESOLVED, reason="lookup_error"
        )
    match = context.parent_resolution.match
    if match is not None:
        context.parent_staging_chain = list(match.staging_chain)
        context.parent_chain_hash = match.chain_hash
    if context.external_staging and context.capture_admission is None and context.lineage_store is not None:
        await _admit(context)


async def _admit(context: CaptureContext) -> None:
    ledger = context.lineage_store
    if not isinstance(ledger, CaptureLedger):
        raise RuntimeError(
            "worker-owned staging needs a CaptureLedger as the capture context's lineage store"
        )
    resolution = context.parent_resolution
    match = resolution.match if resolution is not None else None
    if match is not None:
        try:
            context.capture_admission = CaptureAdmission(
                rollout_id=context.rollout_id,
                model_call_id=context.model_call_id,
                parent_call_id=match.model_call_id,
                prev_len=match.prev_len,
                mode="token_in",
                staging_chain=list(match.staging_chain),
                parent_chain_hash=match.chain_hash or None,
            )
            return
        except ValueError:
            logger.warning(
                "parent %s cannot admit model call %s of rollout %s as a chained child; poisoning it",
                match.model_call_id, context.model_call_id, context.rollout_id, exc_info=True,
            )  # fmt: skip
    elif (
        resolution is not None and resolution.status == ParentResolutionStatus.ROOT
    ) or not await ledger.has_rows(context.rollout_id):
        context.capture_admission = CaptureAdmission(
            rollout_id=context.rollout_id, model_call_id=context.model_call_id, mode="text"
        )
        return
    else:
        logger.warning(
            "model call %s of rollout %s continues no recorded call; poisoning it",
            context.model_call_id, context.rollout_id,
        )  # fmt: skip
    await ledger.record_failure(context.rollout_id, context.model_call_id, UNRESOLVED_PARENT_REASON)


async def register_call_intent() -> None:
    """Announce the call to a sink that offers ``begin_call`` (a failure here fails the call
    before any generation is spent)."""
    context = _CAPTURE_CONTEXT.get()
    begin = getattr(context.token_sink, "begin_call", None) if context is not None else None
    if context is not None and begin is not None:
        await begin(context.rollout_id, context.model_call_id)


async def capture_tokens(response: Any, request_messages: list[dict[str, Any]] | None = None) -> None:
    """Write the current call's :class:`TokenEntry` from its complete answer (a model or a dict).

    Nothing without a context, nothing under worker-owned staging; an answer without token IDs
    marks the rollout incomplete (a hole would let the next prompt carry generated tokens as if
    the environment had written them).
    """
    context = _CAPTURE_CONTEXT.get()
    if context is None or context.external_staging:
        return
    context.capture_attempted = True
    try:
        payload = response.model_dump() if hasattr(response, "model_dump") else response
        if not isinstance(payload, dict):
            await _capture_missing(context, f"the response is a {type(response).__name__}")
            return
        token_fields = extract_token_fields(payload) or vllm_chat_token_fields(payload)
        if token_fields is None:
            await _capture_missing(context, "the response carries no token ids")
            return
        items, token_item_index = strip_token_fields(response_to_output_items(payload))
        if context.parent_resolution is None and request_messages is not None:
            await resolve_parent(request_messages)
        entry = TokenEntry(
            rollout_id=context.rollout_id,
            model_call_id=context.model_call_id,
            model=context.model or str(payload.get("model") or ""),
            prompt_token_ids=token_fields["prompt_token_ids"],
            generation_token_ids=token_fields["generation_token_ids"],
            generation_log_probs=token_fields["generation_log_probs"],
            routed_experts=token_fields.get("routed_experts"),
            output_items=items,
            token_item_index=token_item_index,
            response_id=str(payload.get("id") or "") or None,
            created_at=time.time(),
            prefix_requested=context.prefix_requested,
            prefix_supplied=context.prefix_supplied,
        )
        if request_messages is not None:
            stamp_continuation(entry, list(request_messages))
    except Exception:
        await _capture_failed(context, "build")
        return
    await commit_entry(entry)


def vllm_chat_token_fields(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The token fields of a chat completion in vLLM's own shape (top-level ``prompt_token_ids``,
    the choice's ``token_ids`` and ``logprobs.content``), or None when it is not one."""
    choices = payload.get("choices")
    prompt = payload.get("prompt_token_ids")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(prompt, list):
        return None
    choice = choices[0] if isinstance(choices[0], dict) else {}
    entries = (choice.get("logprobs") or {}).get("content")
    ids = choice.get("token_ids")
    if not isinstance(entries, list) or not isinstance(ids, list) or len(entries) != len(ids):
        return None
    logprobs = [float(e["logprob"]) for e in entries]
    return {
        "prompt_token_ids": prompt,
        "generation_token_ids": ids,
        "generation_log_probs": logprobs,
        "routed_experts": None,
    }


async def commit_entry(entry: TokenEntry, *, parent_resolution: LineageResolution | None = None) -> None:
    """Stamp the entry's lineage and write it through the current context's sink.

    Engine-side writers call this directly (after :func:`~nemo_gym.token_id_capture.lineage.stamp_continuation`).
    A resolved parent whose cumulative tokens the prompt extends is stored as a delta when the
    context asks for delta records; the digest always covers the full sequence.
    """
    context = _CAPTURE_CONTEXT.get()
    if context is None:
        return
    if (entry.rollout_id, entry.model_call_id) != (context.rollout_id, context.model_call_id):
        logger.warning(
            "a captured entry does not belong to call %s of rollout %s",
            context.model_call_id,
            context.rollout_id,
        )
        await _mark_incomplete(context)
        return
    if context.token_sink is None:
        context.committed = True
        return
    try:
        resolution = parent_resolution or context.parent_resolution
        if resolution is None:
            resolution = LineageResolution(ParentResolutionStatus.UNRESOLVED, reason="not_attempted")
        cumulative = None
        parent = resolution.match.cumulative_token_ids if resolution.match is not None else ()
        prompt = list(entry.prompt_token_ids)
        if (
            context.delta_records
            and not entry.prompt_is_delta
            and parent
            and tuple(prompt[: len(parent)]) == parent
        ):
            cumulative = prompt + list(entry.generation_token_ids)
            entry.prompt_token_ids = prompt[len(parent) :]
            entry.prompt_is_delta = True
        stamp_lineage(
            entry,
            resolution.match.model_call_id if resolution.match is not None else None,
            parent_resolution=resolution.status,
            cumulative=cumulative,
        )
        entry.parent_resolution_reason = resolution.reason or ""
        await context.token_sink.put(entry)
        context.committed = True
    except Exception:
        await _capture_failed(context, "write")


async def _capture_failed(context: CaptureContext, stage: str) -> None:
    _HEALTH.capture_failures += 1
    if _HEALTH.capture_failures % 10 == 0:
        logger.error("training-token capture has failed %d times in this worker", _HEALTH.capture_failures)
    logger.warning(
        "training-token capture failed to %s the record of call %s of rollout %s",
        stage, context.model_call_id, context.rollout_id, exc_info=True,
    )  # fmt: skip
    await _mark_incomplete(context)


async def _capture_missing(context: CaptureContext, reason: str) -> None:
    if context.committed or context.token_sink is None:
        return
    logger.warning(
        "call %s of rollout %s has no token ids to capture: %s",
        context.model_call_id,
        context.rollout_id,
        reason,
    )
    await _mark_incomplete(context)


async def _mark_incomplete(context: CaptureContext) -> None:
    mark = getattr(context.token_sink, "mark_incomplete", None)
    if mark is None:
        logger.error(
            "sink %s has no mark_incomplete: rollout %s cannot be masked and may train with a missing call",
            type(context.token_sink).__name__, context.rollout_id,
        )  # fmt: skip
        return
    try:
        await mark(context.rollout_id, context.model_call_id)
    except Exception:
        logger.warning("could not mark rollout %s incomplete", context.rollout_id, exc_info=True)
