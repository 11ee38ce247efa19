"""The README's main job: start a stack on the embedded CPU model, collect rollouts, print metrics.

``python -m nemo_gym.tools.main_job [overrides...]`` (``scripts/main_job.sh`` installs first). The
policy is the CPU engine (``local_hf_model``) behind ``vllm_model`` with token IDs on. With no
``+model=...`` it builds a tiny random-weights model locally (no downloads, so its rewards are
near 0); ``+model=<hub name or local path>`` loads a real model instead (e.g. a small instruct
model already in the Hugging Face cache).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from nemo_gym.console.command_help import help_text, wants_help
from nemo_gym.launch.config import ConfigError, deep_merge, load_config, project_root
from nemo_gym.launch.launcher import StackHandle

DEFAULT_CONFIG_PATHS = [
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
    "responses_api_models/local_hf_model/configs/local_hf_model.yaml",
]
DEFAULT_AGENT = "example_single_tool_call_simple_agent"
DEFAULT_INPUT = "resources_servers/example_single_tool_call/data/example.jsonl"
ENGINE = "local_hf_engine"


def model_overrides(model: str) -> dict[str, Any]:
    """Config that points the CPU engine (and the policy model's name) at a real model."""
    engine = {"tiny": False, "model": model, "served_model_name": model}
    return {
        ENGINE: {"responses_api_models": {"local_hf_model": engine}},
        "policy_model": {"responses_api_models": {"vllm_model": {"model": model}}},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the main job; returns the exit code."""
    from nemo_gym.rollout_collection import RolloutCollectionHelper

    args = list(sys.argv[1:] if argv is None else argv)
    if wants_help(args):
        sys.stdout.write(help_text("main_job", prog="scripts/main_job.sh"))
        return 0
    root = project_root()
    base = {
        "config_paths": [str(root / p) for p in DEFAULT_CONFIG_PATHS],
        "head_server": {"host": "127.0.0.1", "port": 0},
        "agent_name": DEFAULT_AGENT,
        "input_jsonl_fpath": str(root / DEFAULT_INPUT),
        "output_jsonl_fpath": "results/main_job_rollouts.jsonl",
    }
    try:
        config = load_config(args, base=base)
    except ConfigError as exc:
        sys.stderr.write(f"config error: {exc}\n(run 'scripts/main_job.sh --help' for its options)\n")
        return 2
    if config.get("model"):
        config = deep_merge(config, model_overrides(str(config["model"])))
        print(f"Policy: {config['model']} on the CPU engine (loaded with transformers).", flush=True)
    else:
        print(
            "Policy: a tiny random-weights model built locally (offline, no downloads), on the CPU engine.\n"
            "        Its answers are noise, so rewards will be near 0; pass +model=<hub name or path> for a real model.",
            flush=True,
        )
    output = Path(str(config["output_jsonl_fpath"]))
    for stale in output.parent.glob(output.stem + "*") if output.parent.exists() else []:
        stale.unlink()  # a fresh run each time: this job is a demonstration, not a resumable collection
    handle = StackHandle.start(config)
    try:
        print(handle.stack.table(), flush=True)
        print(f"All servers healthy in {handle.stack.startup_seconds:.2f}s", flush=True)
        summary = asyncio.run(
            RolloutCollectionHelper().run_from_config({**config, "head_server": handle.head_server_config})
        )
    finally:
        handle.stop()
    print(f"See the rollouts in the viewer: {viewer_command(config, output)}", flush=True)
    return 0 if summary.succeeded else 1


def viewer_command(config: dict[str, Any], output: Path) -> str:
    """The ``ng_viewer`` command that opens this job's results, decoding tokens with the policy's
    tokenizer (the tiny model's folder, or the ``+model`` given)."""
    engine = config.get(ENGINE, {}).get("responses_api_models", {}).get("local_hf_model", {})
    tokenizer = config.get("model") or engine.get("model")
    if not tokenizer and engine.get("tiny"):
        from nemo_gym.engine.tiny_model import default_tiny_model_path

        tokenizer = default_tiny_model_path(
            template=str(engine.get("tiny_template", "chatml")), seed=int(engine.get("tiny_seed", 0))
        )
    return f"ng_viewer +input={output}" + (f" +tokenizer={tokenizer}" if tokenizer else "")


if __name__ == "__main__":
    sys.exit(main())
