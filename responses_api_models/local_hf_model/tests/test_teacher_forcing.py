"""The CPU engine's teacher-forced scripts: given text, the template's real token IDs, the model's real logprobs.

A server with a tiny locally built model on loopback answers scripted turns; the IDs are checked
against the chat template's own render of the conversation with the turn, and the logprobs
against a separate forward pass of the model over the same tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_gym.models.token_ids import render_chat_token_ids
from nemo_gym.testing import SyncClient, running_server
from responses_api_models.local_hf_model.app import LocalHFModel, LocalHFModelConfig
from responses_api_models.local_hf_model.teacher_forcing import load_scripts

TOOLS = [{"type": "function", "function": {"name": "Bash", "description": "Run a command.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]  # fmt: skip
SCRIPTS = [
    {"match": "list the files", "turns": [{"tool_call": {"name": "Bash", "arguments": {"command": "ls"}}},
                                          {"text": "There are two files."}]},
    {"match": "count the lines", "turns": [{"tool_call": {"name": "Bash", "arguments": {"command": "wc -l a.txt"}}},
                                           {"text": "a.txt has 3 lines."}]},
]  # fmt: skip


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[LocalHFModel, str]]:
    server = LocalHFModel(
        {"name": "engine", "tiny": True, "teacher_forced_scripts": SCRIPTS, "default_max_tokens": 64}
    )
    with running_server(server) as url:
        yield server, url


def chat(url: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"messages": messages, "tools": TOOLS, "logprobs": True, "return_token_ids": True, **extra}
    with SyncClient() as client:
        status, answer = client.post(url + "/v1/chat/completions", body)
    assert status == 200, answer
    return dict(answer)


def forward_logprobs(server: LocalHFModel, prompt: list[int], generated: list[int]) -> list[float]:
    """The model's logprobs of ``generated`` after ``prompt``, from a forward pass of our own."""
    with torch.inference_mode():
        logits = server.lm.model(input_ids=torch.tensor([prompt + generated])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, token]) for i, token in enumerate(generated)]


def test_scripted_tool_call_has_the_templates_ids_and_the_models_logprobs(
    engine: tuple[LocalHFModel, str],
) -> None:
    server, url = engine
    messages = [
        {"role": "system", "content": "You run commands."},
        {"role": "user", "content": "Please list the files."},
    ]
    answer = chat(url, messages)
    choice = answer["choices"][0]
    call = choice["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("Bash", {"command": "ls"})
    assert choice["finish_reason"] == "tool_calls"

    prompt, generated = answer["prompt_token_ids"], choice["token_ids"]
    turn = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}]}  # fmt: skip
    whole = render_chat_token_ids([*messages, turn], server.lm.tokenizer, TOOLS, add_generation_prompt=False)
    # Round trip: prompt + generation is the template's render of the conversation with the turn.
    assert prompt + generated == whole[: len(prompt) + len(generated)]
    assert generated[-1] == server.lm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    # max_tokens binds a scripted turn as it binds sampling.
    cut = chat(url, messages, max_tokens=4)["choices"][0]
    assert (cut["token_ids"], cut["finish_reason"]) == (generated[:4], "length")

    reported = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert reported == pytest.approx(forward_logprobs(server, prompt, generated), abs=1e-5)


def test_each_conversation_follows_its_own_script_concurrently(engine: tuple[LocalHFModel, str]) -> None:
    _, url = engine

    async def both() -> list[dict[str, Any]]:
        tasks = [
            asyncio.to_thread(chat, url, [{"role": "user", "content": "count the lines of a.txt"}]),
            asyncio.to_thread(chat, url, [{"role": "user", "content": "list the files here"}]),
        ]
        return list(await asyncio.gather(*tasks))

    counted, listed = asyncio.run(both())
    arguments = [json.loads(a["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) for a in (counted, listed)]  # fmt: skip
    assert arguments == [{"command": "wc -l a.txt"}, {"command": "ls"}]


def test_turns_advance_with_the_conversation_and_the_last_repeats(engine: tuple[LocalHFModel, str]) -> None:
    server, url = engine
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    first = chat(url, messages)
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "a.txt b.txt"},
    ]
    second = chat(url, messages)
    assert second["choices"][0]["message"]["content"] == "There are two files."
    assert second["choices"][0]["finish_reason"] == "stop"
    reported = [entry["logprob"] for entry in second["choices"][0]["logprobs"]["content"]]
    expected = forward_logprobs(server, second["prompt_token_ids"], second["choices"][0]["token_ids"])
    assert reported == pytest.approx(expected, abs=1e-5)
    messages += [second["choices"][0]["message"], {"role": "user", "content": "And now?"}]
    assert chat(url, messages)["choices"][0]["message"]["content"] == "There are two files."


def test_an_unmatched_conversation_is_sampled(engine: tuple[LocalHFModel, str]) -> None:
    _, url = engine
    answer = chat(url, [{"role": "user", "content": "Write a title for this chat."}], max_tokens=5, seed=3)
    choice = answer["choices"][0]
    assert choice["message"]["tool_calls"] == [] and len(choice["token_ids"]) == 5
    assert choice["finish_reason"] == "length"


def test_scripts_load_from_yaml_and_jsonl_and_bad_ones_name_the_line(tmp_path: Path) -> None:
    jsonl = tmp_path / "scripts.jsonl"
    jsonl.write_text("\n".join(json.dumps(s) for s in SCRIPTS) + "\n")
    yaml_file = tmp_path / "scripts.yaml"
    yaml_file.write_text("- match: files\n  turns:\n    - text: done\n")
    assert [s.match for s in load_scripts(jsonl)] == ["list the files", "count the lines"]
    assert load_scripts(yaml_file)[0].turns[0].text == "done"
    jsonl.write_text(
        json.dumps(SCRIPTS[0]) + "\n" + json.dumps({"match": "(", "turns": [{"text": "x"}]}) + "\n"
    )
    with pytest.raises(ValueError, match=r"(?s)line 2.*not a valid regex"):
        load_scripts(jsonl)
    with pytest.raises(ValueError, match="needs text, tool_call or reasoning"):
        LocalHFModelConfig.model_validate({"tiny": True, "teacher_forced_scripts": [{"turns": [{}]}]})
    with contextlib.suppress(ValueError):
        LocalHFModelConfig.model_validate(
            {"tiny": True, "teacher_forced_script_file": str(jsonl)}
        ).script_book()
    with pytest.raises(ValueError, match=r"scripts.jsonl: line 2"):
        LocalHFModelConfig.model_validate(
            {"tiny": True, "teacher_forced_script_file": str(jsonl)}
        ).script_book()


def test_reasoning_turn_under_the_qwen3_template() -> None:
    scripts = [{"turns": [{"reasoning": "The user wants a greeting.", "text": "Hello!"}]}]
    server = LocalHFModel(
        {"name": "qwen3", "tiny": True, "tiny_template": "qwen3", "teacher_forced_scripts": scripts}
    )
    with running_server(server) as url:
        answer = chat(url, [{"role": "user", "content": "Greet me."}])
    message = answer["choices"][0]["message"]
    assert (message["content"].strip(), message["reasoning_content"].strip()) == (
        "Hello!",
        "The user wants a greeting.",
    )
    text = server.lm.tokenizer.decode(answer["choices"][0]["token_ids"])
    assert "<think>" in text and "The user wants a greeting." in text
