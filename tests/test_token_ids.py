"""Token-ID splicing, checked with real (tiny, locally built) tokenizers and real chat templates."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from nemo_gym.engine.tiny_tokenizer import (
    TEMPLATES,
    build_tiny_tokenizer,
    chat_template_source,
    save_tiny_tokenizer,
    turn_end_token_ids,
)
from nemo_gym.models.token_ids import (
    SpliceInputs,
    TokenSpliceError,
    compute_splice_inputs,
    detect_turn_end_token_ids,
    render_chat_token_ids,
    require_single_choice,
    splice_prefix_token_ids,
    spliced_prompt_token_ids,
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@functools.cache
def tiny(template: str) -> PreTrainedTokenizerFast:
    # Shared across tests (and hypothesis examples); tests only read from it.
    return build_tiny_tokenizer(template)


def encode(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def decode(tokenizer: PreTrainedTokenizerFast, token_ids: Sequence[int]) -> str:
    return str(tokenizer.decode(list(token_ids)))


def token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int)
    return found


def turn_end(tokenizer: PreTrainedTokenizerFast) -> int:
    (token_id,) = turn_end_token_ids(tokenizer)
    return token_id


def without_trailing_turn_end(token_ids: Sequence[int], tokenizer: PreTrainedTokenizerFast) -> list[int]:
    ids = list(token_ids)
    return ids[:-1] if ids and ids[-1] in turn_end_token_ids(tokenizer) else ids


def assistant(content: Any, prompt: list[int], generation: list[int], **fields: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": [-0.5] * len(generation),
        **fields,
    }


def position_based_splice(
    model_prefix: Sequence[int], prefix_render: Sequence[int], full_render: Sequence[int], eos: int
) -> list[int]:
    """The naive splice this module replaces: cut the full render at the last turn end that lies
    within the prefix render's length. Kept here only to show what it gets wrong."""
    body = list(model_prefix[:-1]) if model_prefix and model_prefix[-1] == eos else list(model_prefix)
    limit = min(len(prefix_render), len(full_render))
    cut = max(position for position in range(limit) if full_render[position] == eos)
    return body + list(full_render[cut:])


# ------------------------------------------------------------------ the pure function, synthetic IDs
# 98 = turn start, 99 = turn end, 50 = newline, 11 = "assistant" header.

PREFIX_RENDER = [98, 10, 99, 50, 98, 11, 13, 14, 99, 50]
FULL_RENDER = PREFIX_RENDER + [98, 20, 99, 50, 98, 11]
EXPECTED_TAIL = [99, 50, 98, 20, 99, 50, 98, 11]


def test_empty_model_prefix_returns_the_full_render_unchanged() -> None:
    assert splice_prefix_token_ids([], PREFIX_RENDER, FULL_RENDER, {99}) == FULL_RENDER
    # Nothing to splice means nothing to check: even a render without turn ends passes through.
    assert splice_prefix_token_ids([], [1, 2], [1, 2, 3], {99}) == [1, 2, 3]


def test_trailing_turn_end_is_replaced_by_the_templates() -> None:
    model_prefix = [98, 10, 99, 50, 98, 11, 12, 99]  # sampled 12 where the template renders 13 14
    spliced = splice_prefix_token_ids(model_prefix, PREFIX_RENDER, FULL_RENDER, [99])
    assert spliced == [98, 10, 99, 50, 98, 11, 12] + EXPECTED_TAIL


def test_generation_without_turn_end_still_gets_one() -> None:
    model_prefix = [98, 10, 99, 50, 98, 11, 12]  # cut by max_tokens
    spliced = splice_prefix_token_ids(model_prefix, PREFIX_RENDER, FULL_RENDER, [99])
    assert spliced == model_prefix + EXPECTED_TAIL


def test_any_configured_turn_end_counts() -> None:
    # 97 stands for a second stop token (an EOS the engine also stops on).
    model_prefix = [98, 10, 99, 50, 98, 11, 12, 97]
    spliced = splice_prefix_token_ids(model_prefix, PREFIX_RENDER, FULL_RENDER, frozenset({97, 99}))
    assert spliced == [98, 10, 99, 50, 98, 11, 12] + EXPECTED_TAIL


