"""``ng_reward_profile`` (``gym eval profile``): per-task rewards across repeats, for curriculum selection.

Result rows are grouped by task (``_ng_task_index``, one per input row; the agent name keeps
tasks of different agents apart). Per task: the number of rollouts, the pass rate (the fraction
with ``reward >= pass_threshold``, the same 0-1 scale as the mean), the mean reward and its
variance across repeats, and whether the task was always solved, never solved, or mixed. Tasks
that are always or never solved teach a policy-gradient trainer nothing; the mixed ones are
where the signal is. Printed as a table (hardest first) and written as JSON.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nemo_gym.cli import console_command
from nemo_gym.collection_io import TASK_INDEX_KEY, iter_jsonl
from nemo_gym.config import ConfigError, load_config
from nemo_gym.response_items import content_text

PROMPT_PREVIEW_CHARS = 50


@dataclass(frozen=True)
class TaskProfile:
    """The rewards of one task across its rollouts."""

    task_index: int | None
    agent: str
    prompt: str
    rollouts: int
    pass_rate: float
    mean_reward: float
    reward_variance: float
    min_reward: float
    max_reward: float

    @property
    def solved(self) -> str:
        """``always``, ``never`` or ``mixed``."""
        return "always" if self.pass_rate == 1.0 else "never" if self.pass_rate == 0.0 else "mixed"


@dataclass(frozen=True)
class RewardProfile:
    """Every task's profile and the file-level summary."""

    tasks: list[TaskProfile]
    pass_threshold: float
    rows_skipped: int

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: summary, the always/never-solved task lists, and every task."""
        rollouts = sum(t.rollouts for t in self.tasks)
        rewards_mean = sum(t.mean_reward * t.rollouts for t in self.tasks) / rollouts if rollouts else 0.0
        return {
            "pass_threshold": self.pass_threshold,
            "summary": {
                "tasks": len(self.tasks),
                "rollouts": rollouts,
                "rows_skipped": self.rows_skipped,
                "mean_reward": rewards_mean,
                "mean_pass_rate": statistics.fmean(t.pass_rate for t in self.tasks) if self.tasks else 0.0,
                "always_solved": sum(t.solved == "always" for t in self.tasks),
                "never_solved": sum(t.solved == "never" for t in self.tasks),
                "mixed": sum(t.solved == "mixed" for t in self.tasks),
            },
            "always_solved": [_task_key(t) for t in self.tasks if t.solved == "always"],
            "never_solved": [_task_key(t) for t in self.tasks if t.solved == "never"],
            "tasks": [{**asdict(t), "solved": t.solved} for t in self.tasks],
        }

    def table(self, max_rows: int = 20) -> str:
        """The tasks as a text table, hardest first (lowest pass rate, then highest variance)."""
        ordered = sorted(self.tasks, key=lambda t: (t.pass_rate, -t.reward_variance, _sort_key(t)))
        header = ("TASK", "AGENT", "N", "PASS RATE", "MEAN", "VARIANCE", "SOLVED", "PROMPT")
        rows = [
            (
                str(t.task_index),
                t.agent,
                str(t.rollouts),
                f"{t.pass_rate:.3f}",
                f"{t.mean_reward:.3f}",
                f"{t.reward_variance:.4f}",
                t.solved,
                t.prompt,
            )
            for t in ordered[:max_rows]
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]
        ]
        if len(ordered) > max_rows:
            lines.append(f"... {len(ordered) - max_rows} more tasks in the JSON file")
        summary = self.as_dict()["summary"]
        lines.append(
            f"{summary['tasks']} tasks, {summary['rollouts']} rollouts: mean reward {summary['mean_reward']:.3f}, "
            f"mean pass rate {summary['mean_pass_rate']:.3f} (fractions 0-1, pass = reward >= {self.pass_threshold}); "
            f"always solved {summary['always_solved']}, never solved {summary['never_solved']}, "
            f"mixed {summary['mixed']}"
            + (f"; {self.rows_skipped} rows without a numeric reward skipped" if self.rows_skipped else "")
        )
        return "\n".join(lines)


def _task_key(task: TaskProfile) -> dict[str, Any]:
    return {"task_index": task.task_index, "agent": task.agent}


def _sort_key(task: TaskProfile) -> tuple[str, int]:
    return (task.agent, task.task_index if task.task_index is not None else -1)


def _prompt_of(row: Mapping[str, Any]) -> str:
    params = row.get("responses_create_params")
    value = params.get("input") if isinstance(params, Mapping) else None
    if isinstance(value, str):
        text = value
    elif isinstance(value, list):
        users = [item for item in value if isinstance(item, Mapping) and item.get("role") == "user"]
        text = content_text(users[-1].get("content")) if users else ""
    else:
        text = ""
    text = " ".join(text.split())
    return text if len(text) <= PROMPT_PREVIEW_CHARS else text[: PROMPT_PREVIEW_CHARS - 3] + "..."


def profile_rows(rows: Iterable[Mapping[str, Any]], pass_threshold: float = 1.0) -> RewardProfile:
    """The reward profile of result rows (rows without a numeric reward are counted and skipped)."""
    groups: dict[tuple[str, Any], list[float]] = {}
    prompts: dict[tuple[str, Any], str] = {}
    skipped = 0
    for row in rows:
        reward = row.get("reward")
        if not isinstance(reward, int | float) or isinstance(reward, bool):
            skipped += 1
            continue
        ref = row.get("agent_ref")
        agent = str(ref.get("name")) if isinstance(ref, Mapping) and ref.get("name") else ""
        task = row.get(TASK_INDEX_KEY)
        key = (agent, task if task is not None else _prompt_of(row))
        groups.setdefault(key, []).append(float(reward))
        prompts.setdefault(key, _prompt_of(row))
    tasks = []
    for (agent, task), rewards in groups.items():
        tasks.append(
            TaskProfile(
                task_index=task if isinstance(task, int) else None,
                agent=agent,
                prompt=prompts[(agent, task)],
                rollouts=len(rewards),
                pass_rate=sum(r >= pass_threshold for r in rewards) / len(rewards),
                mean_reward=statistics.fmean(rewards),
                reward_variance=statistics.pvariance(rewards),
                min_reward=min(rewards),
                max_reward=max(rewards),
            )
        )
    tasks.sort(key=_sort_key)
    return RewardProfile(tasks=tasks, pass_threshold=pass_threshold, rows_skipped=skipped)


def read_result_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a results file; a line that is not a JSON object fails naming it."""
    return [row for _, row in iter_jsonl(path)]


