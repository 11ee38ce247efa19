"""[TOKENS] end to end: a 3-call tool rollout on the CPU engine is token-ID contiguous and exports as one sequence.

simple_agent → vllm_model → local_hf_model (tiny local model, forced completions so the random
weights make well-formed tool calls; the logprobs and the prompt IDs are real). Every call k+1's
prompt must begin with call k's prompt + generation, and ``ng_export_training_data`` must build
one contiguous training sequence from the rollout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.launch.config import project_root
from nemo_gym.testing import read_jsonl, running_stack
from nemo_gym.testing.cpu_engine import (
    LOCAL_HF_MODEL_CONFIG,
    export_training_sequences,
    forced_engine_config,
    run_agent,
)

pytestmark = pytest.mark.slow

FORCED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    '<tool_call>\n{"name":"get_weather","arguments":{"city":"Bergen"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Skinnyville"}}\n</tool_call>',
    "Cold in Oslo, Bergen and Skinnyville: bring a jacket.",
]


def test_three_tool_calls_contiguous_and_exported(tmp_path: Path) -> None:
    row = read_jsonl(project_root() / "resources_servers/example_single_tool_call/data/example.jsonl")[0]
    configs = [
        "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
        LOCAL_HF_MODEL_CONFIG,
        forced_engine_config(tmp_path / "forced.yaml", FORCED),
    ]
    with running_stack(configs) as handle:
        result = run_agent(handle.head_url, "example_single_tool_call_simple_agent", row, timeout_s=120)

    output = result["response"]["output"]
    calls = [item for item in output if "prompt_token_ids" in item]
    assert len(calls) == 4, [item["type"] for item in output]
    for earlier, later in zip(calls, calls[1:], strict=False):
        prefix = earlier["prompt_token_ids"] + earlier["generation_token_ids"]
        assert later["prompt_token_ids"][: len(prefix)] == prefix
        assert "token_ids_contiguous" not in later

    (sequence,) = export_training_sequences(
        [{**result, "_ng_task_index": 0, "_ng_rollout_index": 0}], tmp_path
    )
    assert sequence["contiguous"] is True and sequence["num_calls"] == 4
    last = calls[-1]
    assert sequence["input_ids"] == last["prompt_token_ids"] + last["generation_token_ids"]
    assert sum(sequence["loss_mask"]) == sum(len(c["generation_token_ids"]) for c in calls)
