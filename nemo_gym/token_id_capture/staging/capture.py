"""The worker side of staging: admit a call, stage its exact token delta, acknowledge it.

:class:`RolloutTokenCapture` turns a :class:`CaptureAdmission` and the engine's finished
generation into a :class:`StagedCallRecord` (the prompt past the parent's ``prev_len`` tokens as
mask-0 carry, then the generation), stages it through the framework's sink, and returns
token-free :class:`CommitCoords`. Anything wrong with the material or the sink yields
``capture_failed`` coordinates (the model server then poisons the call); misuse of the
lifecycle by the caller raises :class:`CaptureError`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.token_id_capture.staging.digest import (
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    build_staging_delta,
    compute_chain_hash,
    compute_extras_digest,
    compute_staging_digest,
    hash_token_ids,
)
from nemo_gym.token_id_capture.staging.protocols import CaptureAdapter, StagingSink, WeightVersionProvider
from nemo_gym.token_id_capture.staging.records import (
    CaptureAdmission,
    CommitCoords,
    StagedCallRecord,
    StageResult,
)

logger = logging.getLogger(__name__)


class CaptureError(Exception):
    """The caller broke the capture lifecycle (a bug, never a poisoned call)."""


class StreamingUnsupportedError(CaptureError):
    """Worker-owned staging takes complete responses only."""


@dataclass
class ActiveCall:
    """An admitted call: its admission, weight version, and the exact prefix its prompt must begin with."""

    admission: CaptureAdmission
    weight_version: int
    prefix_token_ids: list[int] = field(default_factory=list)
    completed: bool = field(default=False, init=False)

    @property
    def rollout_id(self) -> str:
        """The call's rollout."""
        return self.admission.rollout_id

    @property
    def model_call_id(self) -> str:
        """The call's id."""
        return self.admission.model_call_id


