"""The Tokens page: a rollout's training sequence exactly as ``ng_export_training_data`` builds it.

:func:`token_view` runs :func:`nemo_gym.train_data.build_training_sequence` on the row and
returns one entry per token (ID, loss mask, log-prob, which model call it came from) plus the
contiguity verdict. With a tokenizer (``+tokenizer=<Hugging Face tokenizer folder or name>``)
each token is also decoded to its text; without one the page shows IDs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, cast

from nemo_gym.train_data import TrainingDataError, build_training_sequence, model_calls

__all__ = ["TokenDecoder", "load_tokenizer", "token_view"]


class TokenDecoder(Protocol):
    """What the page needs of a tokenizer: one token's text by its ID."""

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]: ...

    def decode(self, ids: list[int]) -> str: ...


def load_tokenizer(name_or_path: str) -> TokenDecoder:
    """A Hugging Face tokenizer (needs ``transformers``, the ``cpu`` extra).

    Raises:
        ValueError: naming the tokenizer when it cannot be loaded.
    """
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ValueError("+tokenizer needs transformers: pip install 'nemo_gym[cpu]'") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except Exception as exc:  # transformers raises many kinds; all mean "cannot load it"
        raise ValueError(f"+tokenizer={name_or_path!r} could not be loaded: {exc}") from exc
    return cast(TokenDecoder, tokenizer)


def _token_texts(tokenizer: TokenDecoder, ids: list[int]) -> list[str]:
    # Decoding one ID at a time shows the text each token adds (byte-level pieces included).
    return [tokenizer.decode([token]) for token in ids]


def token_view(
    rollout: Mapping[str, Any],
    *,
    tokenizer: TokenDecoder | None = None,
    turn_end_token_ids: Iterable[int] | None = None,
) -> dict[str, Any]:
    """The Tokens page's data for one rollout row.

    Returns ``{"available": False, "reason": ...}`` when the row cannot become a training
    sequence (no token IDs, malformed fields: the reason is ``ng_export_training_data``'s
    own message). Otherwise ``tokens``: ``[id, mask, logprob, call, text|None]`` per position,
    ``verdict``: contiguity (``contiguous``, ``num_calls``, ``break_at_call``,
    ``replaced_turn_ends``), ``calls``: where each model call's generation starts and ends.
    """
    try:
        sequence = build_training_sequence(rollout, turn_end_token_ids=turn_end_token_ids)
        calls = model_calls(rollout["response"])
    except TrainingDataError as exc:
        return {"available": False, "reason": str(exc)}
    # Which call each position belongs to: call k owns its new prompt context and its generation.
    owner: list[int] = []
    spans = []
    for call in calls:
        if sequence.break_at_call is not None and call.index >= sequence.break_at_call:
            break
        context_end = len(call.prompt_token_ids)
        owner += [call.index] * (context_end - len(owner))
        spans.append(
            {
                "call": call.index,
                "generation_start": context_end,
                "generation_end": context_end + len(call.generation_token_ids),
                "item_types": list(call.item_types),
            }
        )
        owner += [call.index] * len(call.generation_token_ids)
    texts = _token_texts(tokenizer, sequence.input_ids) if tokenizer is not None else None
    tokens = [
        [
            token,
            sequence.loss_mask[i],
            round(sequence.logprobs[i], 5),
            owner[i] if i < len(owner) else -1,
            texts[i] if texts is not None else None,
        ]
        for i, token in enumerate(sequence.input_ids)
    ]
    trained = sum(sequence.loss_mask)
    return {
        "available": True,
        "decoded": texts is not None,
        "reward": sequence.reward,
        "verdict": {
            "contiguous": sequence.contiguous,
            "num_calls": sequence.num_calls,
            "break_at_call": sequence.break_at_call,
            "replaced_turn_ends": sequence.replaced_turn_ends,
        },
        "length": len(sequence.input_ids),
        "trained_tokens": trained,
        "mean_logprob": (
            sum(lp for lp, m in zip(sequence.logprobs, sequence.loss_mask, strict=True) if m) / trained
            if trained
            else None
        ),
        "calls": spans,
        "tokens": tokens,
    }
