"""The CPU engine on loopback: vLLM's chat dialect, token IDs, logprobs, the splice, /tokenize.

Logprobs are checked against an independent forward pass of the same tiny checkpoint loaded
with ``AutoModelForCausalLM`` in the test process.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_gym.engine.tiny_model import build_tiny_model
from nemo_gym.testing import SyncClient, running_server
from responses_api_models.local_hf_model.app import LocalHFModel, parse_tool_calls

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
FORCED = [
    '<think>Check the weather.</think><tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "It is cold in Oslo.",
]
USER = [{"role": "user", "content": "Should I bring a jacket in Oslo?"}]


@pytest.fixture(scope="module")
def reference_model() -> Any:
    """The tiny checkpoint, loaded independently of the engine."""
    return AutoModelForCausalLM.from_pretrained(build_tiny_model()).eval()


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[LocalHFModel, str]]:
    """A real-generation engine with a small context window."""
    server = LocalHFModel({"name": "engine", "tiny": True, "default_max_tokens": 16, "max_model_len": 512})
    with running_server(server) as url:
        yield server, url


@pytest.fixture(scope="module")
def forced_engine() -> Iterator[str]:
    """An engine whose completions are forced (the multi-turn tool-call test hook)."""
    server = LocalHFModel(
        {"name": "forced", "tiny": True, "default_max_tokens": 64, "forced_completions": FORCED}
    )
    with running_server(server) as url:
        yield url


def forward_logprobs(model: Any, prompt_ids: list[int], generated: list[int]) -> list[float]:
    """Log-probabilities of ``generated`` after ``prompt_ids`` from one full forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + generated])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[len(prompt_ids) - 1 + i, token]) for i, token in enumerate(generated)]


def token_request(**extra: Any) -> dict[str, Any]:
    body = {
        "messages": USER,
        "tools": TOOLS,
        "logprobs": True,
        "top_logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    return {**body, **extra}


def test_openai_client_gets_a_chat_completion_whose_logprobs_match_a_forward_pass(
    engine: tuple[LocalHFModel, str], reference_model: Any
) -> None:
    _, url = engine
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    completion = client.chat.completions.create(
        model="tiny-chatml",
        messages=USER,  # type: ignore[arg-type]
        max_tokens=12,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True, "seed": 7},
    )
    extra = completion.model_extra or {}
    choice = completion.choices[0]
    generated = (choice.model_extra or {})["token_ids"]
    assert 1 <= len(generated) <= 12
    assert completion.usage is not None and completion.usage.completion_tokens == len(generated)
    assert completion.usage.prompt_tokens == len(extra["prompt_token_ids"])
    assert choice.logprobs is not None and choice.logprobs.content is not None
    reported = [entry.logprob for entry in choice.logprobs.content]
    expected = forward_logprobs(reference_model, extra["prompt_token_ids"], generated)
    assert reported == pytest.approx(expected, abs=1e-4)
    for entry in choice.logprobs.content:
        tops = [top.logprob for top in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert tops[0] >= entry.logprob - 1e-6


def test_seed_reproduces_and_temperature_zero_is_greedy(
    engine: tuple[LocalHFModel, str], reference_model: Any
) -> None:
    _, url = engine
    with SyncClient() as client:
        runs = [
            client.post(url + "/v1/chat/completions", token_request(seed=11, max_tokens=10))[1]
            for _ in range(2)
        ]
        assert runs[0]["choices"][0]["token_ids"] == runs[1]["choices"][0]["token_ids"]
        status, greedy = client.post(url + "/v1/chat/completions", token_request(temperature=0, max_tokens=6))
    assert status == 200
    prompt, generated = greedy["prompt_token_ids"], greedy["choices"][0]["token_ids"]
    with torch.no_grad():
        logits = reference_model(torch.tensor([prompt + generated])).logits[0]
    argmax = [int(logits[len(prompt) - 1 + i].argmax()) for i in range(len(generated))]
    assert generated == argmax


def test_max_tokens_is_clamped_to_the_context_window(engine: tuple[LocalHFModel, str]) -> None:
    server, url = engine
    with SyncClient() as client:

        def prompt_tokens(repeats: int) -> dict[str, Any]:
            messages = [{"role": "user", "content": "the cat sat on the mat " * repeats}]
            return client.post(url + "/tokenize", {"messages": messages})[1]

        # Grow the prompt until it leaves less than 60 tokens of room (BPE merges make the
        # count per repeat uneven, so search instead of dividing).
        repeats, tokenized = 1, prompt_tokens(1)
        while server.lm.max_model_len - tokenized["count"] >= 60:
            repeats += 1
            tokenized = prompt_tokens(repeats)
        long_user = [{"role": "user", "content": "the cat sat on the mat " * repeats}]
        room = server.lm.max_model_len - tokenized["count"]
        assert 0 < room < 60, "the prompt should leave a little room"
        status, body = client.post(
            url + "/v1/chat/completions",
            {"messages": long_user, "max_tokens": 5000, "ignore_eos": True, "return_token_ids": True},
        )
    assert status == 200
    assert body["prompt_token_ids"] == tokenized["tokens"]
    assert len(body["choices"][0]["token_ids"]) == room
    assert body["choices"][0]["finish_reason"] == "length"


def test_prompt_over_the_context_window_is_a_400_in_vllm_wording(engine: tuple[LocalHFModel, str]) -> None:
    _, url = engine
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model="tiny-chatml",
            messages=[{"role": "user", "content": "word " * 2000}],
        )
    assert "maximum context length is 512 tokens" in str(raised.value)