class RolloutTokenCapture:
    """Builds, stages and acknowledges each call's token delta."""

    def __init__(
        self,
        *,
        sink: StagingSink,
        weight_version_fn: WeightVersionProvider,
        adapter: CaptureAdapter | None = None,
    ) -> None:
        self._sink = sink
        self._weight_version_fn = weight_version_fn
        self._adapter = adapter
        self._completion_lock = threading.Lock()

    @property
    def adapter(self) -> CaptureAdapter | None:
        """The engine adapter, if one was given."""
        return self._adapter

    def begin_call(
        self,
        admission: CaptureAdmission,
        *,
        prefix_token_ids: list[int] | None = None,
        stream: bool = False,
        weight_version: int | None = None,
    ) -> ActiveCall:
        """Admit a call and stamp its weight version.

        ``prefix_token_ids`` is the resolved parent prefix: required for a ``staging_chain``
        admission (the caller fetched and joined the staged deltas), optional but checked for an
        inline one, refused for a text root.
        """
        if not isinstance(admission, CaptureAdmission):
            raise TypeError("admission must be a CaptureAdmission")
        where = f"rollout {admission.rollout_id} call {admission.model_call_id}"
        if stream:
            raise StreamingUnsupportedError(f"{where}: token capture does not support streaming responses")
        prefix = self._resolve_prefix(admission, prefix_token_ids, where)
        version = self._weight_version_fn() if weight_version is None else weight_version
        if type(version) is not int or version < 0:
            raise CaptureError(f"{where}: weight_version must be a non-negative int, got {version!r}")
        return ActiveCall(admission=admission, weight_version=version, prefix_token_ids=prefix)

    @staticmethod
    def _resolve_prefix(admission: CaptureAdmission, given: list[int] | None, where: str) -> list[int]:
        if given is not None and (
            not isinstance(given, list) or any(type(t) is not int or t < 0 for t in given)
        ):
            raise CaptureError(f"{where}: prefix_token_ids must be a list of non-negative ints")
        if admission.mode == "text":
            if given:
                raise CaptureError(f"{where}: a text root admission takes no prefix_token_ids")
            return []
        inline = list(admission.required_prefix_token_ids)
        if given is None:
            if not inline:
                raise CaptureError(f"{where}: a staging_chain admission needs the resolved prefix_token_ids")
            return inline
        if len(given) != admission.prev_len:
            raise CaptureError(
                f"{where}: prefix_token_ids has {len(given)} tokens, prev_len is {admission.prev_len}"
            )
        if inline and inline != given:
            raise CaptureError(f"{where}: prefix_token_ids conflict with the admission's inline prefix")
        return list(given)

    def _claim(self, call: ActiveCall) -> None:
        with self._completion_lock:
            if call.completed:
                raise CaptureError(
                    f"rollout {call.rollout_id} call {call.model_call_id} was already completed"
                )
            call.completed = True

    @staticmethod
    def _failed(call: ActiveCall) -> CommitCoords:
        a = call.admission
        return CommitCoords(
            rollout_id=a.rollout_id, model_call_id=a.model_call_id, parent_call_id=a.parent_call_id,
            prev_len=a.prev_len, delta_len=0, cum_len=a.prev_len, weight_version=call.weight_version,
            disposition="capture_failed",
        )  # fmt: skip

    def complete_call(
        self,
        call: ActiveCall,
        *,
        prompt_token_ids: list[int],
        generated_token_ids: list[int],
        generated_logprobs: list[float],
        extras: dict[str, Any] | None = None,
        attachments: Mapping[str, Any] | None = None,
    ) -> CommitCoords:
        """Stage the call's delta durably, then return its coordinates."""
        self._claim(call)
        a = call.admission
        try:
            if a.mode == "token_in" and prompt_token_ids[: a.prev_len] != call.prefix_token_ids:
                raise ValueError("the generation's prompt does not begin with the admitted token prefix")
            ids, mask, logprobs = build_staging_delta(
                prompt_token_ids=prompt_token_ids, generated_token_ids=generated_token_ids,
                generated_log_probs=generated_logprobs, prev_len=a.prev_len,
            )  # fmt: skip
            fields: dict[str, Any] = {
                "rollout_id": a.rollout_id, "model_call_id": a.model_call_id, "parent_call_id": a.parent_call_id,
                "mode": a.mode, "prev_len": a.prev_len, "delta_len": len(ids), "cum_len": a.prev_len + len(ids),
                "weight_version": call.weight_version, "token_ids_delta": ids, "token_mask_delta": mask,
                "generation_log_probs_delta": logprobs, "extras_digest": compute_extras_digest(extras),
                "chain_hash": compute_chain_hash(a.parent_chain_hash, ids),
                "cumulative_hash": hash_token_ids([*prompt_token_ids, *generated_token_ids]),
            }  # fmt: skip
            digest = compute_staging_digest(
                schema_version=a.schema_version, digest_version=STAGING_DIGEST_VERSION,
                extras_digest_version=EXTRAS_DIGEST_VERSION, **fields,
            )  # fmt: skip
            record = StagedCallRecord(digest=digest, extras=extras, **fields)
        except (TypeError, ValueError, OverflowError):
            logger.exception(
                "token capture could not build rollout %s call %s", a.rollout_id, a.model_call_id
            )
            return self._failed(call)
        try:
            result = (
                self._sink.stage(record)
                if attachments is None
                else self._sink.stage(record, attachments=attachments)
            )
            if not isinstance(result, StageResult):
                raise TypeError(f"StagingSink.stage returned {type(result).__name__}, not a StageResult")
        except Exception:
            logger.exception("token staging failed for rollout %s call %s", a.rollout_id, a.model_call_id)
            return self._failed(call)
        if not result.ok:
            logger.warning(
                "the staging sink refused rollout %s call %s: %s", a.rollout_id, a.model_call_id, result.error
            )
            return self._failed(call)
        return CommitCoords(
            rollout_id=a.rollout_id, model_call_id=a.model_call_id, parent_call_id=a.parent_call_id,
            prev_len=a.prev_len, delta_len=len(ids), cum_len=a.prev_len + len(ids),
            weight_version=call.weight_version, disposition="staged", digest=digest,
            extras_digest=fields["extras_digest"], staging_key=result.staging_key,
            chain_hash=fields["chain_hash"], cumulative_hash=fields["cumulative_hash"],
        )  # fmt: skip

    def complete_call_from_response(
        self, call: ActiveCall, response_payload: Any, *, attachments: Mapping[str, Any] | None = None
    ) -> CommitCoords:
        """Read the engine's native answer through the adapter and stage it."""
        if self._adapter is None:
            raise CaptureError("complete_call_from_response needs a CaptureAdapter")
        try:
            prompt = self._adapter.extract_prompt_ids(response_payload)
            generated, logprobs = self._adapter.extract_generation(response_payload)
            extras = self._adapter.extract_extras(response_payload)
        except Exception:
            logger.exception(
                "token extraction failed for rollout %s call %s", call.rollout_id, call.model_call_id
            )
            self._claim(call)
            return self._failed(call)
        return self.complete_call(
            call, prompt_token_ids=prompt, generated_token_ids=generated, generated_logprobs=logprobs,
            extras=extras, attachments=attachments,
        )  # fmt: skip

    def fail_call(self, call: ActiveCall, *, reason: str) -> CommitCoords:
        """Poison an admitted call that failed before staging."""
        self._claim(call)
        logger.warning(
            "token capture failed for rollout %s call %s: %s", call.rollout_id, call.model_call_id, reason
        )
        return self._failed(call)


class CaptureHost:
    """The smallest serving layer :func:`install_capture` can wire into."""

    def __init__(self) -> None:
        self.token_capture: RolloutTokenCapture | None = None

    def install_token_capture(self, capture: RolloutTokenCapture) -> None:
        """Keep the capture."""
        self.token_capture = capture


def install_capture(
    serving_layer: Any,
    *,
    sink: StagingSink,
    weight_version_fn: WeightVersionProvider,
    adapter: CaptureAdapter | None = None,
) -> RolloutTokenCapture:
    """Build a :class:`RolloutTokenCapture` and hand it to ``serving_layer.install_token_capture``."""
    if not isinstance(sink, StagingSink):
        raise TypeError(f"sink does not implement StagingSink: {type(sink)!r}")
    if not callable(weight_version_fn):
        raise TypeError(f"weight_version_fn must be callable, got {type(weight_version_fn)!r}")
    install = getattr(serving_layer, "install_token_capture", None)
    if not callable(install):
        raise TypeError(
            f"serving layer {type(serving_layer)!r} does not offer install_token_capture(capture)"
        )
    capture = RolloutTokenCapture(sink=sink, weight_version_fn=weight_version_fn, adapter=adapter)
    install(capture)
    return capture
