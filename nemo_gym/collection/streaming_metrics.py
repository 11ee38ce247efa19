"""Aggregate metrics computed as verify answers arrive, in memory that grows by bytes per row.

:class:`MetricsAccumulator` gives exactly what :func:`nemo_gym.collection.metrics.compute_aggregate_metrics`
gives for the same rows (same keys, same floats), but keeps each row as a few machine numbers
in flat arrays instead of Python objects: a million rows cost tens of MB, not gigabytes.
:func:`write_metrics_answer` writes the answer as JSON to a binary file without ever building
``group_level_metrics`` (one entry per task) as a list.

Pure like :mod:`nemo_gym.collection.metrics`: no I/O beyond the file handed in, no third-party imports
but orjson.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import orjson

from nemo_gym.collection.metrics import (
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    _as_number,
    _check_ks,
    _hashable,
    add_task_estimates,
    extract_numeric_fields,
    score_metrics,
    select_key_metrics,
)

_NAN = float("nan")
_NO_ID = -1  # "absent" in the integer columns (no task index, no rollout index, no answer)


def _present(values: Iterable[float]) -> Iterator[float]:
    return (v for v in values if v == v)  # NaN marks a row without this field


class _Interner:
    """Hashable values ↔ small integer ids, in first-seen order."""

    def __init__(self) -> None:
        self.ids: dict[Hashable, int] = {}
        self.values: list[Any] = []

    def id_of(self, key: Hashable, value: Any) -> int:
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = len(self.values)
            self.values.append(value)
        return found


class MetricsAccumulator:
    """Feed verify answers one at a time with :meth:`add`; read the metrics with :meth:`result`
    or stream them with :func:`write_metrics_answer`.

    Arguments are those of :func:`nemo_gym.collection.metrics.compute_aggregate_metrics`. Per row it keeps
    one float per numeric field (NaN where the row lacks it), its task, its rollout order and
    index and (with ``answer_field``) its answer as integers. Task indices that are
    non-negative integers (what the collector writes) are stored as they are; any other task
    index switches to an id table (first-seen order) that costs a dict entry per task.
    """

    def __init__(
        self,
        *,
        score_fields: Sequence[str] = ("reward",),
        answer_field: str | None = None,
        ks: Iterable[int] | None = None,
    ) -> None:
        if isinstance(score_fields, str):
            score_fields = (score_fields,)
        self.score_fields = tuple(score_fields)
        self.answer_field = answer_field
        self.ks = _check_ks(ks)
        self.count = 0
        self._fields: dict[str, array[float]] = {}
        self._tasks: array[int] = array("q")  # task index, or task id once _task_ids is set
        self._task_ids: _Interner | None = None
        self._order_kind: array[int] = array("b")
        self._order_value: array[float] = array("d")
        self._rollout_ids: array[int] = array("q")
        self._rollout_index = _Interner()
        self._answer_ids: array[int] = array("q")
        self._answers = _Interner()

    # ---- feeding -------------------------------------------------------------------------
    def add(self, row: Mapping[str, Any]) -> None:
        """Take one verify answer into account."""
        position = self.count
        fields = extract_numeric_fields(row)
        for name in self.score_fields:
            # A bool score (e.g. ``is_correct``) is a 0/1 score, though bools are not fields.
            if name not in fields and isinstance(row.get(name), bool):
                fields[name] = float(row[name])
        for name, value in fields.items():
            column = self._fields.get(name)
            if column is None:
                column = self._fields[name] = array("d", [_NAN]) * position
            column.append(value)
        for column in self._fields.values():
            if len(column) == position:
                column.append(_NAN)

        rollout_index = row.get(ROLLOUT_INDEX_KEY)
        if type(rollout_index) is int:
            self._order_kind.append(0)
            self._order_value.append(rollout_index)
        else:
            numeric = _as_number(rollout_index)
            self._order_kind.append(0 if numeric is not None else 1)
            self._order_value.append(numeric if numeric is not None else 0.0)
        self._rollout_ids.append(
            _NO_ID
            if rollout_index is None
            else self._rollout_index.id_of(_hashable(rollout_index), rollout_index)
        )
        if self.answer_field is not None:
            answer = row.get(self.answer_field)
            self._answer_ids.append(
                _NO_ID if answer is None else self._answers.id_of(_hashable(answer), answer)
            )

        task_index = row.get(TASK_INDEX_KEY)
        if task_index is None:
            self._tasks.append(_NO_ID)
        elif self._task_ids is None and type(task_index) is int and 0 <= task_index < 2**62:
            self._tasks.append(task_index)
        else:
            if self._task_ids is None:
                self._switch_to_task_ids()
            assert self._task_ids is not None
            self._tasks.append(self._task_ids.id_of(_hashable(task_index), task_index))
        self.count += 1

    def _switch_to_task_ids(self) -> None:
        interner = _Interner()
        for position, task in enumerate(self._tasks):
            if task != _NO_ID:
                self._tasks[position] = interner.id_of(task, task)
        self._task_ids = interner

    # ---- reading -------------------------------------------------------------------------
    def _groups(self) -> Iterator[tuple[Any, list[int]]]:
        """(task index, row positions in rollout order) per task, tasks sorted, ungrouped rows last."""
        tasks = self._tasks
        grouped = [t for t in tasks if t != _NO_ID]
        if self._task_ids is None and grouped and max(grouped) > 4 * len(tasks) + 1024:
            self._switch_to_task_ids()  # sparse indices: a table of ids beats a huge count array
        del grouped
        if self._task_ids is None:
            rank_of_slot: array[int] | None = None
            labels: list[Any] | None = None
            slots = (max((t for t in tasks if t != _NO_ID), default=-1)) + 1
        else:
            labels = self._task_ids.values
            order = list(range(len(labels)))
            try:
                order.sort(key=labels.__getitem__)
            except TypeError:
                pass  # task indices of mixed types: left as the sort left them, as the list version does
            rank_of_slot = array("q", [0]) * len(labels)
            for rank, slot in enumerate(order):
                rank_of_slot[slot] = rank
            slots = len(labels)
        # Counting sort of row positions by task rank: flat arrays, no per-row objects.
        starts = array("q", [0]) * (slots + 1)
        for task in tasks:
            if task != _NO_ID:
                starts[(rank_of_slot[task] if rank_of_slot is not None else task) + 1] += 1
        for slot in range(slots):
            starts[slot + 1] += starts[slot]
        fill = array("q", starts)
        rows = array("q", [0]) * starts[slots]
        for position, task in enumerate(tasks):
            if task != _NO_ID:
                rank = rank_of_slot[task] if rank_of_slot is not None else task
                rows[fill[rank]] = position
                fill[rank] += 1
        del fill
        slot_of_rank = None
        if rank_of_slot is not None:
            slot_of_rank = array("q", [0]) * slots
            for slot, rank in enumerate(rank_of_slot):
                slot_of_rank[rank] = slot
        kinds, values = self._order_kind, self._order_value
        for rank in range(slots):
            start, end = starts[rank], starts[rank + 1]
            if start == end:
                continue
            members = list(rows[start:end])
            if len(members) > 1:
                members.sort(key=lambda p: (kinds[p], values[p], p))
            label = labels[slot_of_rank[rank]] if labels is not None and slot_of_rank is not None else rank
            yield label, members
        for position, task in enumerate(tasks):
            if task == _NO_ID:
                yield None, [position]

    def _score_metrics(self, score: str) -> dict[str, float]:
        column = self._fields[score]
        binary = all(v == 0.0 or v == 1.0 for v in column if v == v)
        with_majority = self.answer_field is not None and any(
            self._answer_ids[p] != _NO_ID for p in range(self.count) if column[p] == column[p]
        )
        k_values = self.ks
        if k_values is None:
            smallest = min(self._task_sizes(column), default=0)
            k_values = list(range(1, smallest + 1))
        pass_by_k = {k: array("d") for k in k_values}
        avg_by_k = {k: array("d") for k in k_values}
        majority_by_k = {k: array("d") for k in k_values}
        run_keys: dict[Hashable, int] = {}
        run_values: list[array[float]] = []
        binary_cache: dict[tuple[int, int, int], float] = {}
        rollout_values = self._rollout_index.values
        for _, members in self._groups():
            scored: list[tuple[float, Hashable | None]] = []
            for position, row in enumerate(members):
                value = column[row]
                if value != value:
                    continue
                answer_id = self._answer_ids[row] if self.answer_field is not None else _NO_ID
                scored.append((value, None if answer_id == _NO_ID else answer_id))
                rollout_id = self._rollout_ids[row]
                run = _hashable(rollout_values[rollout_id]) if rollout_id != _NO_ID else position
                slot = run_keys.get(run)
                if slot is None:
                    slot = run_keys[run] = len(run_values)
                    run_values.append(array("d"))
                run_values[slot].append(value)
            if not scored:
                continue
            add_task_estimates(
                scored, k_values, binary, with_majority, binary_cache, pass_by_k, avg_by_k, majority_by_k
            )
        if not run_values:
            return {}
        return score_metrics(
            score, k_values, pass_by_k, avg_by_k, majority_by_k if with_majority else None, run_values
        )

    def _task_sizes(self, column: array[float]) -> Iterator[int]:
        """Per task, how many of its rows carry ``column`` (tasks with none skipped)."""
        for _, members in self._groups():
            n = sum(1 for p in members if column[p] == column[p])
            if n:
                yield n

    def agent_and_key_metrics(self) -> tuple[dict[str, float], dict[str, float]]:
        """``agent_metrics`` and ``key_metrics`` over every row added so far."""
        agent_metrics: dict[str, float] = {}
        for name in sorted(self._fields):
            column = self._fields[name]
            count = sum(1 for v in column if v == v)  # NaN marks a row without this field
            mean = math.fsum(_present(column)) / count
            agent_metrics[f"mean/{name}"] = mean
            agent_metrics[f"max/{name}"] = max(_present(column))
            agent_metrics[f"min/{name}"] = min(_present(column))
            agent_metrics[f"std/{name}"] = (
                math.sqrt(math.fsum((v - mean) ** 2 for v in _present(column)) / (count - 1))
                if count >= 2
                else 0.0
            )
        for score in self.score_fields:
            if score in self._fields:
                agent_metrics.update(self._score_metrics(score))
        return agent_metrics, select_key_metrics(agent_metrics, self.score_fields)

    def group_level_metrics(self) -> Iterator[dict[str, Any]]:
        """One entry per task, in task order: ``_ng_task_index``, ``count``, ``mean/<field>``."""
        names = sorted(self._fields)
        columns = [self._fields[name] for name in names]
        for label, members in self._groups():
            entry: dict[str, Any] = {TASK_INDEX_KEY: label, "count": len(members)}
            for name, column in zip(names, columns, strict=True):
                values = [column[p] for p in members if column[p] == column[p]]
                if values:
                    entry[f"mean/{name}"] = math.fsum(values) / len(values)
            yield entry

    def result(self) -> dict[str, Any]:
        """The whole answer as one dict (``group_level_metrics`` as a list: for small inputs)."""
        agent_metrics, key_metrics = self.agent_and_key_metrics()
        return {
            "agent_metrics": agent_metrics,
            "key_metrics": key_metrics,
            "group_level_metrics": list(self.group_level_metrics()),
        }


def write_metrics_answer(
    sink: BinaryIO,
    accumulator: MetricsAccumulator,
    key_metrics: Any = None,
) -> None:
    """Write ``{"agent_metrics", "key_metrics", "group_level_metrics"}`` as JSON to ``sink``,
    ``group_level_metrics`` one entry at a time. ``key_metrics(agent_metrics, default)``, when
    given, chooses the key metrics (a resources server's ``get_key_metrics``)."""
    agent_metrics, default_key_metrics = accumulator.agent_and_key_metrics()
    chosen = key_metrics(agent_metrics, default_key_metrics) if key_metrics else default_key_metrics
    sink.write(b'{"agent_metrics":' + orjson.dumps(agent_metrics))
    sink.write(b',"key_metrics":' + orjson.dumps(chosen) + b',"group_level_metrics":[')
    separator = b""
    for entry in accumulator.group_level_metrics():
        sink.write(separator + orjson.dumps(entry))
        separator = b","
    sink.write(b"]}")