def test_unsupported_settings_are_refused_by_name(engine: tuple[LocalHFModel, str]) -> None:
    _, url = engine
    with SyncClient() as client:
        for extra, word, expected_status in (
            ({"n": 2}, "n=2", 400),
            ({"presence_penalty": 0.5}, "presence_penalty", 400),
            ({"model": "gpt-4o"}, "gpt-4o", 404),
            ({"top_logprobs": 99, "logprobs": True}, "top_logprobs", 400),
        ):
            status, body = client.post(url + "/v1/chat/completions", {"messages": USER, **extra})
            assert status == expected_status, extra
            assert word in body["error"]["message"]


def test_tool_calls_and_reasoning_are_parsed_with_real_logprobs(
    forced_engine: str, reference_model: Any
) -> None:
    client = openai.OpenAI(base_url=forced_engine + "/v1", api_key="x")
    completion = client.chat.completions.create(
        model="tiny-chatml",
        messages=USER,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert (choice.message.model_extra or {})["reasoning_content"] == "Check the weather."
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Oslo"}  # type: ignore[union-attr]
    generated = (choice.model_extra or {})["token_ids"]
    assert generated[-1] == 514  # <|im_end|>: the forced text ends its turn like a sampled one
    assert choice.logprobs is not None and choice.logprobs.content is not None
    expected = forward_logprobs(
        reference_model, (completion.model_extra or {})["prompt_token_ids"], generated
    )
    assert [e.logprob for e in choice.logprobs.content] == pytest.approx(expected, abs=1e-4)


def test_token_ids_from_the_previous_call_are_spliced_into_the_prompt(forced_engine: str) -> None:
    with SyncClient() as client:
        status, first = client.post(forced_engine + "/v1/chat/completions", token_request())
        assert status == 200
        choice = first["choices"][0]
        assistant = {
            **choice["message"],
            "prompt_token_ids": first["prompt_token_ids"],
            "generation_token_ids": choice["token_ids"],
            "generation_log_probs": [e["logprob"] for e in choice["logprobs"]["content"]],
        }
        tool_result = {
            "role": "tool",
            "tool_call_id": choice["message"]["tool_calls"][0]["id"],
            "content": "cold",
        }
        status, second = client.post(
            forced_engine + "/v1/chat/completions", token_request(messages=USER + [assistant, tool_result])
        )
        assert status == 200
        prefix = first["prompt_token_ids"] + choice["token_ids"]
        assert second["prompt_token_ids"][: len(prefix)] == prefix
        assert "token_ids_contiguous" not in second
        assert second["choices"][0]["message"]["content"] == "It is cold in Oslo."

        # IDs that cannot belong to this history (an extra turn end) are flagged, not spliced.
        broken = {**assistant, "generation_token_ids": [514, *choice["token_ids"]]}
        status, flagged = client.post(
            forced_engine + "/v1/chat/completions", token_request(messages=USER + [broken, tool_result])
        )
    assert status == 200
    assert flagged["token_ids_contiguous"] is False
    assert flagged["prompt_token_ids"][: len(prefix) + 1] != [
        *first["prompt_token_ids"],
        514,
        *choice["token_ids"],
    ]


def test_engine_serves_responses_with_a_tool_call(forced_engine: str) -> None:
    client = openai.OpenAI(base_url=forced_engine + "/v1", api_key="x")
    response = client.responses.create(
        model="tiny-chatml",
        input="Should I bring a jacket in Oslo?",
        tools=[
            {
                "type": "function",
                "name": "get_weather",
                "parameters": TOOLS[0]["function"]["parameters"],
                "strict": True,
            }
        ],  # type: ignore[list-item,index]
    )
    assert response.status == "completed"
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "function_call"]
    assert response.output[1].name == "get_weather"  # type: ignore[union-attr]


