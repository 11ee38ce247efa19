"""Per-repeat summary statistics: NeMo Gym's (0.6.0 on) ``AggregateMetrics.repeat_level_metrics``.

One entry per (agent, rollout index) for every agent run more than once per task: how many
tasks that repeat covers (``sample_count``, ``missing_count``) and, for each measurement of
:func:`nemo_gym.collection.metrics.extract_numeric_fields`, its mean, median, sample standard
deviation, standard error, minimum, maximum and quartiles (linear interpolation) across tasks.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from nemo_gym.collection.metrics import extract_numeric_fields


def _agent_name(row: Mapping[str, Any]) -> str:
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) else ""


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolating linearly between neighbours."""
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _summary(name: str, values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    n = len(ordered)
    mean = statistics.fmean(ordered)
    std = statistics.stdev(ordered) if n > 1 else 0.0
    return {
        f"mean/{name}": mean,
        f"median/{name}": float(statistics.median(ordered)),
        f"std/{name}": std,
        f"sem/{name}": std / math.sqrt(n),
        f"min/{name}": ordered[0],
        f"max/{name}": ordered[-1],
        f"p25/{name}": _quantile(ordered, 0.25),
        f"p75/{name}": _quantile(ordered, 0.75),
    }


def repeat_level_metrics(verify_responses: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The per-repeat entries (empty when no agent has more than one rollout index)."""
    rows: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for row in verify_responses:
        rollout = row.get("_ng_rollout_index", 0)
        rows.setdefault((_agent_name(row), int(rollout) if isinstance(rollout, int) else 0), []).append(row)
    agents = {agent for agent, _ in rows}
    entries: list[dict[str, Any]] = []
    for agent in sorted(agents):
        repeats = sorted(r for a, r in rows if a == agent)
        if len(repeats) < 2:
            continue
        total = len({str(row.get("_ng_task_index")) for r in repeats for row in rows[(agent, r)]})
        for repeat in repeats:
            group = rows[(agent, repeat)]
            present = len({str(row.get("_ng_task_index")) for row in group})
            entry: dict[str, Any] = {
                "agent_ref": {"name": agent},
                "_ng_rollout_index": repeat,
                "sample_count": present,
                "missing_count": total - present,
            }
            columns: dict[str, list[float]] = {}
            for row in group:
                for name, value in extract_numeric_fields(row).items():
                    columns.setdefault(name, []).append(value)
            for name in sorted(columns):
                entry.update(_summary(name, columns[name]))
            entries.append(entry)
    return entries
