"""[TOKENS] end to end: a 3-call tool rollout on the CPU engine is token-ID contiguous and exports as one sequence.

simple_agent → vllm_model → local_hf_model (tiny local model, forced completions so the random
weights make well-formed tool calls; the logprobs and the prompt IDs are real). Every call k+1's
prompt must begin with call k's prompt + generation, and ``ng_export_training_data`` must build
one contiguous training sequence from the rollout.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nemo_gym.launch.config import project_root
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import running_stack

pytestmark = pytest.mark.slow

FORCED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    '<tool_call>\n{"name":"get_weather","arguments":{"city":"Bergen"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Skinnyville"}}\n</tool_call>',
    "Cold in Oslo, Bergen and Skinnyville: bring a jacket.",
]


def test_three_tool_calls_contiguous_and_exported(tmp_path: Path) -> None:
    overrides = tmp_path / "forced.yaml"
    engine = {"forced_completions": FORCED, "default_max_tokens": 48}
    overrides.write_text(
        yaml.safe_dump({"local_hf_engine": {"responses_api_models": {"local_hf_model": engine}}})
    )
    row = json.loads(
        (project_root() / "resources_servers/example_single_tool_call/data/example.jsonl")
        .read_text()
        .splitlines()[0]
    )
    configs = [
        "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
        "responses_api_models/local_hf_model/configs/local_hf_model.yaml",
        str(overrides),
    ]

    async def run(head_url: str) -> dict:
        client = ServerClient(head_url, timeout_s=120)
        try:
            return await client.rollout().post_json("example_single_tool_call_simple_agent", "/run", row)
        finally:
            await client.close()

    with running_stack(configs) as handle:
        result = asyncio.run(run(handle.head_url))

    output = result["response"]["output"]
    calls = [item for item in output if "prompt_token_ids" in item]
    assert len(calls) == 4, [item["type"] for item in output]
    for earlier, later in zip(calls, calls[1:], strict=False):
        prefix = earlier["prompt_token_ids"] + earlier["generation_token_ids"]
        assert later["prompt_token_ids"][: len(prefix)] == prefix
        assert "token_ids_contiguous" not in later

    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text(json.dumps({**result, "_ng_task_index": 0, "_ng_rollout_index": 0}) + "\n")
    sequences = tmp_path / "sequences.jsonl"
    code = (
        "import sys; from nemo_gym.train_data import ng_export_training_data as c; "
        f"c(['+input_jsonl_fpath={rollouts}', '+output_jsonl_fpath={sequences}'])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    (sequence,) = [json.loads(line) for line in sequences.read_text().splitlines()]
    assert sequence["contiguous"] is True and sequence["num_calls"] == 4
    last = calls[-1]
    assert sequence["input_ids"] == last["prompt_token_ids"] + last["generation_token_ids"]
    assert sum(sequence["loss_mask"]) == sum(len(c["generation_token_ids"]) for c in calls)