def test_tokenize_models_and_health(engine: tuple[LocalHFModel, str]) -> None:
    server, url = engine
    with SyncClient() as client:
        status, tokens = client.post(url + "/tokenize", {"prompt": "Hello there"})
        assert status == 200
        assert tokens["tokens"] == server.lm.tokenizer.encode("Hello there")
        assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 512
        status, chat = client.post(url + "/tokenize", {"messages": USER, "tools": TOOLS})
        assert status == 200 and chat["count"] > tokens["count"]
        status, bad = client.post(url + "/tokenize", {"nothing": 1})
        assert status == 400 and "prompt" in bad["error"]["message"]
        assert client.get(url + "/v1/models")[1]["data"][0]["id"] == "tiny-chatml"
        assert client.get(url + "/health") == (200, {"status": "ok"})


def test_generation_runs_off_the_event_loop(engine: tuple[LocalHFModel, str]) -> None:
    _, url = engine
    done: dict[str, Any] = {}

    def generate() -> None:
        with SyncClient() as client:
            done["result"] = client.post(
                url + "/v1/chat/completions", {"messages": USER, "max_tokens": 150, "ignore_eos": True}
            )

    worker = threading.Thread(target=generate)
    worker.start()
    time.sleep(0.05)
    with SyncClient() as client:
        started = time.monotonic()
        assert client.get(url + "/")[0] == 200
        liveness_s = time.monotonic() - started
    worker.join(60)
    assert done["result"][0] == 200
    assert liveness_s < 0.5, "liveness must not wait for a generation"


def test_parse_tool_calls_formats() -> None:
    content, calls = parse_tool_calls(
        'Sure.<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', "hermes"
    )
    assert content == "Sure." and calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert parse_tool_calls("<tool_call>{not json}</tool_call>", "hermes") == (
        "<tool_call>{not json}</tool_call>",
        [],
    )
    content, calls = parse_tool_calls('{"name": "f", "parameters": {"a": 1}}', "llama3_json")
    assert content is None and calls[0]["function"]["arguments"] == '{"a": 1}'
    assert parse_tool_calls("plain text", "llama3_json") == ("plain text", [])


def test_config_needs_exactly_one_model_source() -> None:
    with pytest.raises(ValueError, match="exactly one of model"):
        LocalHFModel({"name": "bad"})
    with pytest.raises(ValueError, match="exactly one of model"):
        LocalHFModel({"name": "bad", "tiny": True, "model": "Qwen/Qwen3-0.6B"})


