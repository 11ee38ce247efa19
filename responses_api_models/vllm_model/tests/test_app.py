"""vllm_model on loopback, in front of the real CPU engine (and one fake old-vLLM server).

The fake stands in for a GPU engine we cannot run here: a vLLM before 0.10.2, which reports
generated IDs only as ``token_id:<id>`` logprob tokens and prompt IDs only through ``/tokenize``.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from aiohttp import web

from nemo_gym.launch.launcher import free_port
from nemo_gym.testing import SyncClient, running_aiohttp_app, running_server
from responses_api_models.local_hf_model.app import LocalHFModel
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

FORCED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "It is cold in Oslo, bring a jacket.",
]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    }
]
INPUT = [
    {"role": "developer", "content": "You are concise."},
    {"role": "user", "content": "Should I bring a jacket in Oslo?"},
]
FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[list[LocalHFModel], list[str]]]:
    """Two CPU-engine replicas with forced tool-call completions."""
    servers = [
        LocalHFModel(
            {"name": f"engine{i}", "tiny": True, "forced_completions": FORCED, "max_model_len": 1024}
        )
        for i in range(2)
    ]
    with running_server(servers[0]) as first, running_server(servers[1]) as second:
        yield servers, [first + "/v1", second + "/v1"]


@pytest.fixture(scope="module")
def policy(engines: tuple[list[LocalHFModel], list[str]]) -> Iterator[str]:
    """vllm_model with token IDs on, in front of the first engine."""
    server = VLLMModel(
        {
            "name": "policy_model",
            "base_url": engines[1][0],
            "model": "tiny-chatml",
            "return_token_id_information": True,
        }
    )
    with running_server(server) as url:
        yield url


def item_dicts(response: Any) -> list[dict[str, Any]]:
    """Output items as input items (None-valued keys dropped, as agents send them)."""
    return [{k: v for k, v in item.items() if v is not None} for item in response.model_dump()["output"]]


def test_openai_client_gets_responses_with_tool_calls_and_spliced_token_ids(policy: str) -> None:
    client = openai.OpenAI(base_url=policy + "/v1", api_key="x")
    first = client.responses.create(model="tiny-chatml", input=INPUT, tools=TOOLS)  # type: ignore[arg-type]
    assert first.status == "completed"
    assert [item.type for item in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "get_weather" and call.arguments == '{"city": "Oslo"}'  # type: ignore[union-attr]
    produced = item_dicts(first)
    last = produced[-1]
    assert all(isinstance(last[key], list) for key in FIELDS)
    assert len(last["generation_token_ids"]) == len(last["generation_log_probs"]) > 0

    tool_output = {"type": "function_call_output", "call_id": produced[0]["call_id"], "output": "cold"}
    follow_up = [*INPUT, *produced, tool_output]
    second = client.responses.create(model="tiny-chatml", input=follow_up, tools=TOOLS)  # type: ignore[arg-type]
    assert second.output_text == FORCED[1]
    second_last = item_dicts(second)[-1]
    prefix = last["prompt_token_ids"] + last["generation_token_ids"]
    assert second_last["prompt_token_ids"][: len(prefix)] == prefix
    assert "token_ids_contiguous" not in second_last


def test_token_ids_are_left_out_when_not_requested(engines: tuple[list[LocalHFModel], list[str]]) -> None:
    server = VLLMModel({"name": "plain", "base_url": engines[1][0], "model": "tiny-chatml"})
    with running_server(server) as url, SyncClient() as client:
        status, body = client.post(url + "/v1/responses", {"input": INPUT, "tools": TOOLS})
    assert status == 200
    assert body["output"] and not any(key in item for item in body["output"] for key in FIELDS)


def test_prompt_over_the_context_window_gives_an_incomplete_response(policy: str) -> None:
    client = openai.OpenAI(base_url=policy + "/v1", api_key="x")
    response = client.responses.create(model="tiny-chatml", input="weather " * 3000)
    assert response.status == "incomplete"
    assert (
        response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    )
    assert response.output == []


def test_chat_completions_pass_through_with_the_backend_status(policy: str) -> None:
    client = openai.OpenAI(base_url=policy + "/v1", api_key="x")
    completion = client.chat.completions.create(
        model="tiny-chatml",
        messages=[{"role": "user", "content": "hi"}],
        tools=[
            {"type": "function", "function": {"name": "get_weather", "parameters": TOOLS[0]["parameters"]}}
        ],  # type: ignore[list-item]
    )
    assert completion.choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(
            model="tiny-chatml", messages=[{"role": "user", "content": "hi " * 3000}]
        )


def test_every_call_of_a_rollout_goes_to_the_same_replica(
    engines: tuple[list[LocalHFModel], list[str]],
) -> None:
    servers, urls = engines
    policy = VLLMModel({"name": "replicated", "base_url": urls, "model": "tiny-chatml"})
    used: set[int] = set()
    with running_server(policy) as url, SyncClient() as client:
        for rollout in range(6):
            before = [server.requests_served for server in servers]
            for _ in range(3):
                status, _ = client.post(f"{url}/ng-rollout/rollout-{rollout}/v1/responses", {"input": INPUT})
                assert status == 200
            grew = [server.requests_served - count for server, count in zip(servers, before, strict=True)]
            assert sorted(grew) == [0, 3], f"rollout-{rollout} was split across replicas: {grew}"
            used.add(grew.index(3))
    assert used == {0, 1}, "six rollouts should spread over both replicas"


def test_an_unreachable_replica_is_skipped(engines: tuple[list[LocalHFModel], list[str]]) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    urls = [dead, engines[1][0]]
    rollout = next(f"r{i}" for i in range(100) if zlib.crc32(f"r{i}".encode()) % 2 == 0)
    policy = VLLMModel({"name": "failover", "base_url": urls, "model": "tiny-chatml", "connect_retries": 1})
    with running_server(policy) as url, SyncClient() as client:
        status, body = client.post(f"{url}/ng-rollout/{rollout}/v1/responses", {"input": INPUT})
    assert status == 200 and body["output"]
    only_dead = VLLMModel({"name": "dead", "base_url": dead, "connect_retries": 0})
    with running_server(only_dead) as url, SyncClient() as client:
        status, body = client.post(url + "/v1/responses", {"input": INPUT})
    assert status == 502 and "no backend replica reachable" in body["error"]["message"]


@pytest.mark.parametrize(
    ("extra_body", "field"),
    [
        ({"top_k": 20}, "extra_body.top_k"),
        ({"stop": ["</answer>"]}, "extra_body.stop"),
        ({"n": 4}, "extra_body.n"),
    ],
)
def test_settings_that_break_on_policy_training_are_refused(extra_body: dict[str, Any], field: str) -> None:
    config = {
        "base_url": "http://127.0.0.1:1/v1",
        "return_token_id_information": True,
        "extra_body": extra_body,
    }
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        VLLMModelConfig.model_validate(config)
    # Without token IDs these are ordinary sampling settings.
    VLLMModelConfig.model_validate({**config, "return_token_id_information": False})
    VLLMModelConfig.model_validate({**config, "extra_body": {"top_k": -1}})


def test_backend_must_be_given_once() -> None:
    with pytest.raises(ValueError, match="exactly one of base_url"):
        VLLMModelConfig.model_validate({})
    with pytest.raises(ValueError, match="exactly one of base_url"):
        VLLMModelConfig.model_validate(
            {"base_url": "http://a/v1", "backend_server": {"type": "responses_api_models", "name": "engine"}}
        )
    with pytest.raises(ValueError, match="must start with http"):
        VLLMModelConfig.model_validate({"base_url": ["localhost:8000/v1"]})


@contextlib.contextmanager
def old_vllm_server(seen: list[dict[str, Any]]) -> Iterator[str]:
    """A fake vLLM 0.10.1: token IDs only as ``token_id:<id>`` logprobs, prompt IDs via /tokenize."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append({**body, "authorization": request.headers.get("Authorization")})
        entries = [
            {"token": f"token_id:{t}", "logprob": -0.5 * (i + 1), "top_logprobs": []}
            for i, t in enumerate((7, 8, 9))
        ]
        message = {"role": "assistant", "content": "Bring a jacket.", "tool_calls": []}
        completion = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [
                {"index": 0, "message": message, "logprobs": {"content": entries}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
        }
        return web.json_response(completion)

    async def tokenize(request: web.Request) -> web.Response:
        seen.append({"tokenize": await request.json()})
        return web.json_response({"count": 4, "max_model_len": 4096, "tokens": [1, 2, 3, 4]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/tokenize", tokenize)
    with running_aiohttp_app(app) as url:
        yield f"{url}/v1"


def test_old_vllm_token_ids_come_from_logprobs_and_tokenize() -> None:
    seen: list[dict[str, Any]] = []
    earlier_call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
        "prompt_token_ids": [1, 2],
        "generation_token_ids": [3],
        "generation_log_probs": [-0.1],
    }
    history = [*INPUT, earlier_call, {"type": "function_call_output", "call_id": "call_1", "output": "cold"}]
    with old_vllm_server(seen) as backend:
        server = VLLMModel(
            {
                "name": "policy_model",
                "base_url": backend,
                "model": "Qwen/Qwen3-8B",
                "return_token_id_information": True,
                "api_key": "secret-key",
            }
        )
        with running_server(server) as url, SyncClient() as client:
            status, body = client.post(url + "/v1/responses", {"input": history, "tools": TOOLS})
    assert status == 200, body
    last = body["output"][-1]
    assert last["generation_token_ids"] == [7, 8, 9]
    assert last["generation_log_probs"] == [-0.5, -1.0, -1.5]
    assert last["prompt_token_ids"] == [1, 2, 3, 4]
    chat = seen[0]
    assert chat["model"] == "Qwen/Qwen3-8B" and chat["authorization"] == "Bearer secret-key"
    assert chat["logprobs"] is True and chat["top_logprobs"] == 0
    assert chat["return_tokens_as_token_ids"] is True and chat["return_token_ids"] is True
    assert chat["messages"][0] == {"role": "system", "content": "You are concise."}
    assistant = chat["messages"][2]
    assert assistant["role"] == "assistant" and assistant["prompt_token_ids"] == [1, 2]
    assert assistant["generation_token_ids"] == [3] and assistant["generation_log_probs"] == [-0.1]
    assert (
        seen[1]["tokenize"]["messages"] == chat["messages"]
        and seen[1]["tokenize"]["model"] == "Qwen/Qwen3-8B"
    )
    assert seen[1]["tokenize"]["add_generation_prompt"] is True
