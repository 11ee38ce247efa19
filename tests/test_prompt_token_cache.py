"""A rollout's prompt tokenization reused from call to call gives exactly the IDs of tokenizing the
whole prompt, tokenizes only what is new, and keeps nothing past the rollout."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nemo_gym.engine.tiny_tokenizer import build_tiny_tokenizer, turn_end_token_ids
from nemo_gym.models.prompt_token_cache import PromptTokenCache
from nemo_gym.models.token_ids import render_chat_token_ids, spliced_prompt_token_ids
from nemo_gym.testing import SyncClient, running_server
from responses_api_models.local_hf_model.app import LocalHFModel

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def _assistant(turn: int, template: str) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": f"Turn {turn}:  checking\n the weather ünïcödé {'x' * (turn % 7)} once more.",
        "tool_calls": [
            {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": f"City {turn}"})},
            }
        ],
    }
    if template == "qwen3":
        message["reasoning_content"] = f"I should look again ({turn})."
    return message


@pytest.mark.parametrize("template", ["chatml", "qwen3", "llama3"])
def test_cached_ids_equal_the_whole_prompt_tokenized_over_a_long_rollout(template: str) -> None:
    tokenizer = build_tiny_tokenizer(template)
    cache = PromptTokenCache(tokenizer, turn_end_token_ids(tokenizer))
    assert cache.enabled
    encode = cache.encoder("rollout-1")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You answer about the weather."},
        {"role": "user", "content": "  Should I bring a jacket?  "},
    ]
    plain_chars = 0

    def plain(text: str) -> list[int]:
        nonlocal plain_chars
        plain_chars += len(text)
        return list(tokenizer.encode(text, add_special_tokens=False))

    for turn in range(60):
        full = render_chat_token_ids(messages, tokenizer, TOOLS, encode=plain)
        assert render_chat_token_ids(messages, tokenizer, TOOLS, encode=encode) == full, turn
        messages.append(_assistant(turn, template))
        prefix = render_chat_token_ids(messages, tokenizer, TOOLS, add_generation_prompt=False, encode=plain)
        assert (
            render_chat_token_ids(messages, tokenizer, TOOLS, add_generation_prompt=False, encode=encode)
            == prefix
        ), turn
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": f"{turn} degrees\n"})
    # What the cache tokenized: the new part of each render, not 120 growing prompts.
    assert cache.encoded_chars * 10 < plain_chars, (cache.encoded_chars, plain_chars)
    assert cache.reused_tokens > 0
    assert len(cache) == 1 and cache.kept_tokens > 0
    cache.free("rollout-1")
    assert len(cache) == 0 and cache.kept_tokens == 0


def test_the_splice_with_the_cache_is_the_splice_without_it() -> None:
    tokenizer = build_tiny_tokenizer("qwen3")
    turn_end = turn_end_token_ids(tokenizer)
    cache = PromptTokenCache(tokenizer, turn_end)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Jacket?"}]
    previous: list[int] = []
    for turn in range(30):
        expected = spliced_prompt_token_ids(messages, tokenizer, TOOLS, None, turn_end)
        assert spliced_prompt_token_ids(
            messages, tokenizer, TOOLS, None, turn_end, encode=cache.encoder("r")
        ) == (expected)
        prompt, contiguous = expected
        assert contiguous and prompt[: len(previous)] == previous
        generation = (
            tokenizer.encode(f"<think>look {turn}</think>calling", add_special_tokens=False) + turn_end[:1]
        )
        messages.append(
            {**_assistant(turn, "chatml"), "prompt_token_ids": prompt, "generation_token_ids": generation}
        )
        previous = prompt + generation[:-1]
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": "cold"})


def test_bounds_drop_the_least_recent_rollouts() -> None:
    tokenizer = build_tiny_tokenizer("chatml")
    cache = PromptTokenCache(tokenizer, turn_end_token_ids(tokenizer), max_scopes=3)
    for i in range(5):
        cache.encode(f"r{i}", f"<|im_start|>user\nhello {i}<|im_end|>\n")
    assert len(cache) == 3
    small = PromptTokenCache(tokenizer, turn_end_token_ids(tokenizer), max_tokens=50)
    for i in range(20):
        small.encode(f"r{i}", f"<|im_start|>user\nhello there {i}<|im_end|>\n")
        assert small.kept_tokens <= 50


def test_a_tokenizer_whose_turn_end_is_not_special_is_not_cached() -> None:
    tokenizer = build_tiny_tokenizer("chatml")
    ordinary = tokenizer.encode("hello", add_special_tokens=False)[:1]
    assert not PromptTokenCache(tokenizer, ordinary).enabled


FORCED = [
    f'<think>Look again {i}.</think><tool_call>\n{{"name": "get_weather", "arguments": {{"city": "Oslo {i}"}}}}\n</tool_call>'
    for i in range(16)
] + ["It is cold in Oslo."]


@pytest.mark.slow
def test_the_cpu_engine_gives_the_same_prompt_ids_with_and_without_the_cache() -> None:
    """A 16-call rollout with token IDs through two CPU engines, one keeping its prompts per
    rollout and one not: every call's prompt IDs are the same, and contiguous."""
    config = {"tiny": True, "tiny_template": "qwen3", "default_max_tokens": 64, "forced_completions": FORCED}
    cached = LocalHFModel({**config, "name": "cached"})
    uncached = LocalHFModel({**config, "name": "uncached", "prompt_token_cache": False})
    assert cached.prompt_tokens is not None and uncached.prompt_tokens is None
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Should I bring a jacket in Oslo?"}]
    with running_server(cached) as a, running_server(uncached) as b, SyncClient(timeout_s=120) as client:
        for call in range(len(FORCED)):
            body = {"messages": messages, "tools": TOOLS, "return_token_ids": True, "logprobs": True}
            answers = []
            for url in (a, b):
                status, answer = client.post(url + "/ng-rollout/r-7/v1/chat/completions", body)
                assert status == 200, answer
                answers.append(answer)
            assert answers[0]["prompt_token_ids"] == answers[1]["prompt_token_ids"], call
            assert "token_ids_contiguous" not in answers[0]
            choice = answers[0]["choices"][0]
            assert choice["token_ids"] == answers[1]["choices"][0]["token_ids"]
            messages.append(
                {
                    **choice["message"],
                    "prompt_token_ids": answers[0]["prompt_token_ids"],
                    "generation_token_ids": choice["token_ids"],
                }
            )
            for tool_call in choice["message"].get("tool_calls") or []:
                messages.append(
                    {"role": "tool", "tool_call_id": tool_call["id"], "content": "cold, 2 degrees"}
                )
        assert cached.prompt_tokens.reused_tokens > 0
        assert len(cached.prompt_tokens) == 1