@pytest.mark.parametrize(
    ("model_prefix", "prefix_render", "full_render", "turn_ends", "check"),
    [
        ([98, 11, 12], [98, 11, 12], [98, 11, 12, 98], [99], "prefix_render_has_no_turn_end"),
        (
            [98, 10, 99, 50, 98, 11, 12, 99],
            PREFIX_RENDER,
            [98, 10, 99, 50, 98, 11],
            [99],
            "full_render_too_few_turn_ends",
        ),
        # The previous prompt closes no turn, but the template says the assistant turn is the second.
        ([98, 11, 12, 99], PREFIX_RENDER, FULL_RENDER, [99], "model_prefix_turn_end_count"),
        # A turn end inside the generation: the engine never emits tokens after a turn end.
        (
            [98, 10, 99, 50, 98, 11, 12, 99, 12, 99],
            PREFIX_RENDER,
            FULL_RENDER,
            [99],
            "model_prefix_turn_end_count",
        ),
        ([98, 10, 99, 50, 98, 11, 12, 99], PREFIX_RENDER, FULL_RENDER, [], "no_turn_end_token_ids"),
    ],
)
def test_inconsistent_inputs_are_refused_with_the_failed_check(
    model_prefix: list[int],
    prefix_render: list[int],
    full_render: list[int],
    turn_ends: list[int],
    check: str,
) -> None:
    with pytest.raises(TokenSpliceError) as caught:
        splice_prefix_token_ids(model_prefix, prefix_render, full_render, turn_ends)
    assert caught.value.check == check
    assert check in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_more_than_one_choice_is_refused() -> None:
    require_single_choice(None)
    require_single_choice(1)
    with pytest.raises(TokenSpliceError) as caught:
        require_single_choice(4)
    assert caught.value.check == "n_greater_than_one"


# ------------------------------------------------------------------ real tokenizers and templates


def test_merge_drift_keeps_the_sampled_ids() -> None:
    tokenizer = tiny("chatml")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Describe the jeans."}]
    prompt, contiguous = spliced_prompt_token_ids(messages, tokenizer)
    assert contiguous
    assert prompt == render_chat_token_ids(messages, tokenizer)

    # The model sampled "Ski" and "nny" as separate tokens; the text re-tokenizes differently.
    generation = encode(tokenizer, "Ski") + encode(tokenizer, "nny jeans.") + [turn_end(tokenizer)]
    assert encode(tokenizer, "Skinny jeans.") != generation[:-1]
    messages += [assistant("Skinny jeans.", prompt, generation), {"role": "user", "content": "Why?"}]

    spliced, contiguous = spliced_prompt_token_ids(messages, tokenizer)
    assert contiguous
    assert spliced[: len(prompt) + len(generation) - 1] == prompt + generation[:-1]
    # With one turn-end ID the template's turn end is the sampled one: the whole call is a prefix.
    assert spliced[: len(prompt) + len(generation)] == prompt + generation
    assert decode(tokenizer, spliced[len(prompt) + len(generation) - 1 :]) == (
        "<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"
    )
    # Without the splice the prompt would not extend the previous call.
    plain = render_chat_token_ids(messages, tokenizer)
    assert plain[: len(prompt) + len(generation) - 1] != prompt + generation[:-1]
    assert decode(tokenizer, plain) == decode(tokenizer, spliced)


