"""The CPU engine's model side: a Hugging Face causal LM, sampled token by token with a KV cache.

Everything here is synchronous and runs on the server's single generation thread. Logprobs
are the model's raw next-token log-probabilities (``log_softmax`` of the logits, before
temperature, top-p or top-k), as vLLM reports them by default, so a trainer can compare them
with its own forward pass.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingSettings:
    """How to pick each next token. ``temperature == 0`` is greedy; ``top_k <= 0`` is off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


@dataclass
class Generation:
    """What one generation produced.

    ``token_ids`` include a final stop token when the model sampled one (as vLLM reports
    them). ``top_logprobs[i]`` lists ``(token_id, logprob)`` of the ``top_n`` likeliest tokens at
    position i (empty lists when ``top_n`` is 0). ``finish_reason`` is ``stop`` or ``length``.
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "length"


class HFCausalLM:
    """A loaded causal LM and its tokenizer, with token-by-token generation."""

    def __init__(self, model: Any, tokenizer: Any, max_model_len: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len

    @classmethod
    def load(
        cls,
        path: str,
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,
        trust_remote_code: bool = False,
    ) -> HFCausalLM:
        """Load a checkpoint folder or hub name; ``max_model_len`` defaults to the model's positions."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
        ).eval()
        limit = getattr(model.config, "max_position_embeddings", None) or 2048
        if max_model_len is not None and max_model_len > limit:
            raise ValueError(
                f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={limit}"
            )
        return cls(model, tokenizer, max_model_len or limit)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of generated IDs without special tokens (the tokenizer's ``all_special_ids``).

        Filtering by ``all_special_ids`` rather than ``skip_special_tokens=True`` keeps added
        tokens that are not special in the model's own vocabulary (``<tool_call>``, ``<think>``),
        which some tokenizers flag as special in their added-token table.
        """
        special = self._special_ids
        return self.tokenizer.decode([i for i in token_ids if i not in special], skip_special_tokens=False)

    @property
    def _special_ids(self) -> frozenset[int]:
        cached = getattr(self, "_special_ids_cache", None)
        if cached is None:
            cached = frozenset(int(i) for i in self.tokenizer.all_special_ids)
            self._special_ids_cache = cached
        return cached

    def stop_token_ids(self) -> set[int]:
        """The IDs that end a generation: the tokenizer's EOS and the generation config's EOS list."""
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        generation_config = getattr(self.model, "generation_config", None)
        eos = getattr(generation_config, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(i) for i in eos)
        return ids

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingSettings,
        stop_token_ids: set[int],
        top_n: int = 0,
        forced_ids: Sequence[int] | None = None,
        stop_check: Callable[[list[int]], bool] | None = None,
        on_token: Callable[[int], None] | None = None,
    ) -> Generation:
        """Generate up to ``max_tokens`` tokens after ``prompt_ids``.

        With ``forced_ids`` the listed tokens are emitted instead of sampled ones (a test hook),
        still with the model's own logprobs for them; generation stops when they run out.
        ``stop_check(generated_ids)`` may end the generation early (stop strings).
        ``on_token(token_id)`` is called with each token as soon as it is chosen (streaming).
        """
        result = Generation()
        if max_tokens <= 0:
            return result
        generator = torch.Generator().manual_seed(
            sampling.seed if sampling.seed is not None else random.getrandbits(63)
        )
        outputs = self.model(input_ids=torch.tensor([list(prompt_ids)]), use_cache=True)
        past = kv_cache_of(outputs)
        cache_arg = kv_cache_argument(self.model)
        logits = outputs.logits[0, -1].float()
        for step in range(max_tokens):
            logprobs = torch.log_softmax(logits, dim=-1)
            if forced_ids is not None:
                if step >= len(forced_ids):
                    result.finish_reason = "stop"
                    break
                token = int(forced_ids[step])
            else:
                token = sample_token(logits, sampling, generator)
            result.token_ids.append(token)
            result.logprobs.append(float(logprobs[token]))
            if top_n > 0:
                values, indices = torch.topk(logprobs, min(top_n, logprobs.shape[-1]))
                result.top_logprobs.append(
                    [(int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
                )
            else:
                result.top_logprobs.append([])
            if on_token is not None:
                on_token(token)
            if token in stop_token_ids or (stop_check is not None and stop_check(result.token_ids)):
                result.finish_reason = "stop"
                break
            if step + 1 == max_tokens:
                break
            outputs = self.model(input_ids=torch.tensor([[token]]), use_cache=True, **{cache_arg: past})
            past = kv_cache_of(outputs)
            logits = outputs.logits[0, -1].float()
        if forced_ids is not None and len(result.token_ids) == len(forced_ids) and len(forced_ids) > 0:
            # Forced text that fits ends the way the test author wrote it.
            result.finish_reason = "stop"
        return result


@torch.inference_mode()
def teacher_forced(
    lm: HFCausalLM, prompt_ids: Sequence[int], token_ids: Sequence[int], *, top_n: int = 0
) -> Generation:
    """``token_ids`` after ``prompt_ids`` with the model's logprob of each, from one forward pass.

    Teacher forcing: the logits at position ``len(prompt) - 1 + i`` give the model's
    distribution for token i; its ``log_softmax`` is the logprob, as :meth:`HFCausalLM.generate`
    reports for sampled tokens. ``finish_reason`` is ``stop``.
    """
    result = Generation(finish_reason="stop")
    if not token_ids:
        return result
    sequence = torch.tensor([[*prompt_ids, *token_ids]])
    logits = lm.model(input_ids=sequence).logits[0, len(prompt_ids) - 1 : -1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    targets = torch.tensor(list(token_ids))
    result.token_ids = [int(i) for i in token_ids]
    result.logprobs = [float(v) for v in logprobs.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()]
    for row in logprobs:
        if top_n > 0:
            values, indices = torch.topk(row, min(top_n, row.shape[-1]))
            result.top_logprobs.append(
                [(int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
            )
        else:
            result.top_logprobs.append([])
    return result


def sample_token(logits: torch.Tensor, sampling: SamplingSettings, generator: torch.Generator) -> int:
    """One token from ``logits`` with temperature, top-k and top-p (nucleus) truncation."""
    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    scaled = logits / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampling.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    probs = torch.softmax(scaled, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = cumulative - sorted_probs >= sampling.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def kv_cache_argument(model: Any) -> str:
    """The name ``model.forward`` takes the key/value cache under: ``cache`` in transformers 5.2x,
    ``past_key_values`` before (passing the old name now warns on every call)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def kv_cache_of(outputs: Any) -> Any:
    """The key/value cache a forward pass returned, under either name (the old one warns when read)."""
    return outputs["cache"] if "cache" in outputs else outputs["past_key_values"]
