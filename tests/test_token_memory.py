"""TokenIdMemory: the token IDs a client dropped come back on the call the splice reads, within bounds."""

from __future__ import annotations

from typing import Any

from nemo_gym.models.token_memory import TokenIdMemory


def answer(call_id: str, prompt: list[int], generated: list[int]) -> dict[str, Any]:
    return {"output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": call_id, "name": "run", "arguments": "{}", "prompt_token_ids": prompt,
         "generation_token_ids": generated, "generation_log_probs": [-0.5] * len(generated)},
    ]}  # fmt: skip


def echoed(call_id: str) -> list[dict[str, Any]]:
    return [
        {"type": "message", "role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": call_id, "name": "run", "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": "ok"},
    ]


def test_only_the_latest_call_is_restored_and_scopes_do_not_mix() -> None:
    memory = TokenIdMemory()
    memory.remember("rollout:a", answer("c1", [1, 2], [3]))
    memory.remember("rollout:a", answer("c2", [1, 2, 3, 4], [5, 6]))
    history = [{"role": "user", "content": "hi"}, *echoed("c1"), *echoed("c2")]

    restored = memory.restore("rollout:a", history)

    assert [index for index, item in enumerate(restored) if "prompt_token_ids" in item] == [5]
    assert (restored[5]["prompt_token_ids"], restored[5]["generation_token_ids"]) == ([1, 2, 3, 4], [5, 6])
    assert restored[5]["generation_log_probs"] == [-0.5, -0.5]
    assert history[5].get("prompt_token_ids") is None  # the caller's list is not changed
    assert memory.restore("rollout:b", history) is history
    # An item that kept its fields wins: nothing is restored.
    kept = [*history[:5], {**history[5], "prompt_token_ids": [9], "generation_token_ids": [9]}, history[6]]
    assert memory.restore("rollout:a", kept) is kept


def test_chat_completions_are_remembered_by_their_tool_call_and_text() -> None:
    memory = TokenIdMemory()
    completion = {"prompt_token_ids": [1, 2], "choices": [{
        "message": {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function",
                                                                          "function": {"name": "f", "arguments": "{}"}}]},
        "token_ids": [7, 8], "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]}}]}  # fmt: skip
    memory.remember_chat("s", completion)
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function",
                                                                       "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "ok"}]  # fmt: skip
    restored = memory.restore_chat("s", messages)
    assert restored[1]["generation_token_ids"] == [7, 8] and restored[1]["generation_log_probs"] == [
        -1.0,
        -2.0,
    ]
    memory.remember_chat("s", {"prompt_token_ids": [1], "choices": [{"message": {"role": "assistant", "content": "Hi there "},
                                                                     "token_ids": [4], "logprobs": {"content": [{"logprob": -3.0}]}}]})  # fmt: skip
    again = memory.restore_chat(
        "s", [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Hi there"}]
    )
    assert again[1]["prompt_token_ids"] == [1]


def test_bounds_drop_the_least_recently_used() -> None:
    memory = TokenIdMemory(max_scopes=2, max_items=1, max_tokens=100)
    memory.remember("a", answer("c1", [1] * 10, [2]))
    memory.remember("a", answer("c2", [1] * 10, [2]))
    assert memory.restore("a", echoed("c1")) == echoed("c1")  # only one answer per scope kept
    assert "prompt_token_ids" in memory.restore("a", echoed("c2"))[1]
    memory.remember("b", answer("c3", [1] * 10, [2]))
    memory.remember("c", answer("c4", [1] * 10, [2]))
    assert len(memory) == 2 and memory.restore("a", echoed("c2")) == echoed("c2")
    memory.remember("d", answer("c5", [1] * 95, [2]))  # over the token budget: older scopes go
    assert len(memory) == 1 and "prompt_token_ids" in memory.restore("d", echoed("c5"))[1]