def test_qwen3_dropped_reasoning_keeps_the_new_user_turn() -> None:
    tokenizer = tiny("qwen3")
    eos = turn_end(tokenizer)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Add 2 and 3."}]
    prompt, _ = spliced_prompt_token_ids(messages, tokenizer)
    reasoning = " ".join(["Let me think about this problem step by step, and check the sum twice."] * 6)
    generation = encode(tokenizer, f"<think>\n{reasoning}\n</think>\n\nThe answer is 5.") + [eos]
    messages += [
        assistant("The answer is 5.", prompt, generation, reasoning_content=reasoning),
        {"role": "user", "content": "Sure?"},
    ]

    inputs = compute_splice_inputs(messages, tokenizer)
    assert inputs is not None
    # The template drops the earlier reasoning once a new user query follows, so the full
    # render is shorter than the prefix render plus the new turn.
    assert reasoning not in decode(tokenizer, inputs.template_full_token_ids)
    assert reasoning in decode(tokenizer, inputs.template_prefix_token_ids)

    spliced, contiguous = spliced_prompt_token_ids(messages, tokenizer)
    assert contiguous
    body = prompt + generation[:-1]
    assert spliced[: len(body)] == body
    assert decode(tokenizer, spliced[len(body) :]) == (
        "<|im_end|>\n<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n"
    )

    # A position-based cut lands past the seam and silently loses the new user turn.
    naive = position_based_splice(
        inputs.model_prefix_token_ids, inputs.template_prefix_token_ids, inputs.template_full_token_ids, eos
    )
    assert "Sure?" not in decode(tokenizer, naive)
    assert "Sure?" in decode(tokenizer, spliced)


def test_generation_cut_by_max_tokens_splices_without_a_turn_end() -> None:
    tokenizer = tiny("chatml")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me about the weather."},
    ]
    prompt, _ = spliced_prompt_token_ids(messages, tokenizer)
    generation = encode(tokenizer, "The weather in Paris is sunny and warm")[:5]
    assert turn_end(tokenizer) not in generation
    messages += [
        assistant(decode(tokenizer, generation), prompt, generation),
        {"role": "user", "content": "Go on."},
    ]

    spliced, contiguous = spliced_prompt_token_ids(messages, tokenizer)
    assert contiguous
    assert spliced[: len(prompt) + len(generation)] == prompt + generation
    # The turn is closed by the template's turn-end token, right after the sampled IDs.
    assert spliced[len(prompt) + len(generation)] == turn_end(tokenizer)
    assert decode(tokenizer, spliced).endswith("<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("template", ["chatml", "qwen3"])
def test_reformatted_tool_call_keeps_the_sampled_json(template: str) -> None:
    tokenizer = tiny(template)
    eos = turn_end(tokenizer)
    tools = [WEATHER_TOOL]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    prompt1, _ = spliced_prompt_token_ids(messages, tokenizer, tools=tools)
    # Compact JSON as sampled; the template re-renders it with ", " and ": " separators.
    sampled = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'
    generation1 = encode(tokenizer, sampled) + [eos]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    messages += [
        assistant(None, prompt1, generation1, tool_calls=[call]),
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 20}'},
    ]

    inputs = compute_splice_inputs(messages, tokenizer, tools=tools)
    assert inputs is not None
    assert '{"city": "Paris"}' in decode(tokenizer, inputs.template_prefix_token_ids)
    prompt2, contiguous = spliced_prompt_token_ids(messages, tokenizer, tools=tools)
    assert contiguous
    body1 = prompt1 + generation1[:-1]
    assert prompt2[: len(body1)] == body1
    assert '<tool_response>\n{"temperature": 20}\n</tool_response>' in decode(
        tokenizer, prompt2[len(body1) :]
    )

    # Next call: the answer, then a new user turn. The splice now starts from the second call.
    generation2 = encode(tokenizer, "It is 20") + encode(tokenizer, " degrees.") + [eos]
    messages += [assistant("It is 20 degrees.", prompt2, generation2), {"role": "user", "content": "Thanks!"}]
    prompt3, contiguous = spliced_prompt_token_ids(messages, tokenizer, tools=tools)
    assert contiguous
    body2 = prompt2 + generation2[:-1]
    assert prompt3[: len(body2)] == body2
    assert prompt3[: len(body1)] == body1


