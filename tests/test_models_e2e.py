"""End to end on the CPU engine: simple_agent → vllm_model → local_hf_model, as ``ng_run`` starts them.

The stack is example_single_tool_call's config plus ``local_hf_model.yaml`` (the tiny model behind
``policy_model``), with forced completions so that the random-weights model makes a well-formed
tool call and then answers. Every model call of the rollout must carry token IDs and logprobs
of consistent lengths, the logprobs must match an independent forward pass of the tiny model,
and the second call's prompt must extend the first call's prompt + generation (the splice).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from nemo_gym.engine.tiny_model import build_tiny_model
from nemo_gym.launch.config import project_root
from nemo_gym.launch.launcher import StackHandle
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import running_stack

pytestmark = pytest.mark.slow

FORCED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "Bring a jacket: it is cold in Oslo.",
]
AGENT = "example_single_tool_call_simple_agent"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackHandle]:
    overrides = tmp_path_factory.mktemp("config") / "forced.yaml"
    engine_fields = {"forced_completions": FORCED, "default_max_tokens": 48}
    overrides.write_text(
        yaml.safe_dump({"local_hf_engine": {"responses_api_models": {"local_hf_model": engine_fields}}})
    )
    config_paths = [
        "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
        "responses_api_models/local_hf_model/configs/local_hf_model.yaml",
        str(overrides),
    ]
    with running_stack(config_paths) as handle:
        yield handle


def example_rows() -> list[dict[str, Any]]:
    path = project_root() / "resources_servers/example_single_tool_call/data/example.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def run_rows(head_url: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    client = ServerClient(head_url, timeout_s=120)
    try:
        return list(await asyncio.gather(*(client.rollout().post_json(AGENT, "/run", row) for row in rows)))
    finally:
        await client.close()


def forward_logprobs(model: Any, prompt_ids: list[int], generated: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + generated])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[len(prompt_ids) - 1 + i, token]) for i, token in enumerate(generated)]


def test_multi_turn_tool_rollout_carries_real_token_ids_and_logprobs(stack: StackHandle) -> None:
    rows = example_rows()[:2]
    results = asyncio.run(run_rows(stack.head_url, rows))
    reference = AutoModelForCausalLM.from_pretrained(build_tiny_model()).eval()
    for result in results:
        assert result["reward"] == 1.0 and result["called_tool"] and result["answered"]
        output = result["response"]["output"]
        assert [item["type"] for item in output] == ["function_call", "function_call_output", "message"]
        calls = [item for item in output if "prompt_token_ids" in item]
        assert len(calls) == 2, "both model calls carry token IDs on their last item"
        for item in calls:
            prompt, generated, logprobs = (
                item["prompt_token_ids"],
                item["generation_token_ids"],
                item["generation_log_probs"],
            )
            assert len(generated) == len(logprobs) > 0 and len(prompt) > 0
            assert logprobs == pytest.approx(forward_logprobs(reference, prompt, generated), abs=1e-4)
            assert "token_ids_contiguous" not in item
        first, second = calls
        prefix = first["prompt_token_ids"] + first["generation_token_ids"]
        assert second["prompt_token_ids"][: len(prefix)] == prefix
        assert output[-1]["content"][0]["text"] == FORCED[1]


def test_openai_client_talks_to_the_stacks_policy_model(stack: StackHandle) -> None:
    async def policy_url() -> str:
        client = ServerClient(stack.head_url)
        try:
            return (await client.resolve("policy_model"))[0]
        finally:
            await client.close()

    client = openai.OpenAI(base_url=asyncio.run(policy_url()) + "/v1", api_key="x")
    row = example_rows()[0]["responses_create_params"]
    response = client.responses.create(model="tiny-chatml", input=row["input"], tools=row["tools"])
    assert response.status == "completed"
    assert response.output[-1].type == "function_call"
    assert (response.output[-1].model_extra or {})["generation_token_ids"]
