"""Train a tiny local policy with TRL's GRPO on CPU, every reward from this stack's ``/verify``.

    python scripts/train_trl.py                       # 24 steps, seed 0, results in ./trl_run
    python scripts/train_trl.py --steps 40 --output-dir /tmp/run
    python scripts/train_trl.py --via openenv        # the same, each reward through OpenEnv's client

What it does: builds the tiny random-weights model offline (``nemo_gym.engine.tiny_model``),
starts a stack holding the ``mcqa`` resources server (``resources_servers/mcqa/configs/
trl_letter.yaml``, on a free head port), and runs ``trl.GRPOTrainer`` on
``resources_servers/mcqa/data/trl_letter.jsonl``: TRL samples the completions with its own copy
of the policy, and :class:`nemo_gym.bridges.trl_rewards.VerifyReward` scores each one through the
server's real ``/verify`` over HTTP (1.0 when the answer starts with the expected letter, A). The
random-weights policy starts at about 0.14 and learns to lead with the letter.

With ``--via openenv`` the server is put behind this stack's OpenEnv bridge
(:mod:`nemo_gym.bridges.openenv_server`) and TRL reaches it the way it reaches any OpenEnv
environment: ``environment_factory`` (:func:`nemo_gym.bridges.trl_openenv.openenv_environment_factory`,
one OpenEnv client session per rollout, ``reset`` on the rollout's row) and a reward function that
steps each completion into its episode (:func:`nemo_gym.bridges.trl_openenv.openenv_reward`). Needs
the ``openenv`` extra too.

Writes ``rewards.json`` (the mean reward of each step, the first- and last-quarter means, the
seed, the time) and ``reward_curve.png`` into ``--output-dir``, and prints the summary. Exits 1
when the last-quarter mean is not above the first-quarter mean. Needs the ``trl`` extra
(``pip install -e '.[cpu,trl]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "resources_servers/mcqa/configs/trl_letter.yaml"
DATA = ROOT / "resources_servers/mcqa/data/trl_letter.jsonl"


def run_grpo(
    args: argparse.Namespace,
    out: Path,
    model_path: Path,
    dataset: Any,
    reward_funcs: Any,
    max_completion_length: int,
    **trainer_kwargs: Any,
) -> float:
    """Train the tiny model at ``model_path`` with TRL's GRPOTrainer on CPU (``args``: steps,
    lr, seed, generations); ``trainer_kwargs`` go to the trainer (``rollout_func``,
    ``environment_factory``). Returns the seconds training took."""
    from nemo_gym.bridges.trl_grpo import cpu_grpo_trainer

    trainer = cpu_grpo_trainer(
        model_path,
        dataset,
        reward_funcs,
        output_dir=out / "trainer",
        steps=args.steps,
        generations=args.generations,
        max_completion_length=max_completion_length,
        learning_rate=args.lr,
        seed=args.seed,
        **trainer_kwargs,
    )
    started = time.monotonic()
    trainer.train()
    return time.monotonic() - started


def quarter_means(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last quarter (at least one value each)."""
    size = max(1, len(values) // 4)
    return sum(values[:size]) / size, sum(values[-size:]) / size


def step_summary(
    args: argparse.Namespace, history: list[list[float]], seconds: float, **counts: Any
) -> dict[str, Any]:
    """A run's summary from its reward batches (``history``, one a step): the seed and settings,
    ``counts`` (calls made, weights pushed), each step's mean reward, the first- and last-quarter
    means and the training time."""
    steps = [sum(batch) / len(batch) for batch in history]
    first, last = quarter_means(steps)
    return {
        "seed": args.seed,
        "steps": len(steps),
        "generations_per_step": args.generations,
        "learning_rate": args.lr,
        **counts,
        "step_mean_rewards": [round(r, 4) for r in steps],
        "first_quarter_mean": round(first, 4),
        "last_quarter_mean": round(last, 4),
        "train_seconds": round(seconds, 1),
    }


def print_summary(summary: dict[str, Any]) -> None:
    """The summary as one JSON line, then the reward's rise in words."""
    print(json.dumps(summary))
    print(
        f"reward: first quarter {summary['first_quarter_mean']:.3f} -> last quarter "
        f"{summary['last_quarter_mean']:.3f} over {summary['steps']} steps in {summary['train_seconds']} s"
    )


def plot(rewards: list[float], path: Path, title: str, ylabel: str = "mean reward (mcqa /verify)") -> None:
    """The per-step mean reward as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(range(1, len(rewards) + 1), rewards, marker="o", markersize=3)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _recorded(func: Any, history: list[list[float]]) -> Any:
    """``func`` as a TRL reward function whose batches are appended to ``history``."""

    def reward(*args: Any, **kwargs: Any) -> list[float]:
        values = func(*args, **kwargs)
        history.append(list(values))
        return values

    reward.__name__ = func.__name__
    return reward


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Start the stack, run GRPO, stop the stack; the run's summary."""
    import torch
    from datasets import Dataset

    from nemo_gym.bridges.trl_rewards import VerifyReward, server_url, trl_dataset_columns
    from nemo_gym.engine.tiny_model import build_tiny_model
    from nemo_gym.launch.config import load_config
    from nemo_gym.launch.launcher import StackHandle
    from nemo_gym.serving.nemo_gym_client import NeMoGymServerClient

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model_path = build_tiny_model(out / "tiny_model", seed=args.seed)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_dict(trl_dataset_columns(rows))

    handle = StackHandle.start(load_config([f"+config_paths=[{CONFIG}]", "++head_server.port=0"], cwd=ROOT))
    bridge = contextlib.ExitStack()
    try:
        config = NeMoGymServerClient.load_from_global_config(handle.head_server_config).global_config_dict
        reward = VerifyReward(server_url(config, "mcqa"))
        reward_funcs: Any = reward
        extra: dict[str, Any] = {}
        if args.via == "openenv":
            from nemo_gym.bridges.openenv_server import openenv_app
            from nemo_gym.bridges.trl_openenv import openenv_environment_factory, openenv_reward
            from nemo_gym.testing import running_app

            url = bridge.enter_context(running_app(openenv_app(server_url(config, "mcqa"), rows)))
            reward_funcs = _recorded(openenv_reward, reward.history)
            extra["environment_factory"] = openenv_environment_factory(url)
        seconds = run_grpo(args, out, model_path, dataset, reward_funcs, max_completion_length=4, **extra)
    finally:
        bridge.close()
        handle.stop()

    summary = step_summary(
        args, reward.history, seconds, via=args.via, verify_calls=sum(len(b) for b in reward.history)
    )
    (out / "rewards.json").write_text(json.dumps(summary, indent=2) + "\n")
    if not args.no_plot:
        through = "through OpenEnv's client, " if args.via == "openenv" else ""
        plot(
            summary["step_mean_rewards"],
            out / "reward_curve.png",
            f"TRL GRPO on CPU, tiny model, {through}mcqa /verify (seed {args.seed})",
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24, help="GRPO steps (one prompt group each)")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt (the GRPO group)")
    parser.add_argument("--lr", type=float, default=3e-3, help="learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (the model is tiny: 1 is fastest)"
    )
    parser.add_argument("--data", default=str(DATA), help="NeMo Gym JSONL rows for the mcqa server")
    parser.add_argument(
        "--via", choices=["verify", "openenv"], default="verify",
        help="how TRL reaches the environment: its /verify as the reward function, or OpenEnv's client",
    )  # fmt: skip
    parser.add_argument("--output-dir", default="trl_run")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    args = parser.parse_args(argv)
    summary = train(args)
    print_summary(summary)
    return 0 if summary["last_quarter_mean"] > summary["first_quarter_mean"] else 1


if __name__ == "__main__":
    sys.exit(main())
