"""Scoring token IDs with the CPU engine, in vLLM's words: prompt log-probs and ``/detokenize``.

A trainer (or ``ng_certify_harness``) re-scores an exported training sequence to check that the
log-probs recorded at sampling time are the model's: vLLM answers ``POST /v1/completions`` with
``prompt`` a list of token IDs and ``prompt_logprobs: 0`` with one entry per prompt token
(``null`` for the first, then ``{"<id>": {"logprob", "rank", "decoded_token"}}``), and
``POST /detokenize`` turns token IDs back into text. This engine serves exactly that scoring form
of ``/v1/completions`` (``max_tokens`` 0 or 1: nothing is generated); any other completion
request is a 400 naming what it does not serve.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import torch

from nemo_gym.base_responses_api_model import HTTPError


def _token_ids(value: Any, field: str) -> list[int]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        raise HTTPError(400, f"'{field}' must be a non-empty list of integer token IDs")
    return value


def scoring_request(body: dict[str, Any], vocab_size: int, max_model_len: int) -> list[int]:
    """The token IDs of a scoring request; 400 naming the field for anything else."""
    ids = _token_ids(body.get("prompt"), "prompt")
    if body.get("prompt_logprobs") is None:
        raise HTTPError(
            400, "this engine serves /v1/completions only to score a prompt: set 'prompt_logprobs': 0"
        )
    if body.get("max_tokens", 1) not in (0, 1):
        raise HTTPError(
            400, "this engine serves /v1/completions only to score a prompt: 'max_tokens' must be 0 or 1"
        )
    if body.get("stream"):
        raise HTTPError(400, "'stream' is not served for scoring requests")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise HTTPError(400, f"'prompt' holds token ID {bad}, outside the vocabulary (0..{vocab_size - 1})")
    if len(ids) > max_model_len:
        raise HTTPError(
            400, f"'prompt' has {len(ids)} tokens, more than the context window of {max_model_len}"
        )
    return ids


@torch.inference_mode()
def prompt_logprobs(model: Any, ids: list[int]) -> list[float]:
    """``log p(ids[i] | ids[:i])`` for ``i >= 1``, from one forward pass (raw distribution, as sampled)."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    return logprobs.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).tolist()


def completion_answer(model_name: str, ids: list[int], scores: list[float], decode: Any) -> dict[str, Any]:
    """vLLM's completion object for a scoring request."""
    entries: list[dict[str, Any] | None] = [None]
    for token, logprob in zip(ids[1:], scores, strict=True):
        entries.append({str(token): {"logprob": logprob, "rank": None, "decoded_token": decode([token])}})
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [
            {"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "prompt_logprobs": entries}
        ],
        "usage": {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)},
    }


def detokenize_request(body: dict[str, Any]) -> list[int]:
    """The token IDs of vLLM's ``/detokenize`` body (``{"tokens": [...]}``)."""
    return _token_ids(body.get("tokens"), "tokens")