def _profile_command(argv: list[str]) -> int:
    config = load_config(argv, validate_refs=False)
    input_arg = config.get("input_jsonl_fpath")
    if not input_arg or not Path(str(input_arg)).is_file():
        raise ConfigError(f"+input_jsonl_fpath must name an existing rollouts JSONL file, got {input_arg!r}")
    threshold = config.get("pass_threshold", 1.0)
    if not isinstance(threshold, int | float) or isinstance(threshold, bool):
        raise ConfigError(f"+pass_threshold must be a number, got {threshold!r}")
    max_rows = config.get("max_rows_shown", 20)
    if not isinstance(max_rows, int) or max_rows < 0:
        raise ConfigError(f"+max_rows_shown must be a non-negative integer, got {max_rows!r}")
    input_path = Path(str(input_arg))
    output_path = Path(str(config.get("output_json_fpath") or input_path.with_suffix(".reward_profile.json")))
    profile = profile_rows(read_result_rows(input_path), float(threshold))
    if not profile.tasks:
        print(f"{input_path}: no rows with a numeric reward; nothing to profile")
        return 1
    print(profile.table(max_rows))
    output_path.parent.mkdir(parents=True, exist_ok=True)
    output_path.write_text(json.dumps(profile.as_dict(), indent=2) + "\n")
    print(f"wrote {output_path}")
    return 0


ng_reward_profile = console_command(_profile_command, "ng_reward_profile")