def test_tiny_model_builds_are_cached_and_never_clobber_foreign_folders(tmp_path: Path) -> None:
    target = tmp_path / "tiny"
    build_tiny_model(target)
    weights = target / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    started = time.monotonic()
    assert build_tiny_model(target) == target
    assert time.monotonic() - started < 0.5 and weights.stat().st_mtime_ns == mtime
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="did not write"):
        build_tiny_model(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_tiny_llama3_model_loads_offline(tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path / "llama", template="llama3", seed=1)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == model.get_input_embeddings().num_embeddings


def test_stop_strings_end_the_generation_and_cut_the_text(forced_engine: str) -> None:
    with SyncClient() as client:
        _, full = client.post(
            forced_engine + "/v1/chat/completions", {"messages": USER, "return_token_ids": True}
        )
        status, stopped = client.post(
            forced_engine + "/v1/chat/completions",
            {"messages": USER, "stop": ["Oslo"], "return_token_ids": True},
        )
        assert status == 200
        message = stopped["choices"][0]["message"]
        assert message["reasoning_content"] == "Check the weather."
        assert message["content"].endswith('"city": "') and "Oslo" not in message["content"]
        assert stopped["choices"][0]["finish_reason"] == "stop"
        assert len(stopped["choices"][0]["token_ids"]) < len(full["choices"][0]["token_ids"])
        status, bad = client.post(forced_engine + "/v1/chat/completions", {"messages": USER, "max_tokens": 0})
    assert status == 400 and "max_tokens" in bad["error"]["message"]


def test_scoring_reproduces_the_logprobs_of_forced_tokens_and_detokenize_inverts_tokenize():
    """``/v1/completions`` with ``prompt_logprobs`` (vLLM's scoring form) gives the log-probs the
    engine reported when it emitted the same tokens; ``/detokenize`` gives their text back."""
    server = LocalHFModel(
        {"name": "engine", "tiny": True, "forced_completions": ["forty two"], "max_model_len": 512}
    )
    with running_server(server) as url, SyncClient(timeout_s=120) as client:
        status, answer = client.post(
            url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "return_token_ids": True},
        )
        assert status == 200, answer
        prompt, generated = answer["prompt_token_ids"], answer["choices"][0]["token_ids"]
        sampled = [entry["logprob"] for entry in answer["choices"][0]["logprobs"]["content"]]
        status, scored = client.post(
            url + "/v1/completions", {"prompt": prompt + generated, "max_tokens": 1, "prompt_logprobs": 0}
        )
        assert status == 200, scored
        entries = scored["choices"][0]["prompt_logprobs"]
        assert entries[0] is None and len(entries) == len(prompt) + len(generated)
        rescored = [entries[len(prompt) + i][str(t)]["logprob"] for i, t in enumerate(generated)]
        assert max(abs(a - b) for a, b in zip(rescored, sampled, strict=True)) < 1e-4
        status, text = client.post(url + "/detokenize", {"tokens": generated})
        assert status == 200 and "forty two" in text["prompt"]
        status, refused = client.post(url + "/v1/completions", {"prompt": "text", "prompt_logprobs": 0})
        assert status == 400 and "prompt" in str(refused)
        status, refused = client.post(url + "/v1/completions", {"prompt": [1, 2]})
        assert status == 400 and "prompt_logprobs" in str(refused)


def test_generation_passes_the_cache_without_a_deprecation_warning(tmp_path: Path) -> None:
    import warnings

    from responses_api_models.local_hf_model.engine import HFCausalLM, SamplingSettings

    engine = HFCausalLM.load(str(build_tiny_model(tmp_path / "tiny", seed=2)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers' past_key_values FutureWarning would fail here
        result = engine.generate(
            [1, 2, 3], max_tokens=4, sampling=SamplingSettings(temperature=0.0, seed=1), stop_token_ids=set()
        )
    assert len(result.token_ids) >= 1 and len(result.logprobs) == len(result.token_ids)
