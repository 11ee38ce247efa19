"""The CPU engine with forced completions, for tests of token IDs through whole stacks.

The tiny local model behind ``vllm_model`` (``local_hf_model``) has random weights, so a test
forces its completions (call k of a rollout answers ``forced[k]``) to get well-formed tool calls
and actions; the prompt IDs, generation IDs and log-probs stay the engine's own. What such tests
share: the config that forces the completions, one agent run on a running stack, and
``ng_export_training_data`` (a real subprocess) over the rollouts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from nemo_gym.serving.server_client import ServerClient

LOCAL_HF_MODEL_CONFIG = "responses_api_models/local_hf_model/configs/local_hf_model.yaml"


def forced_engine_config(path: Path, forced: Sequence[str], max_tokens: int = 48, **extra: Any) -> str:
    """Write to ``path`` a config in which the CPU engine answers call k with ``forced[k]`` (at most
    ``max_tokens`` tokens each), with ``extra`` top-level sections beside it; the path, to add to
    ``+config_paths`` after the engine's own config."""
    engine = {"forced_completions": list(forced), "default_max_tokens": max_tokens}
    sections = {"local_hf_engine": {"responses_api_models": {"local_hf_model": engine}}, **extra}
    path.write_text(yaml.safe_dump(sections))
    return str(path)


def run_agent(head_url: str, agent: str, row: dict[str, Any], timeout_s: float = 180) -> Any:
    """One ``/run`` of ``agent`` on ``row`` through the stack at ``head_url``; the agent's answer."""

    async def run() -> Any:
        client = ServerClient(head_url, timeout_s=timeout_s)
        try:
            return await client.rollout().post_json(agent, "/run", row)
        finally:
            await client.close()

    return asyncio.run(run())


def export_training_sequences(rollouts: Sequence[dict[str, Any]], directory: Path) -> list[dict[str, Any]]:
    """``ng_export_training_data`` over ``rollouts`` (written to ``directory/rollouts.jsonl``), run
    as a subprocess of this Python; the sequences it wrote, in order. Fails the test when it
    exits non-zero."""
    source, sequences = directory / "rollouts.jsonl", directory / "sequences.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rollouts))
    code = (
        "from nemo_gym.train_data import ng_export_training_data as c; "
        f"c(['+input_jsonl_fpath={source}', '+output_jsonl_fpath={sequences}'])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in sequences.read_text().splitlines()]
