"""The Overview page's charts, from counts kept per collection: reward histogram, pass@k, pass rates.

Each takes the small counters :class:`~nemo_gym.viewer.collection.Collection` keeps (rewards by
value, tasks by scored and solved repeats), never the rows.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from nemo_gym.collection.metrics import pass_at_k


def mean(counts: Counter[float]) -> float | None:
    n = sum(counts.values())
    return sum(value * count for value, count in counts.items()) / n if n else None


def histogram(counts: Counter[float], bins: int = 20) -> dict[str, Any]:
    """Reward counts: exact values when there are few distinct ones, else ``bins`` equal bins."""
    if not counts:
        return {"kind": "values", "bars": []}
    if len(counts) <= bins:
        return {
            "kind": "values",
            "bars": [{"label": f"{v:g}", "value": v, "count": c} for v, c in sorted(counts.items())],
        }
    low, high = min(counts), max(counts)
    width = (high - low) / bins
    totals = [0] * bins
    for value, count in counts.items():
        totals[min(int((value - low) / width), bins - 1)] += count
    return {
        "kind": "bins",
        "bars": [
            {
                "label": f"{low + i * width:.3g}–{low + (i + 1) * width:.3g}",
                "value": low + i * width,
                "count": c,
            }
            for i, c in enumerate(totals)
        ],
    }


def pass_at_k_curve(groups: Counter[tuple[int, int]]) -> list[dict[str, float]]:
    """Mean pass@k over tasks for k = 1 .. the largest repeat count (tasks with n >= k count);
    ``groups`` counts tasks by (scored repeats, solved repeats)."""
    if not groups:
        return []
    top = max(n for n, _ in groups)
    ks = (
        sorted({1, 2, 4, 8, 16, 32, 64, 128, top} & set(range(1, top + 1))) if top > 16 else range(1, top + 1)
    )
    curve = []
    for k in ks:
        total = count = 0.0
        for (n, c), tasks in groups.items():
            if n >= k:
                total += pass_at_k(n, c, k) * tasks
                count += tasks
        if count:
            curve.append({"k": k, "pass": 100.0 * total / count, "tasks": count})
    return curve


def sorted_pass_rates(groups: Counter[tuple[int, int]], points: int) -> list[float]:
    """Every task's pass rate (solved / scored), best first, thinned to at most ``points`` values."""
    by_rate: Counter[float] = Counter()
    for (n, c), tasks in groups.items():
        by_rate[c / n] += tasks
    ordered = sorted(by_rate.items(), reverse=True)
    total = sum(by_rate.values())
    if total <= points:
        return [rate for rate, tasks in ordered for _ in range(tasks)]
    out, cumulative, position = [], 0, 0
    for rate, tasks in ordered:
        cumulative += tasks
        while position < points and position * total / points < cumulative:
            out.append(rate)
            position += 1
    return out