def test_llama3_splices_at_eot_without_doubling_bos() -> None:
    tokenizer = tiny("llama3")
    eot = token_id(tokenizer, "<|eot_id|>")
    bos = token_id(tokenizer, "<|begin_of_text|>")
    assert turn_end_token_ids(tokenizer) == [eot]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Describe the jeans."},
    ]
    prompt, _ = spliced_prompt_token_ids(messages, tokenizer)
    assert prompt.count(bos) == 1 and prompt[0] == bos
    generation = encode(tokenizer, "Ski") + encode(tokenizer, "nny jeans.") + [eot]
    messages += [assistant("Skinny jeans.", prompt, generation), {"role": "user", "content": "Why?"}]

    spliced, contiguous = spliced_prompt_token_ids(messages, tokenizer)
    assert contiguous
    body = prompt + generation[:-1]
    assert spliced[: len(body)] == body
    assert spliced.count(bos) == 1
    assert decode(tokenizer, spliced[len(body) :]) == (
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhy?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_special_token_string_in_tool_output_still_splices() -> None:
    # The engine and the template tokenize the tool output the same way (the string becomes the
    # special token in both), so the counts agree and the splice goes through on later calls.
    tokenizer = tiny("chatml")
    eos = turn_end(tokenizer)
    tools = [WEATHER_TOOL]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    prompt1, _ = spliced_prompt_token_ids(messages, tokenizer, tools=tools)
    generation1 = encode(
        tokenizer, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    generation1.append(eos)
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    messages += [
        assistant("", prompt1, generation1, tool_calls=[call]),
        {"role": "tool", "tool_call_id": "c", "content": "sunny <|im_end|> injected"},
    ]
    prompt2, contiguous = spliced_prompt_token_ids(messages, tokenizer, tools=tools)
    assert contiguous
    generation2 = encode(tokenizer, "Sunny.") + [eos]
    messages += [assistant("Sunny.", prompt2, generation2), {"role": "user", "content": "Thanks"}]
    prompt3, contiguous = spliced_prompt_token_ids(messages, tokenizer, tools=tools)
    assert contiguous
    assert prompt3[: len(prompt2) + len(generation2) - 1] == prompt2 + generation2[:-1]


def test_turn_end_written_as_plain_text_is_refused_and_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    # The model spelled "<|im_end|>" out of ordinary tokens; the template's re-render turns it into
    # the special token, so the prefix render closes one turn more than the sampled IDs do.
    tokenizer = tiny("chatml")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Print the marker."}]
    prompt, _ = spliced_prompt_token_ids(messages, tokenizer)
    generation = encode(tokenizer, "Here: <|im_") + encode(tokenizer, "end|>") + [turn_end(tokenizer)]
    assert generation.count(turn_end(tokenizer)) == 1
    messages += [assistant("Here: <|im_end|>", prompt, generation), {"role": "user", "content": "Again."}]

    with caplog.at_level(logging.WARNING, logger="nemo_gym.models.token_ids"):
        spliced, contiguous = spliced_prompt_token_ids(messages, tokenizer)
    assert not contiguous
    assert spliced == render_chat_token_ids(messages, tokenizer)
    assert "model_prefix_turn_end_count" in caplog.text


def test_edited_history_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = tiny("qwen3")
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi"},
        {"role": "user", "content": "Add 2 and 3."},
    ]
    prompt, _ = spliced_prompt_token_ids(messages, tokenizer)
    generation = encode(tokenizer, "The answer is 5.") + [turn_end(tokenizer)]
    # The agent dropped the first user turn before sending the history back.
    edited = [
        messages[1],
        assistant("The answer is 5.", prompt, generation),
        {"role": "user", "content": "Ok"},
    ]
    with caplog.at_level(logging.WARNING, logger="nemo_gym.models.token_ids"):
        spliced, contiguous = spliced_prompt_token_ids(edited, tokenizer)
    assert not contiguous
    assert spliced == render_chat_token_ids(edited, tokenizer)
    assert "model_prefix_turn_end_count" in caplog.text


def test_compute_splice_inputs_picks_the_last_assistant_with_ids() -> None:
    tokenizer = tiny("chatml")
    assert compute_splice_inputs([{"role": "user", "content": "Hi"}], tokenizer) is None
    plain_history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    ]
    assert compute_splice_inputs(plain_history, tokenizer) is None
    assert spliced_prompt_token_ids(plain_history, tokenizer) == (
        render_chat_token_ids(plain_history, tokenizer),
        True,
    )

    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi"},
        assistant("Hello", [1, 2], [3]),
        {"role": "user", "content": "Again"},
        assistant("Hello again", [4, 5], [6, 7]),
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Injected without IDs"},
        {"role": "user", "content": "Really bye"},
    ]
    inputs = compute_splice_inputs(messages, tokenizer, turn_end_token_ids=[turn_end(tokenizer)])
    assert isinstance(inputs, SpliceInputs)
    assert inputs.message_index == 3
    assert inputs.model_prefix_token_ids == [4, 5, 6, 7]
    assert inputs.turn_end_token_ids == frozenset(turn_end_token_ids(tokenizer))
    clean = [{k: v for k, v in m.items() if not k.endswith(("_token_ids", "_log_probs"))} for m in messages]
    assert inputs.template_prefix_token_ids == render_chat_token_ids(
        clean[:4], tokenizer, add_generation_prompt=False
    )
    assert inputs.template_full_token_ids == render_chat_token_ids(clean, tokenizer)


