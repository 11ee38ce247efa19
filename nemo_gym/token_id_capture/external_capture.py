"""The model server's side of worker-owned staging, per engine backend.

Around each admitted engine request a handler (1) asks the worker to stage the call
(:meth:`prepare_request`: the admission under ``ng_capture``, non-streaming, log-probs on),
(2) takes the worker's acknowledgement off its answer and scrubs every token field before the
answer goes further (:meth:`prepare_response`), and (3) once the answer is converted for the
client, publishes the call's ledger row from exactly what was served, so the next turn's echoed
history resolves to it (:meth:`finalize_response`). A missing, failed or inconsistent
acknowledgement poisons the call in the ledger; a completion the server made up itself (a
context overflow turned into an empty answer) never reached the worker and stays uncommitted,
which the capture middleware then records.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Protocol

from nemo_gym.token_id_capture.config import ExternalStagingBackend
from nemo_gym.token_id_capture.fingerprint import FINGERPRINT_VERSION, assistant_fingerprint
from nemo_gym.token_id_capture.protocols import CaptureLedger
from nemo_gym.token_id_capture.records import TOKEN_FIELDS, response_to_output_items, strip_token_fields
from nemo_gym.token_id_capture.sink import (
    NG_CAPTURE_FIELD,
    NG_COMMIT_COORDS_FIELD,
    CaptureContext,
    current_capture_context,
    mark_external_staging_committed,
)
from nemo_gym.token_id_capture.staging.records import (
    INVALID_COMMIT_COORDS_REASON,
    WORKER_CAPTURE_FAILED_REASON,
    WORKER_MISSING_COMMIT_COORDS_REASON,
    CallRecord,
    CaptureAdmission,
    CaptureLedgerCommit,
    CommitCoords,
)

logger = logging.getLogger(__name__)

_MEGATRON_TRANSPORT_FIELDS = ("compact_prompt_token_ids",)


class ExternalCaptureHandler(Protocol):
    """What a model adapter calls around one engine request whose tokens a worker stages."""

    def prepare_request(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        """The engine request, carrying the admission when the call was admitted."""
        ...

    def prepare_response(self, response_payload: dict[str, Any]) -> None:
        """Keep the acknowledgement, strip token fields (call it for every real worker completion)."""
        ...

    async def finalize_response(self, served_payload: dict[str, Any]) -> None:
        """Publish the call's ledger row from the answer as served."""
        ...


def _strip_capture_transport_fields(payload: dict[str, Any]) -> None:
    payload.pop(NG_COMMIT_COORDS_FIELD, None)
    payload.pop("prompt_token_ids", None)
    for choice in payload.get("choices") or []:
        if isinstance(choice, dict):
            choice.pop("logprobs", None)
            choice.pop("token_ids", None)
            if isinstance(choice.get("message"), dict):
                for name in (*TOKEN_FIELDS, *_MEGATRON_TRANSPORT_FIELDS):
                    choice["message"].pop(name, None)


def _fingerprint(items: list[dict[str, Any]]) -> str | None:
    try:
        return assistant_fingerprint(items) or None
    except (TypeError, ValueError):
        return None


