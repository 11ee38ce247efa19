"""One collection as the viewer sees it: the rollouts index, per-task statistics, side files.

:class:`Collection` wraps a :class:`~nemo_gym.viewer.index.RowIndex` over ``x.jsonl`` and
reads the collector's side files beside it (``x_failures.jsonl``, ``x_aggregate_metrics.json``,
``x_materialized_inputs.jsonl`` for progress). Per-task statistics are kept in memory (one small
record per task, never the rows) and updated as the index grows, so every page answers from
them: :meth:`Collection.overview`, :meth:`Collection.tasks`, :meth:`Collection.rollout` and
:func:`nemo_gym.viewer.compare.compare`.

A task is *solved* by a rollout whose reward is at least ``solved_threshold`` (1.0 by
default: NeMo Gym's binary rewards). pass@k uses the unbiased estimator of
:func:`nemo_gym.collection.metrics.pass_at_k` over each task's repeats.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from nemo_gym.collection.collection_io import ERROR_KEY, FAILURE_CLASS_KEY, CollectionPaths
from nemo_gym.collection.metrics import is_percent_metric
from nemo_gym.viewer.charts import histogram, mean, pass_at_k_curve, sorted_pass_rates
from nemo_gym.viewer.index import FLAG_BAD_LINE, FLAG_TOKEN_IDS, RowIndex

__all__ = ["Collection", "TaskStats", "ViewerInputError", "TASK_STATUSES"]

TASK_STATUSES: Final = ("any", "failed", "never", "always", "mixed")
_MAX_PLOT_POINTS: Final = 400
MAX_PAGE: Final = 500
_FAILURE_SAMPLES: Final = 50  # failure records shown on the Overview (the counts cover them all)


class ViewerInputError(ValueError):
    """A request names something that is not there (row, task, filter); answered with a JSON 4xx."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass(slots=True)
class TaskStats:
    """One task's repeats, summarized. ``first_row``/``last_row`` anchor the chain of its rows
    (see :attr:`Collection.next_row`)."""

    task: int
    agent: int
    n: int = 0
    scored: int = 0
    total: float = 0.0
    solved: int = 0
    first_row: int = -1
    last_row: int = -1

    @property
    def mean(self) -> float | None:
        """Mean reward over the repeats that have a reward (None when none has)."""
        return self.total / self.scored if self.scored else None


@dataclass(slots=True)
class AgentStats:
    """One agent's rollouts, kept current row by row. ``groups`` counts tasks by
    ``(scored repeats, solved repeats)``: all that pass@k and the pass-rate plot need."""

    rollouts: int = 0
    tasks: int = 0
    scored: int = 0
    total: float = 0.0
    groups: Counter[tuple[int, int]] = field(default_factory=Counter)


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


@dataclass
class _SideFileCache:
    stat: tuple[int, int] = (-1, -1)
    value: Any = None


