"""Shared pieces of the trainer-client tests: the trainer's own inference engine and the example rows.

A trainer (NeMo RL, verl) runs its own vLLM servers and points ``policy_base_url`` at them; here
that engine is the CPU engine (``local_hf_model``, a tiny local model with forced completions so
its random weights make well-formed tool calls), started once for the directory, outside the
stack under test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nemo_gym.launch.config import project_root
from nemo_gym.testing import running_stack

AGENT = "example_single_tool_call_simple_agent"
ENV_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
TRAINING_MODEL_CONFIG = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"

# Two tool calls, then the answer: three model calls per rollout whose token IDs must chain.
FORCED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    '<tool_call>\n{"name":"get_weather","arguments":{"city":"Bergen"}}\n</tool_call>',
    "Cold in Oslo and Bergen: bring a jacket.",
]


def example_rows(n: int) -> list[dict]:
    """The first ``n`` example rows of the environment, as trainers load them from JSONL."""
    path = project_root() / "resources_servers/example_single_tool_call/data/example.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()[:n]]


@pytest.fixture(scope="session")
def engine_base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://host:port/v1`` of a running CPU engine (the trainer's own inference server)."""
    folder: Path = tmp_path_factory.mktemp("engine")
    config = folder / "engine.yaml"
    engine = {
        "entrypoint": "app.py",
        "tiny": True,
        "tiny_template": "chatml",
        "tiny_seed": 0,
        "served_model_name": "tiny-chatml",
        "default_max_tokens": 48,
        "torch_num_threads": 1,
        "forced_completions": FORCED,
    }
    config.write_text(
        yaml.safe_dump({"trainer_engine": {"responses_api_models": {"local_hf_model": engine}}})
    )
    with running_stack([str(config)]) as handle:
        (replica,) = handle.stack.head.registry.replicas["trainer_engine"]
        yield replica.url + "/v1"


def assert_contiguous(output: list[dict]) -> list[dict]:
    """The model calls of a rollout; each call's prompt IDs begin with the previous prompt + generation."""
    calls = [item for item in output if item.get("generation_token_ids")]
    seen: list[int] = []
    for call in calls:
        assert call["prompt_token_ids"][: len(seen)] == seen
        assert len(call["generation_log_probs"]) == len(call["generation_token_ids"])
        seen = call["prompt_token_ids"] + call["generation_token_ids"]
    return calls
