"""Train a tiny local policy with TRL's GRPO on CPU, on multi-turn tool-using rollouts run by this
stack's agent, the policy served by the stack's CPU engine and updated after every step.

    python scripts/train_trl_agent.py                      # 30 steps, seed 0, results in ./trl_agent_run
    python scripts/train_trl_agent.py --steps 10 --output-dir /tmp/run

What it does: builds the tiny random-weights model offline, starts a stack from
``resources_servers/letter_lookup/configs/letter_lookup.yaml`` (the environment and
``simple_agent``), ``responses_api_models/local_hf_model/configs/local_hf_model.yaml`` (the CPU
engine behind ``vllm_model``, token IDs on) and ``resources_servers/letter_lookup/configs/
trl_policy.yaml`` (the engine takes weight updates; its test hook writes each rollout's first
turn, the ``lookup`` call), then runs ``trl.GRPOTrainer`` with
:class:`nemo_gym.bridges.trl_rollouts.AgentRollouts` as its ``rollout_func``: before each step the
trainer's weights go to the engine (``/update_weights_from_disk``), each rollout is the agent's
``/run`` (model call, the tool's answer, model call, ``/verify``), and TRL trains on the stack's
token IDs and logprobs, the tool's output and the written call masked out of the loss (the policy
learns its answer after the tool's output).

Writes ``rewards.json`` (the mean reward of each step, first- and last-quarter means, the seed,
the time) and ``reward_curve.png`` into ``--output-dir``. Exits 1 when the last-quarter mean is
not above the first-quarter mean (``--no-check`` to skip). Needs the ``cpu`` and ``trl`` extras.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_trl import plot, print_summary, run_grpo, step_summary  # noqa: E402 - the sibling script's helpers

CONFIGS = [
    "resources_servers/letter_lookup/configs/letter_lookup.yaml",
    "responses_api_models/local_hf_model/configs/local_hf_model.yaml",
    "resources_servers/letter_lookup/configs/trl_policy.yaml",
]
DATA = ROOT / "resources_servers/letter_lookup/data/train.jsonl"


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Start the stack, run GRPO over agent rollouts, stop the stack; the run's summary."""
    import torch
    from datasets import Dataset

    from nemo_gym.bridges.trl_rewards import server_url, trl_dataset_columns
    from nemo_gym.bridges.trl_rollouts import AgentRollouts, rollout_reward
    from nemo_gym.engine.tiny_model import build_tiny_model
    from nemo_gym.launch.config import load_config
    from nemo_gym.launch.launcher import StackHandle
    from nemo_gym.serving.nemo_gym_client import NeMoGymServerClient

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model_path = build_tiny_model(seed=args.seed)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    for row in rows:
        row["responses_create_params"]["max_output_tokens"] = args.max_tokens
    dataset = Dataset.from_dict({"prompt": trl_dataset_columns(rows)["prompt"]})

    overrides = [
        f"+config_paths=[{','.join(CONFIGS)}]",
        "++head_server.port=0",
        f"++local_hf_engine.responses_api_models.local_hf_model.tiny_seed={args.seed}",
        f"++local_hf_engine.responses_api_models.local_hf_model.torch_num_threads={args.threads}",
    ]
    handle = StackHandle.start(load_config(overrides, cwd=ROOT))
    try:
        config = NeMoGymServerClient.load_from_global_config(handle.head_server_config).global_config_dict
        rollouts = AgentRollouts(
            rows,
            head_server_config=handle.head_server_config,
            engine_url=server_url(config, "local_hf_engine"),
            agent_name="letter_lookup_simple_agent",
            weights_dir=out / "weights",
            skip_calls=[0],  # the lookup call the engine's test hook wrote: not the policy's choice
        )
        seconds = run_grpo(
            args, out, model_path, dataset, rollout_reward, max_completion_length=256, rollout_func=rollouts
        )
    finally:
        handle.stop()

    summary = step_summary(
        args,
        rollouts.history,
        seconds,
        rollouts=sum(len(b) for b in rollouts.history),
        weight_pushes=rollouts.pushes,
    )
    (out / "rewards.json").write_text(json.dumps(summary, indent=2) + "\n")
    if not args.no_plot:
        title = f"TRL GRPO on CPU over agent rollouts (letter_lookup, tool call + answer; seed {args.seed})"
        plot(
            summary["step_mean_rewards"],
            out / "reward_curve.png",
            title,
            ylabel="mean reward (letter_lookup /verify)",
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps (one prompt group each)")
    parser.add_argument("--generations", type=int, default=8, help="rollouts per prompt (the GRPO group)")
    parser.add_argument("--lr", type=float, default=3e-3, help="learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, trainer and engine each")
    parser.add_argument("--max-tokens", type=int, default=20, help="max_output_tokens of each model call")
    parser.add_argument("--data", default=str(DATA), help="NeMo Gym JSONL rows for letter_lookup")
    parser.add_argument("--output-dir", default="trl_agent_run")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    parser.add_argument("--no-check", action="store_true", help="exit 0 even if the reward did not rise")
    args = parser.parse_args(argv)
    summary = train(args)
    print_summary(summary)
    return 0 if args.no_check or summary["last_quarter_mean"] > summary["first_quarter_mean"] else 1


if __name__ == "__main__":
    sys.exit(main())