@dataclass
class Collection:
    """A rollouts file and its side files, indexed and summarized; see the module docstring."""

    path: Path
    index: RowIndex
    solved_threshold: float = 1.0
    tasks_by_key: dict[int, TaskStats] = field(default_factory=dict)
    next_row: Any = None  # array: the next row of the same task, -1 at the end of a chain
    reward_counts: Counter[float] = field(default_factory=Counter)
    agent_stats: dict[int, AgentStats] = field(default_factory=dict)
    token_rows: int = 0
    bad_rows: int = 0
    version: int = 0  # bumped whenever rows are added or the file is re-read
    _compare_cache: dict[tuple[int, int, int], dict[str, Any]] = field(default_factory=dict)
    _side: dict[str, _SideFileCache] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | Path, solved_threshold: float = 1.0) -> Collection:
        """Index (or load the index of) ``path`` and summarize it.

        Raises:
            ViewerInputError: when ``path`` is not a file.
        """
        path = Path(path)
        if not path.is_file():
            raise ViewerInputError(f"+input: rollouts file {path} does not exist", 404)
        index = RowIndex.open(path)
        collection = cls(path=path, index=index, solved_threshold=solved_threshold)
        collection._on_rows(0, True)
        index.on_rows(collection._on_rows)
        return collection

    @property
    def paths(self) -> CollectionPaths:
        """The collector's side-file names for this results file."""
        return CollectionPaths.for_output(self.path)

    def refresh(self) -> int:
        """Pick up rows appended since the last call (a running collection); returns how many."""
        return self.index.refresh()

    # ---- summaries -----------------------------------------------------------------------
    def _on_rows(self, start: int, reset: bool) -> None:
        from array import array

        self.version += 1
        if reset:
            self.tasks_by_key, self.reward_counts, start = {}, Counter(), 0
            self.agent_stats = {}
            self.token_rows = self.bad_rows = 0
            self.next_row = array("q")
        cols = self.index.columns
        tasks, rewards, agents, flags = cols["task"], cols["reward"], cols["agent"], cols["flags"]
        by_key, next_row = self.tasks_by_key, self.next_row
        counts: dict[float, int] = {}
        agent_stats = self.agent_stats
        threshold = self.solved_threshold
        end = len(self.index)
        next_row.extend([-1] * (end - start))
        for row in range(start, end):
            key = tasks[row]
            stats = by_key.get(key)
            if stats is None:
                stats = by_key[key] = TaskStats(task=key, agent=agents[row], first_row=row)
                agent = agent_stats.get(stats.agent)
                if agent is None:
                    agent = agent_stats[stats.agent] = AgentStats()
                agent.tasks += 1
            else:
                next_row[stats.last_row] = row
            stats.last_row = row
            stats.n += 1
            reward = rewards[row]
            if reward == reward:  # not NaN
                stats.scored += 1
                stats.total += reward
                if reward >= threshold:
                    stats.solved += 1
                counts[reward] = counts.get(reward, 0) + 1
            if flags[row]:
                self.token_rows += bool(flags[row] & FLAG_TOKEN_IDS)
                self.bad_rows += bool(flags[row] & FLAG_BAD_LINE)
        for reward, count in counts.items():
            self.reward_counts[round(reward, 3)] += count
        # Per-agent totals from the tasks (one pass over tasks, not rows).
        for agent in agent_stats.values():
            agent.rollouts = agent.scored = 0
            agent.total = 0.0
            agent.groups = Counter()
        for stats in by_key.values():
            agent = agent_stats[stats.agent]
            agent.rollouts += stats.n
            if stats.scored:
                agent.scored += stats.scored
                agent.total += stats.total
                agent.groups[(stats.scored, stats.solved)] += 1

    def rows_of(self, stats: TaskStats) -> list[int]:
        """The row numbers of a task's repeats, in file order."""
        rows, row = [], stats.first_row
        while row != -1:
            rows.append(row)
            row = self.next_row[row]
        return rows

    def failures(self) -> dict[str, Any]:
        """The failures sidecar: counts by ``_ng_failure_class`` and by task (streamed, cached
        while the file's size and mtime stay the same)."""

        def read(path: Path) -> dict[str, Any]:
            by_class: Counter[str] = Counter()
            by_task: Counter[int] = Counter()
            samples: list[dict[str, Any]] = []
            with path.open("rb") as source:
                for line in source:
                    if not line.strip():
                        continue
                    try:
                        record = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        by_class["malformed_failure_record"] += 1
                        continue
                    if not isinstance(record, dict):
                        continue
                    failure_class = str(record.get(FAILURE_CLASS_KEY) or "unclassified")
                    by_class[failure_class] += 1
                    task = record.get("_ng_task_index")
                    if isinstance(task, int):
                        by_task[task] += 1
                    if len(samples) < _FAILURE_SAMPLES:
                        samples.append(
                            {
                                "task": task,
                                "rollout": record.get("_ng_rollout_index"),
                                "class": failure_class,
                                "error": str(record.get(ERROR_KEY) or "")[:500],
                            }
                        )
            return {
                "by_class": dict(by_class.most_common()),
                "by_task": by_task,
                "total": by_class.total(),
                "samples": samples,
            }

        return self._side_file("failures", self.paths.failures, read) or {
            "by_class": {},
            "by_task": Counter(),
            "total": 0,
            "samples": [],
        }

    def metrics_file(self) -> list[dict[str, Any]] | None:
        """``x_aggregate_metrics.json`` (key metrics per agent, each metric's unit: ``%`` for
        pass@k and majority@k, which the file keeps in percent, else ``""``), or None when absent
        or unreadable."""

        def read(path: Path) -> list[dict[str, Any]] | None:
            try:
                data = orjson.loads(path.read_bytes())
            except orjson.JSONDecodeError:
                return None
            if not isinstance(data, list):
                return None
            entries = []
            for entry in data:
                if not isinstance(entry, dict):
                    continue
                metrics = entry.get("key_metrics") or {}
                units = {k: "%" if is_percent_metric(str(k)) else "" for k in metrics}
                entries.append({"agent_ref": entry.get("agent_ref"), "key_metrics": metrics, "units": units})
            return entries

        return self._side_file("metrics", self.paths.aggregate_metrics, read)

    def expected_rows(self) -> int | None:
        """How many rollouts the collection will make (lines of its materialized inputs)."""

        def read(path: Path) -> int:
            count = 0
            with path.open("rb") as source:
                while chunk := source.read(1 << 20):
                    count += chunk.count(b"\n")
            return count

        return self._side_file("materialized", self.paths.materialized_inputs, read)

    def _side_file(self, name: str, path: Path, read: Any) -> Any:
        try:
            stat = os.stat(path)
        except OSError:
            return None
        cache = self._side.setdefault(name, _SideFileCache())
        key = (stat.st_size, stat.st_mtime_ns)
        if cache.stat != key:
            cache.value, cache.stat = read(path), key
        return cache.value

    # ---- pages ---------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Name, size and row count (the collection picker and the progress line)."""
        failures = self.failures()
        expected = self.expected_rows()
        try:
            modified_s_ago: float | None = max(0.0, time.time() - self.path.stat().st_mtime)
        except OSError:
            modified_s_ago = None
        return {
            "path": str(self.path),
            "name": self.path.name,
            "rows": len(self.index),
            "bytes": self.index.indexed_bytes,
            "failures": failures["total"],
            "expected": expected,
            "complete": expected is not None and len(self.index) + failures["total"] >= expected,
            "modified_s_ago": modified_s_ago,
        }

    def overview(self) -> dict[str, Any]:
        """Rollouts, failures by class, per-agent mean reward and pass@k, and the plots' data."""
        failures = self.failures()
        names = self.index.agents
        agents = []
        overall: Counter[tuple[int, int]] = Counter()
        for agent_id, agent in sorted(self.agent_stats.items(), key=lambda kv: names[kv[0]]):
            overall.update(agent.groups)
            agents.append(
                {
                    "agent": names[agent_id] or "(no agent_ref)",
                    "rollouts": agent.rollouts,
                    "tasks": agent.tasks,
                    "mean_reward": agent.total / agent.scored if agent.scored else None,
                    "pass_at_k": pass_at_k_curve(agent.groups),
                    "solved_never": sum(t for (n, c), t in agent.groups.items() if c == 0),
                    "solved_always": sum(t for (n, c), t in agent.groups.items() if c == n),
                }
            )
        return {
            **self.summary(),
            "failures_by_class": failures["by_class"],
            "failure_samples": failures["samples"],
            "agents": agents,
            "reward_histogram": histogram(self.reward_counts),
            "task_pass_rates": sorted_pass_rates(overall, _MAX_PLOT_POINTS),
            "num_tasks": len(self.tasks_by_key),
            "pass_at_k": pass_at_k_curve(overall),
            "mean_reward": mean(self.reward_counts),
            "rows_with_token_ids": self.token_rows,
            "bad_lines": self.bad_rows,
            "metrics_file": self.metrics_file(),
            "provenance": self.provenance(),
        }

    def provenance(self) -> dict[str, Any]:
        """What the collection was made from (its run lock, summarised) and, for a submitted
        collection, its ``gym eval submit`` record (``gym-job.json`` two levels up)."""
        from nemo_gym.collection.run_lock import lock_path

        out: dict[str, Any] = {"lock": None, "job": None}
        lock_file = lock_path(self.path)
        if lock_file.is_file():
            try:
                lock = orjson.loads(lock_file.read_bytes())
                out["lock"] = {
                    "path": str(lock_file),
                    "package_version": lock.get("package_version"),
                    "model": lock.get("model") or {},
                    "data_file": {
                        k: v for k, v in (lock.get("data_file") or {}).items() if k != "line_digests"
                    },
                    "folders": {name: len(files) for name, files in (lock.get("folders") or {}).items()},
                    "overrides": len(lock.get("overrides") or []),
                }
            except (orjson.JSONDecodeError, OSError, AttributeError):
                out["lock"] = {"path": str(lock_file), "error": "unreadable"}
        manifest = self.path.parent.parent.parent / "gym-job.json"
        if self.path.parent.name == "artifacts" and manifest.is_file():
            try:
                out["job"] = orjson.loads(manifest.read_bytes())
            except (orjson.JSONDecodeError, OSError):
                out["job"] = None
        return out

    def task_record(self, stats: TaskStats, with_rows: bool = True) -> dict[str, Any]:
        """One line of the Tasks page: the task, its agent, repeats' rewards and rows, snippet."""
        rewards = self.index.columns["reward"]
        rows = self.rows_of(stats) if with_rows else []
        return {
            "task": stats.task,
            "agent": self.index.agents[stats.agent] or "(no agent_ref)",
            "n": stats.n,
            "mean_reward": stats.mean,
            "solved": stats.solved,
            "rows": rows,
            "rewards": [_number(rewards[row]) for row in rows],
            "prompt": self.index.snippets.get(stats.task, ""),
        }

    def tasks(
        self,
        *,
        agent: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        status: str = "any",
        search: str = "",
        sort: str = "task",
        offset: int = 0,
        limit: int = 100,
    ) -> dict[str, Any]:
        """The Tasks page: tasks matching every filter, sorted, one page of them.

        ``status``: ``failed`` (a rollout of it is in the failures file), ``never`` (no repeat
        solved), ``always`` (every repeat solved), ``mixed``, or ``any``. ``min_reward`` /
        ``max_reward`` bound the task's mean reward. ``search`` matches the prompt snippet
        (case-insensitive). ``sort``: ``task``, ``reward`` or ``-reward``.

        Raises:
            ViewerInputError: for an unknown status, sort or agent, or a bad page.
        """
        if status not in TASK_STATUSES:
            raise ViewerInputError(f"status must be one of {', '.join(TASK_STATUSES)}; got {status!r}")
        if sort not in ("task", "reward", "-reward"):
            raise ViewerInputError(f"sort must be task, reward or -reward; got {sort!r}")
        if offset < 0 or not 1 <= limit <= MAX_PAGE:
            raise ViewerInputError(f"offset must be >= 0 and limit between 1 and {MAX_PAGE}")
        agent_id: int | None = None
        if agent:
            names = {name or "(no agent_ref)": i for i, name in enumerate(self.index.agents)}
            if agent not in names:
                raise ViewerInputError(f"no agent {agent!r} in this collection; agents: {sorted(names)}")
            agent_id = names[agent]
        failed_tasks = self.failures()["by_task"] if status == "failed" else None
        needle = search.lower().strip()
        snippets = self.index.snippets
        selected: list[TaskStats] = []
        for stats in self.tasks_by_key.values():
            if agent_id is not None and stats.agent != agent_id:
                continue
            mean = stats.mean
            if min_reward is not None and (mean is None or mean < min_reward):
                continue
            if max_reward is not None and (mean is None or mean > max_reward):
                continue
            if failed_tasks is not None and not failed_tasks.get(stats.task):
                continue
            if status == "never" and (not stats.scored or stats.solved):
                continue
            if status == "always" and (not stats.scored or stats.solved != stats.scored):
                continue
            if status == "mixed" and not 0 < stats.solved < stats.scored:
                continue
            if needle and needle not in snippets.get(stats.task, "").lower():
                continue
            selected.append(stats)
        if failed_tasks is not None:
            # Tasks whose every rollout failed have no row at all; list them too.
            known = set(self.tasks_by_key)
            for task in failed_tasks:
                if task not in known and agent_id is None and not needle and min_reward is None:
                    selected.append(TaskStats(task=task, agent=-1))
        if sort == "task":
            selected.sort(key=lambda s: s.task)
        else:
            sign = -1 if sort == "-reward" else 1
            selected.sort(key=lambda s: (s.mean is None, sign * (s.mean or 0.0), s.task))
        page = selected[offset : offset + limit]
        failures = self.failures()["by_task"]
        records = []
        for stats in page:
            if stats.agent == -1:
                records.append(
                    {
                        "task": stats.task,
                        "agent": "",
                        "n": 0,
                        "mean_reward": None,
                        "solved": 0,
                        "rows": [],
                        "rewards": [],
                        "prompt": "",
                        "failures": failures.get(stats.task, 0),
                    }
                )
            else:
                records.append({**self.task_record(stats), "failures": failures.get(stats.task, 0)})
        return {"total": len(selected), "offset": offset, "limit": limit, "tasks": records}

    def rollout(self, row: int) -> dict[str, Any]:
        """The Rollout page: row ``row`` in full and its task's other repeats.

        Raises:
            ViewerInputError: (404) when there is no such row.
        """
        if not 0 <= row < len(self.index):
            raise ViewerInputError(f"no row {row}: {self.path.name} has {len(self.index)} rows", 404)
        cols = self.index.columns
        stats = self.tasks_by_key[cols["task"][row]]
        repeats = [
            {"row": r, "rollout_index": cols["rollout"][r], "reward": _number(cols["reward"][r])}
            for r in self.rows_of(stats)
        ]
        return {
            "row": row,
            "rows": len(self.index),
            "task": stats.task if stats.task >= 0 else None,
            "agent": self.index.agents[cols["agent"][row]],
            "has_token_ids": bool(cols["flags"][row] & FLAG_TOKEN_IDS),
            "repeats": repeats,
            "data": self.index.read_row(row),
        }