def test_incomplete_token_ids_fall_back_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = tiny("chatml")
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "prompt_token_ids": [1, 2]},
        {"role": "user", "content": "Bye"},
    ]
    with pytest.raises(TokenSpliceError) as caught:
        compute_splice_inputs(messages, tokenizer)
    assert caught.value.check == "token_ids_incomplete"
    with caplog.at_level(logging.WARNING, logger="nemo_gym.models.token_ids"):
        prompt, contiguous = spliced_prompt_token_ids(messages, tokenizer)
    assert not contiguous
    assert prompt == render_chat_token_ids(messages, tokenizer)
    assert "token_ids_incomplete" in caplog.text

    malformed = [messages[0], {**messages[1], "generation_token_ids": ["x"]}, messages[2]]
    with pytest.raises(TokenSpliceError) as caught:
        compute_splice_inputs(malformed, tokenizer)
    assert caught.value.check == "token_ids_malformed"


def test_chat_template_kwargs_reach_both_renders() -> None:
    tokenizer = tiny("qwen3")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Add 2 and 3."}]
    kwargs = {"enable_thinking": False}
    prompt, _ = spliced_prompt_token_ids(messages, tokenizer, chat_template_kwargs=kwargs)
    assert decode(tokenizer, prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    generation = encode(tokenizer, "5") + [turn_end(tokenizer)]
    messages += [assistant("5", prompt, generation), {"role": "user", "content": "Why?"}]
    spliced, contiguous = spliced_prompt_token_ids(messages, tokenizer, chat_template_kwargs=kwargs)
    assert contiguous
    assert spliced[: len(prompt) + 1] == prompt + generation[:-1]
    assert decode(tokenizer, spliced).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


# ------------------------------------------------------------------ the tiny tokenizer itself


@pytest.mark.parametrize("template", TEMPLATES)
def test_tiny_tokenizer_is_deterministic_and_detectable(template: str) -> None:
    first, second = build_tiny_tokenizer(template), build_tiny_tokenizer(template)
    assert first is not second
    assert first.get_vocab() == second.get_vocab()
    assert first.chat_template == second.chat_template == chat_template_source(template)
    assert encode(first, "Skinny jeans cost $42.") == encode(second, "Skinny jeans cost $42.")
    assert detect_turn_end_token_ids(first) == turn_end_token_ids(first)
    assert first.eos_token_id in turn_end_token_ids(first)


def test_tiny_tokenizer_builds_fast_and_rejects_bad_arguments() -> None:
    started = time.perf_counter()
    tokenizer = build_tiny_tokenizer("qwen3", vocab_size=448)  # a size no other test caches
    assert time.perf_counter() - started < 2.0
    assert len(tokenizer) > 448
    with pytest.raises(ValueError, match="unknown tiny tokenizer template"):
        build_tiny_tokenizer("mistral")
    with pytest.raises(ValueError, match="byte alphabet"):
        build_tiny_tokenizer("chatml", vocab_size=100)
    with pytest.raises(ValueError, match="more than the built-in corpus can fill"):
        build_tiny_tokenizer("chatml", vocab_size=100_000)


def test_saved_tiny_tokenizer_loads_with_auto_tokenizer(tmp_path: Any) -> None:
    path = save_tiny_tokenizer(tmp_path / "tok", "qwen3")
    loaded: Any = AutoTokenizer.from_pretrained(str(path))
    original = tiny("qwen3")
    text = "<|im_start|>user\nSkinny?<|im_end|>\n"
    assert encode(loaded, text) == encode(original, text)
    assert loaded.chat_template == original.chat_template
    assert turn_end_token_ids(loaded) == turn_end_token_ids(original)


# ------------------------------------------------------------------ property: every call extends the last

WORDS = (
    "Skinny jeans the weather in Paris is sunny answer 42 think tool user assistant step by check sum city "
    "Tokyo ok and then"
).split()
PUNCTUATION = ["", ".", ",", "!", "?", ":", " -", "\n"]


@st.composite
def sentences(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=7))
    return " ".join(word + draw(st.sampled_from(PUNCTUATION)) for word in words).strip() or "ok"


