"""Megatron Inference's shapes for worker-owned staging (an offloaded payload object or a mapping)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PREFIX_IDS_FIELD = "required_prefix_token_ids"
PROMPT_IDS_FIELD = "prompt_token_ids"
GENERATED_IDS_FIELD = "generated_token_ids"
GENERATED_LOGPROBS_FIELD = "generated_log_probs"


def _sequence(payload: Any, name: str) -> Sequence[Any]:
    value = payload.get(name) if isinstance(payload, Mapping) else getattr(payload, name, None)
    if value is None:
        raise ValueError(f"the Megatron payload carries no {name}")
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"the Megatron payload's {name} must be a sequence")
    return value


def _token_ids(payload: Any, name: str) -> list[int]:
    values = _sequence(payload, name)
    if any(type(v) is not int for v in values):  # a float or bool would pass int() silently
        raise ValueError(f"the Megatron payload's {name} must hold integer token ids only")
    return list(values)


class MegatronCaptureAdapter:
    """Staging material from Megatron Inference's offloaded payloads."""

    def enter_prefix(self, request_payload: dict[str, Any], prefix_ids: list[int]) -> dict[str, Any]:
        """Ask the engine to begin the prompt with ``prefix_ids``."""
        request_payload[PREFIX_IDS_FIELD] = list(prefix_ids)
        return request_payload

    def extract_prompt_ids(self, response_payload: Any) -> list[int]:
        """The exact prompt IDs."""
        return _token_ids(response_payload, PROMPT_IDS_FIELD)

    def extract_generation(self, response_payload: Any) -> tuple[list[int], list[float]]:
        """The generated IDs and their log-probs."""
        ids = _token_ids(response_payload, GENERATED_IDS_FIELD)
        values = _sequence(response_payload, GENERATED_LOGPROBS_FIELD)
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
            raise ValueError(f"the Megatron payload's {GENERATED_LOGPROBS_FIELD} must be numbers")
        if len(ids) != len(values):
            raise ValueError(
                f"Megatron generated token and log-probability lengths differ: {len(ids)} != {len(values)}"
            )
        return ids, [float(v) for v in values]

    def extract_extras(self, response_payload: Any) -> dict[str, Any] | None:
        """None: Megatron returns no extras."""
        return None
