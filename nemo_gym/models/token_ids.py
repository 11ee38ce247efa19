"""Token-ID splicing: keep every model call's prompt an exact extension of the previous call.

RL trainers learn from the token IDs the policy actually sampled. In a multi-turn rollout the
engine re-renders the whole conversation through the chat template for each call, and
re-tokenizing an earlier assistant turn rarely yields the IDs that were sampled (BPE merges
across sampling boundaries, reformatted tool-call JSON, reasoning dropped by the template).
The trainer would then see call k+1's prompt disagree with call k's prompt + generation, and
could not build one contiguous training sequence.

The fix, applied on the engine side before each generation: take the previous call's IDs
verbatim up to the end of the last assistant turn, and let the template supply only what
comes after (tool results, the next user turn, the generation prompt). The seam is found by
counting turn-end tokens, never by position; see :func:`splice_prefix_token_ids`.

See ``docs/TOKEN_IDS.md`` for the full story and how a trainer consumes the result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "TOKEN_ID_FIELDS",
    "SpliceInputs",
    "TokenSpliceError",
    "compute_splice_inputs",
    "detect_turn_end_token_ids",
    "render_chat_token_ids",
    "require_single_choice",
    "splice_prefix_token_ids",
    "spliced_prompt_token_ids",
]

logger = logging.getLogger(__name__)

# The fields that ride on an assistant message (or a Responses output item) between calls.
TOKEN_ID_FIELDS: Final[tuple[str, ...]] = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")

# Turn-end tokens of common chat-template families, tried in order by detect_turn_end_token_ids.
_KNOWN_TURN_END_TOKENS: Final[tuple[str, ...]] = (
    "<|im_end|>",  # ChatML: Qwen, Yi, many fine-tunes
    "<|eot_id|>",  # Llama 3.x
    "<|eom_id|>",  # Llama 3.1 built-in tool turns
    "<end_of_turn>",  # Gemma
    "<|end|>",  # Phi-3
)


class TokenSpliceError(ValueError):
    """The inputs of a splice are inconsistent, so splicing them would corrupt the sequence.

    ``check`` names the consistency check that failed (stable, for logs and metrics);
    the message says what was found and what to look at.
    """

    def __init__(self, check: str, message: str) -> None:
        super().__init__(f"token splice check '{check}' failed: {message}")
        self.check = check


def _count(token_ids: Iterable[int], turn_end: frozenset[int]) -> int:
    return sum(1 for token_id in token_ids if token_id in turn_end)


def _nth_position(token_ids: Sequence[int], turn_end: frozenset[int], n: int) -> int:
    """Index of the n-th (1-based) turn-end token, or -1 when there are fewer than n."""
    seen = 0
    for position, token_id in enumerate(token_ids):
        if token_id in turn_end:
            seen += 1
            if seen == n:
                return position
    return -1


def splice_prefix_token_ids(
    model_prefix_token_ids: Sequence[int],
    template_prefix_token_ids: Sequence[int],
    template_full_token_ids: Sequence[int],
    turn_end_token_ids: Iterable[int],
) -> list[int]:
    """Return the prompt IDs for the next call: the sampled prefix, then the template's tail.

    Args:
        model_prefix_token_ids: the previous call's ``prompt_token_ids + generation_token_ids``,
            exactly as the engine saw and sampled them.
        template_prefix_token_ids: the template's render of the history up to and including
            the assistant message that carried those IDs, without a generation prompt.
        template_full_token_ids: the template's render of the whole history, with the
            generation prompt: what the engine would feed without splicing.
        turn_end_token_ids: the IDs that close one turn (``<|im_end|>``, ``<|eot_id|>``, ...).

    Returns:
        ``model_prefix`` (minus a trailing turn-end token) followed by ``template_full`` from its
        n-th turn-end token on, where n is the number of turn-end tokens in ``template_prefix``.
        With an empty ``model_prefix`` this is ``template_full`` unchanged.

    Raises:
        TokenSpliceError: when the inputs disagree about where the assistant turn ends
            (``check`` is ``prefix_render_has_no_turn_end``, ``full_render_too_few_turn_ends``
            or ``model_prefix_turn_end_count``).

    Why count turn ends and not positions: the history before the seam is rendered from the
    same messages in both renders, but not necessarily to the same length. Templates that
    drop the reasoning of earlier assistant turns (Qwen3) render that turn with its
    ``<think>`` block while it is the latest turn and without it once a new user message
    follows, so a cut at ``len(template_prefix)`` lands past the seam and silently drops the
    new turn. What templates do keep is the number of turns: the n-th turn end of the prefix
    render is the n-th turn end of the full render. Turn-end tokens are special tokens, so
    the tokenizer never merges across them and the tail after the cut tokenizes the same on
    its own as inside the full render.

    Why the trailing turn-end token is dropped and the template's is used: a generation cut
    by ``max_tokens`` (or stopped by another stop token) has no turn end, yet the next turn
    must still start after one. Taking the turn-end token from the template covers both
    cases with one rule; when the model did sample it, the template's is the same ID.

    Why the model prefix must hold exactly n-1 turn ends once its trailing one is dropped: the
    previous prompt was the render of the history before that assistant message with a
    generation prompt, which closes n-1 turns, and the engine stops generating at the first
    turn end, so the generation holds none before its last token. Any other count means the
    IDs do not belong to this history (a message was edited, dropped or inserted; the engine
    tokenized a special-token string differently from this render; the model wrote a
    turn-end marker as plain text; the wrong turn-end IDs were configured), and splicing
    would put the seam in the wrong place. Such inputs are refused, never spliced.
    """
    turn_end = frozenset(turn_end_token_ids)
    if not model_prefix_token_ids:
        return list(template_full_token_ids)
    if not turn_end:
        raise TokenSpliceError("no_turn_end_token_ids", "the set of turn-end token IDs is empty")

    n = _count(template_prefix_token_ids, turn_end)
    if n == 0:
        raise TokenSpliceError(
            "prefix_render_has_no_turn_end",
            f"the template's render of the history up to the last assistant message contains none of "
            f"the turn-end token IDs {sorted(turn_end)}; configure the turn-end IDs this chat template uses",
        )

    cut = _nth_position(template_full_token_ids, turn_end, n)
    if cut < 0:
        raise TokenSpliceError(
            "full_render_too_few_turn_ends",
            f"the prefix render closes {n} turns but the full render closes only "
            f"{_count(template_full_token_ids, turn_end)}; the two renders must come from the same "
            "history, with the same tools and template arguments",
        )

    model_body = list(model_prefix_token_ids)
    if model_body[-1] in turn_end:
        model_body.pop()
    found = _count(model_body, turn_end)
    if found != n - 1:
        raise TokenSpliceError(
            "model_prefix_turn_end_count",
            f"the previous prompt + generation closes {found} turns before its end, but the template "
            f"places the end of that assistant turn at turn end #{n} (so {n - 1} were expected); the "
            "token IDs do not belong to this history (edited or dropped messages, a special-token "
            "string tokenized differently, or wrong turn-end IDs)",
        )
    return model_body + list(template_full_token_ids[cut:])


@dataclass(frozen=True)
class SpliceInputs:
    """Everything :func:`splice_prefix_token_ids` needs, gathered from one request.

    ``message_index`` is the position in ``messages`` of the assistant message whose token IDs
    form ``model_prefix_token_ids``.
    """

    message_index: int
    model_prefix_token_ids: list[int]
    template_prefix_token_ids: list[int]
    template_full_token_ids: list[int]
    turn_end_token_ids: frozenset[int]

    def splice(self) -> list[int]:
        """Run :func:`splice_prefix_token_ids` on these inputs (may raise :class:`TokenSpliceError`)."""
        return splice_prefix_token_ids(
            self.model_prefix_token_ids,
            self.template_prefix_token_ids,
            self.template_full_token_ids,
            self.turn_end_token_ids,
        )


def detect_turn_end_token_ids(tokenizer: Any) -> list[int]:
    """Guess the turn-end token IDs of a Hugging Face tokenizer from its chat template.

    A known turn-end marker counts when its string appears in the chat template and it is a
    single token in the vocabulary; without any, the EOS token is used. Returns sorted IDs.
    Configure the IDs explicitly for templates this does not recognise.

    Raises:
        TokenSpliceError: (check ``turn_end_token_ids_unknown``) when nothing fits.
    """
    template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(template, str):  # a dict of named templates
        template = "\n".join(str(value) for value in dict(template).values())
    vocab = tokenizer.get_vocab()
    found = {vocab[token] for token in _KNOWN_TURN_END_TOKENS if token in template and token in vocab}
    if not found and getattr(tokenizer, "eos_token_id", None) is not None:
        found = {int(tokenizer.eos_token_id)}
    if not found:
        raise TokenSpliceError(
            "turn_end_token_ids_unknown",
            "cannot tell which tokens end a turn in this chat template and the tokenizer has no EOS "
            "token; configure the turn-end token IDs explicitly",
        )
    return sorted(found)


def require_single_choice(n: int | None) -> None:
    """Refuse a request for more than one choice when token IDs are returned.

    A rollout is one trajectory: the next call's prompt extends exactly one generation, the
    Responses API returns a single output, and repeated samples of a prompt are separate
    rollouts made by the collector. Several choices carrying token IDs would leave the trainer
    guessing which one the agent continued, so model servers call this and answer 400.

    Raises:
        TokenSpliceError: (check ``n_greater_than_one``) when ``n`` is more than 1.
    """
    if n is not None and n > 1:
        raise TokenSpliceError(
            "n_greater_than_one",
            f"n={n} choices were requested with token IDs; request n=1 and let the collector make "
            "repeats (num_repeats), one rollout each",
        )


def _without_token_ids(message: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if key not in TOKEN_ID_FIELDS}


def _as_token_ids(value: Any, field: str, index: int) -> list[int]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(token_id, int) and not isinstance(token_id, bool) for token_id in value
    ):
        raise TokenSpliceError("token_ids_malformed", f"messages[{index}].{field} must be a list of integers")
    return list(value)


def render_chat_token_ids(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
    encode: Callable[[str], list[int]] | None = None,
) -> list[int]:
    """Render Chat Completions messages through the chat template and tokenize the text.

    Token-ID fields on the messages are ignored. The text is encoded without added special
    tokens, as vLLM does for chat requests: the template already writes any BOS it wants, and
    a tokenizer that prepends one on plain ``encode`` (Llama 3) would otherwise double it.
    Engines should use this same function for unspliced prompts, so that both paths render
    identically. ``encode`` replaces that encoding with one giving the same IDs (a rollout's
    :class:`~nemo_gym.models.prompt_token_cache.PromptTokenCache`, which tokenizes only what is
    new since the rollout's previous call).
    """
    text = tokenizer.apply_chat_template(
        [_without_token_ids(message) for message in messages],
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **dict(chat_template_kwargs or {}),
    )
    if encode is not None:
        return encode(text)
    return list(tokenizer.encode(text, add_special_tokens=False))


def compute_splice_inputs(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    turn_end_token_ids: Iterable[int] | None = None,
    encode: Callable[[str], list[int]] | None = None,
) -> SpliceInputs | None:
    """Gather the splice inputs for a Chat Completions request, or None when there is nothing to splice.

    Finds the last assistant message that carries ``prompt_token_ids`` and
    ``generation_token_ids`` and renders the history through it (no generation prompt) and
    the whole history (with the generation prompt), both with the same ``tools`` and
    ``chat_template_kwargs`` as the request. Only the last such message matters: its prompt
    already contains every earlier turn as the engine saw it.

    ``turn_end_token_ids`` defaults to :func:`detect_turn_end_token_ids`; ``encode`` is
    :func:`render_chat_token_ids`'s.

    Raises:
        TokenSpliceError: when that message carries one of the two ID fields without the
            other, or a field that is not a list of integers.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") != "assistant":
            continue
        has_prompt = message.get("prompt_token_ids") is not None
        has_generation = message.get("generation_token_ids") is not None
        if not has_prompt and not has_generation:
            continue
        if has_prompt != has_generation:
            present, missing = (
                ("prompt_token_ids", "generation_token_ids")
                if has_prompt
                else ("generation_token_ids", "prompt_token_ids")
            )
            raise TokenSpliceError(
                "token_ids_incomplete",
                f"messages[{index}] carries {present} without {missing}; send back all token-ID "
                "fields of a model call unchanged, or none",
            )
        model_prefix = _as_token_ids(message["prompt_token_ids"], "prompt_token_ids", index) + _as_token_ids(
            message["generation_token_ids"], "generation_token_ids", index
        )
        turn_end = frozenset(
            turn_end_token_ids if turn_end_token_ids is not None else detect_turn_end_token_ids(tokenizer)
        )
        return SpliceInputs(
            message_index=index,
            model_prefix_token_ids=model_prefix,
            template_prefix_token_ids=render_chat_token_ids(
                messages[: index + 1],
                tokenizer,
                tools,
                chat_template_kwargs,
                add_generation_prompt=False,
                encode=encode,
            ),
            template_full_token_ids=render_chat_token_ids(
                messages, tokenizer, tools, chat_template_kwargs, add_generation_prompt=True, encode=encode
            ),
            turn_end_token_ids=turn_end,
        )
    return None


def spliced_prompt_token_ids(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    turn_end_token_ids: Iterable[int] | None = None,
    encode: Callable[[str], list[int]] | None = None,
) -> tuple[list[int], bool]:
    """Return the prompt IDs to feed the engine and whether they extend the previous call's IDs.

    Returns ``(prompt_token_ids, contiguous)``. ``contiguous`` is True when the prompt starts
    with the previous call's prompt + generation (minus a trailing turn-end token), and also
    when no message carries token IDs (a first call has nothing to extend). It is False only
    when a splice was needed but refused; the prompt is then the plain template render, a
    warning names the failed check, and the caller should mark the response
    ``token_ids_contiguous: false`` so a trainer does not stitch it onto the previous call.

    Refusing falls back instead of failing the request because the rollout is still valid
    for evaluation and reward; only its use as one contiguous training sequence is lost, and
    that loss is now visible instead of silent. ``encode`` is :func:`render_chat_token_ids`'s.
    """
    try:
        inputs = compute_splice_inputs(
            messages, tokenizer, tools, chat_template_kwargs, turn_end_token_ids, encode=encode
        )
    except TokenSpliceError as error:
        logger.warning("token-ID splice refused, using the plain template render: %s", error)
        return render_chat_token_ids(messages, tokenizer, tools, chat_template_kwargs, encode=encode), False
    if inputs is None:
        return render_chat_token_ids(messages, tokenizer, tools, chat_template_kwargs, encode=encode), True
    try:
        return inputs.splice(), True
    except TokenSpliceError as error:
        logger.warning(
            "token-ID splice refused for messages[%d], using the plain template render: %s",
            inputs.message_index,
            error,
        )
        return list(inputs.template_full_token_ids), False