class _BaseExternalCaptureHandler(ABC):
    """The lifecycle every backend shares; backends differ only in how they ask to stage."""

    _BACKEND_LABEL = ""

    def prepare_request(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        """Non-streaming, and the admission attached; an unadmitted call goes as plain traffic."""
        context = current_capture_context()
        if context is None or not context.external_staging:
            return request_payload
        if request_payload.get("stream"):
            raise ValueError("external staging requires non-streaming backend requests")
        request_payload["stream"] = False
        request_payload.pop("stream_options", None)
        if context.capture_admission is None:
            return request_payload
        return self._prepare_admitted_request(request_payload, context.capture_admission)

    @abstractmethod
    def _prepare_admitted_request(
        self, request_payload: dict[str, Any], admission: CaptureAdmission
    ) -> dict[str, Any]:
        """Attach the backend's staging fields."""

    def prepare_response(self, response_payload: dict[str, Any]) -> None:
        """Hold the acknowledgement on the capture context and scrub the engine answer."""
        context = current_capture_context()
        if context is None or not context.external_staging:
            return
        context.external_commit_coords = response_payload.pop(NG_COMMIT_COORDS_FIELD, None)
        context.external_worker_response_seen = True
        _strip_capture_transport_fields(response_payload)

    async def finalize_response(self, served_payload: dict[str, Any]) -> None:
        """Validate the held acknowledgement and record the served answer (or poison the call)."""
        context = current_capture_context()
        if context is None or not context.external_staging or context.lineage_store is None:
            return
        ledger = context.lineage_store
        if not isinstance(ledger, CaptureLedger):
            raise ValueError("external staging needs a CaptureLedger as the capture context's lineage store")
        admission = context.capture_admission
        if admission is None or not context.external_worker_response_seen:
            return
        try:
            await self._commit(served_payload, context, ledger, admission)
        except Exception:
            logger.exception(
                "%s worker acknowledgement failed for rollout %s call %s",
                self._BACKEND_LABEL, context.rollout_id, context.model_call_id,
            )  # fmt: skip
            try:
                await ledger.record_failure(
                    context.rollout_id, context.model_call_id, INVALID_COMMIT_COORDS_REASON
                )
            except Exception:
                logger.exception(
                    "could not poison rollout %s call %s", context.rollout_id, context.model_call_id
                )

    async def _commit(
        self,
        served: dict[str, Any],
        context: CaptureContext,
        ledger: CaptureLedger,
        admission: CaptureAdmission,
    ) -> None:
        # The worker staged before acknowledging, so the ledger row (what makes the call a
        # resolvable parent) is only ever written for durable tokens.
        if context.external_commit_coords is None:
            await ledger.record_failure(
                context.rollout_id, context.model_call_id, WORKER_MISSING_COMMIT_COORDS_REASON
            )
            return
        coords = CommitCoords.model_validate(context.external_commit_coords)
        if (coords.rollout_id, coords.model_call_id) != (context.rollout_id, context.model_call_id):
            raise ValueError(
                f"coordinates for {coords.rollout_id}/{coords.model_call_id} do not belong to the active "
                f"capture {context.rollout_id}/{context.model_call_id}"
            )
        if coords.disposition == "capture_failed":
            await ledger.record_failure(
                context.rollout_id, context.model_call_id, WORKER_CAPTURE_FAILED_REASON
            )
            return
        if (coords.parent_call_id, coords.prev_len) != (admission.parent_call_id, admission.prev_len):
            raise ValueError(f"the coordinates of {coords.model_call_id} diverge from its admission")
        response_id = str(served.get("id") or "")
        if not response_id:
            raise ValueError(f"the served answer of {coords.model_call_id} carries no id")
        response_items, _ = strip_token_fields(response_to_output_items(served))
        request_items = list(context.request_items or [])
        staged = coords.model_dump(
            include={"digest", "extras_digest", "staging_key", "chain_hash", "cumulative_hash"}
        )
        record = CallRecord(
            **staged,
            model_call_id=coords.model_call_id,
            parent_call_id=coords.parent_call_id,
            prev_len=coords.prev_len,
            delta_len=coords.delta_len,
            cum_len=coords.cum_len,
            weight_version=coords.weight_version,
            mode=admission.mode,
            admitted_at=context.admitted_at,
            response_id=response_id,
            output_fingerprint=_fingerprint(response_items),
            continuation_fingerprint=_fingerprint(request_items + response_items),
            fingerprint_version=FINGERPRINT_VERSION,
        )
        await ledger.record(
            CaptureLedgerCommit(
                rollout_id=context.rollout_id,
                record=record,
                staging_chain=(*context.parent_staging_chain, str(coords.staging_key)),
                request_items=request_items,
                response_items=response_items,
            )
        )
        mark_external_staging_committed(rollout_id=coords.rollout_id, model_call_id=coords.model_call_id)


class VLLMWorkerCaptureHandler(_BaseExternalCaptureHandler):
    """A vLLM worker stages the call: admission under ``ng_capture``, token IDs as log-prob tokens."""

    _BACKEND_LABEL = "vLLM"

    def _prepare_admitted_request(
        self, request_payload: dict[str, Any], admission: CaptureAdmission
    ) -> dict[str, Any]:
        request_payload[NG_CAPTURE_FIELD] = admission.model_dump(mode="json")
        request_payload.update(logprobs=True, top_logprobs=0, return_tokens_as_token_ids=True)
        if admission.mode == "token_in":
            request_payload["required_prefix_token_ids"] = list(admission.required_prefix_token_ids)
        return request_payload


class MegatronWorkerCaptureHandler(_BaseExternalCaptureHandler):
    """A Megatron Inference worker stages the call: admission under ``offload_params.ng_capture``."""

    _BACKEND_LABEL = "Megatron"

    def _prepare_admitted_request(
        self, request_payload: dict[str, Any], admission: CaptureAdmission
    ) -> dict[str, Any]:
        if request_payload.get("n") not in (None, 1):
            raise ValueError("Megatron token capture requires n=1")
        offload = request_payload.setdefault("offload_params", {})
        if offload is None:
            offload = request_payload["offload_params"] = {}
        if not isinstance(offload, dict):
            raise ValueError("Megatron offload_params must be an object")
        offload[NG_CAPTURE_FIELD] = admission.model_dump(mode="json")
        request_payload.update(logprobs=True, top_logprobs=0)
        return request_payload


def make_external_capture_handler(backend: ExternalStagingBackend) -> ExternalCaptureHandler:
    """The handler of the configured backend (``vllm_worker`` or ``megatron_worker``)."""
    if backend == "vllm_worker":
        return VLLMWorkerCaptureHandler()
    if backend == "megatron_worker":
        return MegatronWorkerCaptureHandler()
    raise ValueError(f"unsupported external staging backend {backend!r}: use vllm_worker or megatron_worker")
