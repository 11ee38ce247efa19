"""NeMo Gym's training-token capture through ``ng_run``: a trainer reads each rollout back contiguous.

``ng_run`` (a real subprocess) starts simple_agent → vllm_model → local_hf_model (the tiny local
model, forced to make three tool calls, real prompt IDs and log-probs) with
``token_id_capture`` on. The model server captures every call of the rollout into the file
store; a trainer-side consumer (``trajectories_from_source`` over a ``TokenCaptureStore``)
freezes it and gets one contiguous sequence. ``return_token_id_information`` stays on, so the
same rollout also carries its token IDs on the response items: both paths must give the same
sequences, call by call.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nemo_gym.launch.config import project_root
from nemo_gym.testing import read_jsonl
from nemo_gym.testing.cpu_engine import LOCAL_HF_MODEL_CONFIG, forced_engine_config, run_agent
from nemo_gym.testing.stacks import ng_run_process
from nemo_gym.token_id_capture import (
    TokenCaptureStore,
    assert_prefix_contiguity,
    trajectories_for_rollout,
    trajectories_from_source,
)

pytestmark = pytest.mark.slow

FORCED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    '<tool_call>\n{"name":"get_weather","arguments":{"city":"Bergen"}}\n</tool_call>',
    "Cold in Oslo and Bergen: bring a jacket.",
]
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def _token_items(output: list[dict]) -> list[tuple[list, list, list]]:
    return [tuple(item[f] for f in TOKEN_FIELDS) for item in output if item.get("generation_token_ids")]


def test_ng_run_with_token_id_capture_on_gives_a_trainer_contiguous_sequences(tmp_path: Path) -> None:
    captures = tmp_path / "captures"
    capture = {"enabled": True, "all_agents": True, "dir": str(captures)}
    row = read_jsonl(project_root() / "resources_servers/example_single_tool_call/data/example.jsonl")[0]
    configs = [
        "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
        LOCAL_HF_MODEL_CONFIG,
        forced_engine_config(tmp_path / "forced.yaml", FORCED, token_id_capture=capture),
    ]
    with ng_run_process(configs, timeout_s=180) as (_, head_url):
        body = {**row, "_ng_task_index": 3, "_ng_rollout_index": 1}
        result = run_agent(head_url, "example_single_tool_call_simple_agent", body)

    # What the rollout itself carries (return_token_id_information): three calls, spliced.
    carried = _token_items(result["response"]["output"])
    assert len(carried) == 3, [item.get("type") for item in result["response"]["output"]]

    # What the trainer reads back from the capture: one contiguous chain, not masked.
    built = asyncio.run(trajectories_from_source("3-1", TokenCaptureStore(captures)))
    assert built is not None and built["mask_sample"] is False, json.dumps(built["metrics"])
    assert built["metrics"]["chains"] == 1 and built["metrics"]["roots"] == 1
    assert built["metrics"]["n_calls"] == 3 and built["metrics"]["delivered_fraction"] == 1.0
    rebuilt = built["rebuilt_response"]
    assert_prefix_contiguity(rebuilt)
    # Both capture paths: the same sequences, call by call.
    assert _token_items(rebuilt["output"]) == carried
    entries = TokenCaptureStore(captures).read_entries("3-1")
    assert [e.parent_resolution.value for e in sorted(entries, key=lambda e: len(e.prompt_token_ids))] == [
        "root",
        "resolved",
        "resolved",
    ]
    # The frozen snapshot is retired only as consumed; a second consumer then finds nothing to train on.
    snapshot = built["_capture_snapshot"]
    store = TokenCaptureStore(captures)
    assert asyncio.run(store.drop("3-1", snapshot_id=snapshot["snapshot_id"], version=snapshot["version"]))
    again = trajectories_for_rollout("3-1", [captures])
    assert again is not None and again["mask_sample"] is True
