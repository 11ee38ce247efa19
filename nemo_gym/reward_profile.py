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
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_gym.collection.collection_io import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, iter_jsonl
from nemo_gym.collection.metrics import pass_at_k
from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, load_config
from nemo_gym.response_items import content_text

if TYPE_CHECKING:
    from nemo_gym.config_types import AggregateMetrics

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


def _rollout_key(row: Mapping[str, Any]) -> tuple[Any, Any]:
    return row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY]


def _numeric(value: Any) -> int | float | None:
    """``value`` as a number for a metrics table (a bool as 0/1), else ``None``."""
    if isinstance(value, bool):
        return int(value)
    return value if isinstance(value, int | float) else None


class RewardProfiler:
    """NeMo Gym's row-level reward profiling helpers: pair materialized inputs with their
    results by ``(_ng_task_index, _ng_rollout_index)``, say how complete a collection is, and
    flatten one result into the numbers a metrics table keeps. Per-task profiles over a whole
    results file are :func:`profile_rows` (``ng_reward_profile``)."""

    def _by_rollout_key(self, rows: Iterable[Mapping[str, Any]], what: str) -> dict[tuple[Any, Any], Any]:
        indexed: dict[tuple[Any, Any], Any] = {}
        for row in rows:
            key = _rollout_key(row)
            if key in indexed:
                raise ValueError(f"two {what} rows have the rollout key (task, rollout) {key}")
            indexed[key] = row
        return indexed

    def align_rows_and_results(
        self, rows: list[dict[str, Any]], results: list[dict[str, Any]], allow_partial_rollouts: bool = False
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """``(input row, result)`` pairs in rollout-key order. ``ValueError`` for a result with
        no input row, and, unless ``allow_partial_rollouts``, for an input row with no result."""
        by_row = self._by_rollout_key(rows, "materialized input")
        by_result = self._by_rollout_key(results, "result")
        extra = sorted(by_result.keys() - by_row.keys())
        if extra:
            raise ValueError(
                f"{len(extra)} results match no materialized input row; first keys: {extra[:10]}"
            )
        missing = sorted(by_row.keys() - by_result.keys())
        if missing and not allow_partial_rollouts:
            raise ValueError(
                f"{len(missing)} materialized input rows have no result; first keys: {missing[:10]}. "
                "Pass ++allow_partial_rollouts=True to profile the rollouts that did complete."
            )
        return [(by_row[key], by_result[key]) for key in sorted(by_row.keys() & by_result.keys())]

    def profile_completion_summary(
        self, rows: list[dict[str, Any]], results: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """How much of a collection finished: rollouts expected/completed/missing/extra, the
        completion percentage, and input rows (one per task and agent) complete, partial, missing."""
        by_row = self._by_rollout_key(rows, "materialized input")
        by_result = self._by_rollout_key(results, "result")
        done = by_row.keys() & by_result.keys()

        def task_of(key: tuple[Any, Any]) -> tuple[Any, Any]:
            # One task sent to several agents shares its task index: count it once per agent.
            ref = by_row[key].get("agent_ref")
            return key[0], ref.get("name") if isinstance(ref, Mapping) else None

        expected = Counter(task_of(key) for key in by_row)
        completed = Counter(task_of(key) for key in done)
        complete = sum(completed[task] == n for task, n in expected.items())
        missing = sum(completed[task] == 0 for task in expected)
        return {
            "expected_rollout_rows": len(by_row),
            "completed_rollout_rows": len(done),
            "missing_rollout_rows": len(by_row) - len(done),
            "extra_rollout_rows": len(by_result.keys() - by_row.keys()),
            "reward_profile_completion_pct": 100.0 * len(done) / len(by_row) if by_row else 100.0,
            "total_input_rows": len(expected),
            "complete_input_rows": complete,
            "partial_input_rows": len(expected) - complete - missing,
            "missing_input_rows": missing,
        }

    def rollout_info_from_result(self, result: Mapping[str, Any]) -> dict[str, Any]:
        """One result as numbers: ``rollout_id`` (``task:rollout``), both indices, ``reward``,
        the response's numeric usage fields, and every other numeric top-level field; fields
        starting with ``_`` (framework bookkeeping) are left out."""
        task, rollout = _rollout_key(result)
        info: dict[str, Any] = {
            "rollout_id": f"{task}:{rollout}",
            TASK_INDEX_KEY: task,
            ROLLOUT_INDEX_KEY: rollout,
        }
        if "reward" in result:
            info["reward"] = result["reward"]
        response = result.get("response")
        usage = (response.get("usage") if isinstance(response, Mapping) else None) or {}
        fields = [*usage.items(), *((k, v) for k, v in result.items() if not k.startswith("_"))]
        for key, value in fields:
            number = _numeric(value)
            if number is not None and key not in ("reward", "response"):
                info[key] = number
        return info


# ---- NeMo Gym's metric helpers for an environment's own compute_metrics() ----------------------
# NeMo Gym environments override ``compute_metrics(tasks)`` / ``get_key_metrics(agent_metrics)``
# and build their numbers with these helpers. ``tasks[i]`` is the list of verify answers of
# task i, in rollout order. Scores are percentages (0-100), as in our own aggregate metrics.

STD_DEV_ACROSS_RUNS_SUFFIX = "/std_dev_across_runs"
STD_ERR_ACROSS_RUNS_SUFFIX = "/std_err_across_runs"
AVG_SAMPLE_STD_DEV_SUFFIX = "/avg_sample_std_dev"
_STAT_SUFFIXES = (STD_DEV_ACROSS_RUNS_SUFFIX, STD_ERR_ACROSS_RUNS_SUFFIX, AVG_SAMPLE_STD_DEV_SUFFIX)

ScoreFn = Callable[[dict[str, Any]], Mapping[str, Any]]
TaskScores = list[list[dict[str, float]]]


def _task_scores(
    tasks: list[list[dict[str, Any]]], score_fn: ScoreFn, answer_key: str | None
) -> tuple[TaskScores, list[list[Any]]]:
    """Per task, per rollout: the named scores (booleans as 0/1, ``no_answer`` when answers count)."""
    scores: TaskScores = []
    answers: list[list[Any]] = []
    for rollouts in tasks:
        task_scores, task_answers = [], []
        for rollout in rollouts:
            named = {name: int(v) if isinstance(v, bool) else v for name, v in score_fn(rollout).items()}
            if answer_key is not None:
                answer = rollout.get(answer_key)
                task_answers.append(answer)
                named["no_answer"] = 1 if answer is None else 0
            task_scores.append(named)
        scores.append(task_scores)
        answers.append(task_answers)
    return scores, answers


def _majority_of(pairs: list[tuple[Any, float]]) -> float:
    """The score of the most frequent (answer, score) pair; tied pairs share their mean score."""
    if not pairs:
        return 0.0
    counts = Counter(pairs)
    top = max(counts.values())
    tied = [score for (_, score), count in counts.items() if count == top]
    return sum(tied) / len(tied)


def compute_pass_majority_metrics(
    tasks: list[list[dict[str, Any]]],
    score_fn: ScoreFn | None = None,
    answer_key: str | None = None,
) -> tuple[dict[str, Any], TaskScores, list[str], int]:
    """pass@k, pass@1[avg-of-k], majority@k and run-to-run spread for every score, k = 1..max.

    ``score_fn(rollout)`` names the scores of one rollout (default ``{"accuracy": reward}``).
    With ``answer_key``, rollouts are also voted on by their answer (``majority@{k}/<score>``)
    and a ``no_answer`` score (1 when the answer is missing) is added. A binary score's pass@k
    is the unbiased estimator over all of a task's rollouts; another score's is the best of its
    first k. ``per_sample_aggregate`` maps each score to its per-run means (run r = every
    task's r-th rollout), and ``pass@1[avg-of-k]/<score>/std_dev_across_runs`` and
    ``.../std_err_across_runs`` are the spread of the first k runs.

    Returns ``(metrics, scores_per_task, score_names, max_k)``; the last three feed
    :func:`add_avg_sample_std_dev`.
    """
    if not tasks:
        return {}, [], [], 0
    score_fn = score_fn or (lambda rollout: {"accuracy": rollout["reward"]})
    scores, answers = _task_scores(tasks, score_fn, answer_key)
    names = sorted({name for task in scores for rollout in task for name in rollout})
    max_k = max(len(task) for task in tasks)
    metrics: dict[str, Any] = {}
    for k in range(1, max_k + 1):
        for name in names:
            passes, firsts, majorities = [], [], []
            for task, task_answers in zip(scores, answers, strict=True):
                values = [rollout[name] for rollout in task if name in rollout]
                if values and k <= len(values):
                    if all(v in (0, 1) for v in values):
                        passes.append(pass_at_k(len(values), sum(1 for v in values if v), k))
                    else:
                        passes.append(max(values[:k]))
                head = [rollout[name] for rollout in task[:k] if name in rollout]
                if head:
                    firsts.append(sum(head) / len(head))
                if answer_key is not None:
                    pairs = [
                        (a, r[name])
                        for a, r in zip(task_answers[:k], task[:k], strict=False)
                        if a is not None and name in r
                    ]
                    majorities.append(_majority_of(pairs))
            if passes:
                metrics[f"pass@{k}/{name}"] = 100.0 * sum(passes) / len(passes)
            if firsts:
                metrics[f"pass@1[avg-of-{k}]/{name}"] = 100.0 * sum(firsts) / len(firsts)
            if majorities:
                metrics[f"majority@{k}/{name}"] = 100.0 * sum(majorities) / len(majorities)

    per_run: dict[str, list[float]] = {}
    for run in range(max_k):
        for name in names:
            values = [task[run][name] for task in scores if run < len(task) and name in task[run]]
            if values:
                per_run.setdefault(name, []).append(100.0 * sum(values) / len(values))
    metrics["per_sample_aggregate"] = per_run
    for k in range(2, max_k + 1):
        for name in names:
            runs = per_run.get(name, [])[:k]
            if len(runs) >= 2:
                std_dev = statistics.stdev(runs)
                metrics[f"pass@1[avg-of-{k}]/{name}{STD_DEV_ACROSS_RUNS_SUFFIX}"] = std_dev
                metrics[f"pass@1[avg-of-{k}]/{name}{STD_ERR_ACROSS_RUNS_SUFFIX}"] = std_dev / math.sqrt(
                    len(runs)
                )
    return metrics, scores, names, max_k


def add_avg_sample_std_dev(
    metrics: dict[str, Any], all_score_dicts: TaskScores, score_names: list[str], max_k: int
) -> None:
    """Add ``pass@1[avg-of-k]/<score>/avg_sample_std_dev`` to ``metrics``: the mean over tasks of
    the standard deviation of each task's first k scores (the spread within a task)."""
    for k in range(2, max_k + 1):
        for name in score_names:
            spreads = [
                statistics.stdev(values)
                for task in all_score_dicts
                if len(values := [rollout[name] for rollout in task[:k] if name in rollout]) >= 2
            ]
            if spreads:
                metrics[f"pass@1[avg-of-{k}]/{name}{AVG_SAMPLE_STD_DEV_SUFFIX}"] = sum(spreads) / len(spreads)


def compute_subset_metrics(
    tasks: list[list[dict[str, Any]]],
    subset_key: str,
    score_fn: ScoreFn | None = None,
    answer_key: str | None = None,
) -> dict[str, Any]:
    """:func:`compute_pass_majority_metrics` per value of ``subset_key``, as ``<value>/<metric>``.

    A task's subset is the first truthy ``subset_key`` among its rollouts (a rollout that never
    ran may lack it); tasks without one are left out.
    """
    subsets: dict[Any, list[list[dict[str, Any]]]] = {}
    for rollouts in tasks:
        value = next((r[subset_key] for r in rollouts if r.get(subset_key)), None)
        if value:
            subsets.setdefault(value, []).append(rollouts)
    out: dict[str, Any] = {}
    for value, subset in subsets.items():
        metrics, _, _, _ = compute_pass_majority_metrics(subset, score_fn=score_fn, answer_key=answer_key)
        out.update({f"{value}/{key}": v for key, v in metrics.items() if key != "per_sample_aggregate"})
    return out


def highest_k_metrics(
    agent_metrics: Mapping[str, Any],
    pattern: str,
    score_names: list[str] | None = None,
    exclude_names: list[str] | None = None,
) -> dict[str, Any]:
    """The entries of ``agent_metrics`` matching ``pattern`` (``{k}`` marks k) at the largest k.

    ``highest_k_metrics(m, "pass@{k}", score_names=["accuracy"])`` gives ``{"pass@32/accuracy": ...}``
    when 32 is the largest k. Spread statistics (``.../std_dev_across_runs`` ...) are never
    returned; ``score_names`` keeps only those scores, ``exclude_names`` drops some.
    """
    regex = re.compile("^" + re.escape(pattern).replace(r"\{k\}", r"(\d+)") + "/(.+)$")
    found: list[tuple[int, str]] = []
    for key in agent_metrics:
        match = regex.match(key)
        if not match or match.group(2).endswith(tuple(s.lstrip("/") for s in _STAT_SUFFIXES)):
            continue
        name = match.group(2)
        if (score_names is not None and name not in score_names) or (exclude_names and name in exclude_names):
            continue
        found.append((int(match.group(1)), key))
    if not found:
        return {}
    top = max(k for k, _ in found)
    return {key: agent_metrics[key] for k, key in found if k == top}


class AggregateMetricsMixin:
    """The hooks a NeMo Gym server overrides to shape its ``/aggregate_metrics`` answer."""

    def compute_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """Extra metrics over the whole run (``tasks[i]``: task i's verify answers), merged into
        ``agent_metrics``. Default: none."""
        return {}

    def compute_repeat_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """Extra metrics of one repeat (run) alone. Default: none."""
        return {}

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        """The headline metrics. Default: every ``mean/*`` entry."""
        return {k: v for k, v in agent_metrics.items() if k.startswith("mean/")}


def _by_task(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows grouped by ``_ng_task_index`` (tasks in index order, rollouts in rollout order)."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get("_ng_task_index", 0), []).append(row)
    return [
        sorted(groups[key], key=lambda r: r.get("_ng_rollout_index", 0) or 0)
        for key in sorted(groups, key=str)
    ]


def compute_aggregate_metrics(
    verify_responses: list[dict[str, Any]],
    compute_metrics_fn: Callable[[list[list[dict[str, Any]]]], dict[str, Any]] | None = None,
    get_key_metrics_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    compute_repeat_metrics_fn: Callable[[list[list[dict[str, Any]]]], dict[str, Any]] | None = None,
) -> AggregateMetrics:
    """NeMo Gym's ``/aggregate_metrics`` computation with an environment's own hooks.

    Our metrics (:func:`nemo_gym.collection.metrics.compute_aggregate_metrics`) first; then
    ``compute_metrics_fn(tasks)`` is merged into ``agent_metrics`` (a ``per_task_metrics``
    entry, ``{task_index: {...}}``, goes into the matching group-level rows);
    ``compute_repeat_metrics_fn(tasks)`` runs once per repeat (rollout index), and each metric
    finite in every repeat gets ``mean_across_repeats/<name>`` and ``std_across_repeats/<name>``;
    ``key_metrics`` is ``get_key_metrics_fn(agent_metrics)`` when given.
    """
    from nemo_gym.collection.field_stats import add_field_stats
    from nemo_gym.collection.metrics import compute_aggregate_metrics as our_metrics
    from nemo_gym.config_types import AggregateMetrics

    if not verify_responses:
        return AggregateMetrics()
    metrics = our_metrics(verify_responses)
    agent_metrics: dict[str, Any] = metrics["agent_metrics"]
    if compute_metrics_fn is not None:
        custom = dict(compute_metrics_fn(_by_task(verify_responses)) or {})
        per_task = custom.pop("per_task_metrics", None)
        if isinstance(per_task, dict):
            for group in metrics["group_level_metrics"]:
                group.update(per_task.get(group.get("_ng_task_index"), {}))
        agent_metrics.update(custom)
    add_field_stats(metrics, verify_responses, compute_repeat_metrics_fn)
    key_metrics = (
        get_key_metrics_fn(agent_metrics) if get_key_metrics_fn is not None else metrics["key_metrics"]
    )
    return AggregateMetrics(
        agent_metrics=agent_metrics,
        key_metrics=key_metrics,
        group_level_metrics=metrics["group_level_metrics"],
        repeat_level_metrics=metrics["repeat_level_metrics"],
    )
