"""vLLM's request and response shapes for worker-owned staging."""

from __future__ import annotations

from typing import Any

PREFIX_IDS_FIELD = "required_prefix_token_ids"
PROMPT_IDS_FIELD = "prompt_token_ids"
ROUTED_EXPERTS_FIELD = "routed_experts"
MEDIA_SPANS_FIELD = "media_spans"


def _message(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice.get("message") or {}
    if not isinstance(message, dict):
        raise ValueError("a vLLM choice's message must be an object")
    return message


def _single_choice(payload: dict[str, Any]) -> dict[str, Any]:
    choices = payload.get("choices") or []
    if len(choices) != 1 or not isinstance(choices[0], dict):
        raise ValueError(f"token capture needs exactly one choice object, got {len(choices)}")
    return choices[0]


def extract_generation_token_info(choice: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Generated IDs and log-probs from the message's token fields, else ``logprobs.content``
    (``token_id:<n>`` tokens, as ``return_tokens_as_token_ids`` gives them)."""
    message = _message(choice)
    if "generation_token_ids" in message and "generation_log_probs" in message:
        raw_ids, raw_logprobs = message["generation_token_ids"], message["generation_log_probs"]
    else:
        content = (choice.get("logprobs") or {}).get("content")
        if content is None:
            raise ValueError("the vLLM answer has neither message token fields nor choice.logprobs.content")
        raw_ids, raw_logprobs = [t["token"] for t in content], [t["logprob"] for t in content]
    ids = [int(str(t).removeprefix("token_id:")) for t in raw_ids]
    logprobs = [float(v) for v in raw_logprobs]
    if len(ids) != len(logprobs):
        raise ValueError(f"generated token and log-probability lengths differ: {len(ids)} != {len(logprobs)}")
    return ids, logprobs


class VLLMCaptureAdapter:
    """Staging material from (and the parent prefix into) vLLM's Chat Completions shapes."""

    def enter_prefix(self, request_payload: dict[str, Any], prefix_ids: list[int]) -> dict[str, Any]:
        """Ask the engine to begin the prompt with ``prefix_ids``."""
        request_payload[PREFIX_IDS_FIELD] = list(prefix_ids)
        return request_payload

    def extract_prompt_ids(self, response_payload: dict[str, Any]) -> list[int]:
        """The answer's prompt IDs (top level, else on the message)."""
        ids = response_payload.get(PROMPT_IDS_FIELD)
        if ids is None:
            ids = _message(_single_choice(response_payload)).get(PROMPT_IDS_FIELD)
        if ids is None:
            raise ValueError("the vLLM answer carries no prompt_token_ids")
        return [int(t) for t in ids]

    def extract_generation(self, response_payload: dict[str, Any]) -> tuple[list[int], list[float]]:
        """The generated IDs and log-probs of the answer's one choice."""
        return extract_generation_token_info(_single_choice(response_payload))

    def extract_extras(self, response_payload: dict[str, Any]) -> dict[str, Any] | None:
        """Routed experts and media spans, when the engine returned them."""
        extras: dict[str, Any] = {}
        routed = _message(_single_choice(response_payload)).get(ROUTED_EXPERTS_FIELD)
        if routed is not None:
            if not isinstance(routed, str | dict | list):
                raise ValueError("vLLM routed_experts must be JSON data")
            extras[ROUTED_EXPERTS_FIELD] = routed
        if MEDIA_SPANS_FIELD in response_payload:
            spans = response_payload[MEDIA_SPANS_FIELD]
            if not isinstance(spans, list) or not all(isinstance(s, dict) for s in spans):
                raise ValueError("vLLM media_spans must be a list of objects")
            extras[MEDIA_SPANS_FIELD] = spans
        return extras or None
