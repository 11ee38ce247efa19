"""Statistics of verify responses' own numeric fields, under NeMo Gym's names.

NeMo Gym's ``/aggregate_metrics`` describes every rollout by its numbers: the top-level numeric
entries of ``response.usage`` (``input_tokens``, ``output_tokens``, ...) and the row's own
top-level numeric fields (not those starting with ``_``; a bool counts as 0/1). It summarises
them per task (``group_level_metrics``), over the whole run (``agent_metrics``) and, when a run
has more than one repeat, per repeat (``repeat_level_metrics``, built by
:mod:`nemo_gym.collection.repeat_metrics`), as ``mean/<field>``,
``median/``, ``std/`` (ddof=1, 0 for one value), ``min/`` and ``max/``. Environments read those
keys (``mean/output_tokens`` per group, for example).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from nemo_gym.collection.collection_io import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from nemo_gym.collection.repeat_metrics import repeat_level_metrics

STATS = ("mean", "median", "std", "min", "max")


def row_fields(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers NeMo Gym profiles in one verify response (see the module docstring)."""
    response = row.get("response")
    usage = response.get("usage") if isinstance(response, Mapping) else None
    items = [*(usage.items() if isinstance(usage, Mapping) else ()), *row.items()]
    fields: dict[str, float] = {}
    for key, value in items:
        if key.startswith("_") or key == "response":
            continue
        if isinstance(value, bool):
            fields[key] = int(value)
        elif isinstance(value, int | float) and math.isfinite(value):
            fields[key] = value
    return fields


def describe(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """``<stat>/<field>`` for every field any of ``rows`` has, over the rows that have it."""
    values: dict[str, list[float]] = {}
    for row in rows:
        for name, value in row_fields(row).items():
            values.setdefault(name, []).append(value)
    out: dict[str, float] = {}
    for name in sorted(values):
        numbers = values[name]
        out[f"mean/{name}"] = statistics.fmean(numbers)
        out[f"median/{name}"] = statistics.median(numbers)
        out[f"std/{name}"] = statistics.stdev(numbers) if len(numbers) > 1 else 0.0
        out[f"min/{name}"] = min(numbers)
        out[f"max/{name}"] = max(numbers)
    return out


def _by_task(rows: Iterable[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get(TASK_INDEX_KEY, 0), []).append(row)
    return [
        sorted(groups[k], key=lambda r: r.get(ROLLOUT_INDEX_KEY, 0) or 0) for k in sorted(groups, key=str)
    ]


def _agent_name(row: Mapping[str, Any]) -> str:
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) else ""


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def add_field_stats(
    metrics: dict[str, Any],
    rows: Sequence[Mapping[str, Any]],
    compute_repeat_metrics: Callable[[list[list[Any]]], Mapping[str, Any] | None] | None = None,
) -> None:
    """Add NeMo Gym's field statistics to ``metrics`` (``agent_metrics``, ``group_level_metrics``
    keyed by ``_ng_task_index``), never replacing a key already there, and set its
    ``repeat_level_metrics``. With ``compute_repeat_metrics(tasks)`` (an environment's hook, run
    once per repeat on that repeat's rows grouped by task), each metric finite in every repeat
    goes into each repeat's entry and gets ``mean_across_repeats/<name>`` and
    ``std_across_repeats/<name>`` in ``agent_metrics``."""
    agent = metrics.setdefault("agent_metrics", {})
    by_task: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(row.get(TASK_INDEX_KEY), []).append(row)
    for group in metrics.get("group_level_metrics") or []:
        for key, value in describe(by_task.get(group.get(TASK_INDEX_KEY), [])).items():
            group.setdefault(key, value)
    for key, value in describe(rows).items():
        agent.setdefault(key, value)
    repeats = repeat_level_metrics(rows)
    by_repeat: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_repeat.setdefault(row.get(ROLLOUT_INDEX_KEY, 0), []).append(row)
    for entry in repeats:
        who = entry.get("agent_ref", {}).get("name")
        mine = [r for r in by_repeat.get(entry[ROLLOUT_INDEX_KEY], []) if _agent_name(r) == who]
        for key, value in describe(mine).items():
            entry.setdefault(key, value)
    if compute_repeat_metrics is not None:
        order = sorted(by_repeat, key=lambda i: (str(type(i)), i))
        per_repeat = {i: dict(compute_repeat_metrics(_by_task(by_repeat[i])) or {}) for i in order}
        for name in sorted({n for m in per_repeat.values() for n in m}):
            values = [m.get(name) for m in per_repeat.values()]
            if not all(_finite(v) for v in values):
                continue
            numbers = [float(v) for v in values]  # type: ignore[arg-type]
            agent[f"mean_across_repeats/{name}"] = statistics.fmean(numbers)
            agent[f"std_across_repeats/{name}"] = statistics.stdev(numbers) if len(numbers) > 1 else 0.0
            for entry in repeats:
                found = per_repeat.get(entry[ROLLOUT_INDEX_KEY], {}).get(name)
                if _finite(found):
                    entry[name] = float(found)  # type: ignore[arg-type]
    metrics["repeat_level_metrics"] = repeats


__all__ = ["STATS", "add_field_stats", "describe", "row_fields"]