def sampled_ids(draw: Callable[..., Any], tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    """IDs for ``text`` as a sampler might produce them: pieces tokenized separately."""
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=4))))
    bounds = [0, *cuts, len(text)]
    return [
        i for start, end in zip(bounds, bounds[1:], strict=False) for i in encode(tokenizer, text[start:end])
    ]


def tool_call_text(template: str, arguments: Mapping[str, Any], separators: tuple[str, str]) -> str:
    key = "parameters" if template == "llama3" else "arguments"
    payload = json.dumps({"name": "get_weather", key: arguments}, separators=separators)
    return payload if template == "llama3" else f"<tool_call>\n{payload}\n</tool_call>"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), template=st.sampled_from(TEMPLATES))
def test_every_spliced_prompt_extends_the_previous_call(data: st.DataObject, template: str) -> None:
    draw = data.draw
    tokenizer = tiny(template)
    eos = turn_end(tokenizer)
    tools = [WEATHER_TOOL] if draw(st.booleans()) else None
    kwargs = {"enable_thinking": False} if template == "qwen3" and draw(st.booleans()) else None
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(sentences())})
    messages.append({"role": "user", "content": draw(sentences())})

    previous: list[int] = []
    for _ in range(draw(st.integers(1, 4))):
        prompt, contiguous = spliced_prompt_token_ids(
            messages, tokenizer, tools=tools, chat_template_kwargs=kwargs
        )
        assert contiguous
        body = without_trailing_turn_end(previous, tokenizer)
        assert prompt[: len(body)] == body

        content = draw(sentences())
        reasoning = draw(sentences()) if template == "qwen3" and draw(st.booleans()) else None
        arguments = {"city": draw(st.sampled_from(["Paris", "Tokyo", "Oslo"]))}
        calls_tool = tools is not None and draw(st.booleans())
        text = tool_call_text(
            template, arguments, draw(st.sampled_from([(",", ":"), (", ", ": "), (",", ": ")]))
        )
        if not calls_tool:
            text = content
        if reasoning is not None:
            text = f"<think>\n{reasoning}\n</think>\n\n{text}"
        generation = sampled_ids(draw, tokenizer, text)
        cut_by_max_tokens = draw(st.booleans())
        message: dict[str, Any]
        if cut_by_max_tokens:
            generation = generation[: draw(st.integers(1, len(generation)))]
            message = {"role": "assistant", "content": decode(tokenizer, generation)}
        else:
            generation.append(eos)
            message = {"role": "assistant", "content": None if calls_tool else content}
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            if calls_tool:
                message["tool_calls"] = [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": arguments},
                    }
                ]
        event(
            f"{template}: {'tool call' if calls_tool else 'text'}, {'cut' if cut_by_max_tokens else 'turn end'}"
        )
        message.update(prompt_token_ids=prompt, generation_token_ids=generation)
        messages.append(message)
        if calls_tool and not cut_by_max_tokens:
            messages.append(
                {"role": "tool", "tool_call_id": "c", "content": json.dumps({"sky": draw(sentences())})}
            )
        else:
            messages.append({"role": "user", "content": draw(sentences())})
        previous = prompt + generation

    prompt, contiguous = spliced_prompt_token_ids(
        messages, tokenizer, tools=tools, chat_template_kwargs=kwargs
    )
    assert contiguous
    body = without_trailing_turn_end(previous, tokenizer)
    assert prompt[: len(body)] == body
    assert prompt[len(body)] == eos
