"""A dataset's statistics as NeMo Gym writes them (``<stem>_metrics.json``), and their drift.

:class:`DatasetStatistics` accumulates the statistics over valid rows (NeMo Gym's key names, so
committed files map across); :func:`metrics_drift` lists each statistic that changed between a
committed file and a fresh computation. Used by ``ng_prepare_data`` and the authoring checks.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_gym.launch.datasets import DatasetConfig

# Fields the statistics never describe: the request itself and a recorded answer.
UNSUMMARIZED_FIELDS = ("responses_create_params", "response")


class RunningStats:
    """Count, mean, min, max and sample standard deviation of a stream (Welford's update)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.low = math.inf
        self.high = -math.inf

    def observe(self, value: float) -> None:
        """Add one value."""
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def summary(self) -> dict[str, Any]:
        """NeMo Gym's shape; floats rounded to 2 decimals (3 when |x| < 1) as its files are."""
        n = self.count
        values = {
            "Average": self.mean if n else 0.0,
            "Min": self.low if n else 0.0,
            "Max": self.high if n else 0.0,
            "Standard deviation": math.sqrt(self.m2 / (n - 1)) if n > 1 else 0.0,
        }
        return {"Total # non-null values": n} | {k: _round_stat(float(v)) for k, v in values.items()}


def _round_stat(value: float) -> float:
    return round(value, 2) if abs(value) >= 1 else round(value, 3)


class DatasetStatistics:
    """Accumulates the statistics of ``<stem>_metrics.json`` over rows."""

    def __init__(self) -> None:
        self.examples = 0
        self.tools = RunningStats()
        self.words = RunningStats()
        self.turns = RunningStats()
        self.temperature = RunningStats()
        self.fields: dict[str, RunningStats | Counter[str]] = {}

    def add(self, row: Mapping[str, Any]) -> None:
        """Add one valid row."""
        self.examples += 1
        params = row["responses_create_params"]
        if params.get("tools") is not None:
            self.tools.observe(len(params["tools"]))
        items = params.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        user_turns = sum(
            1 for item in items or [] if isinstance(item, Mapping) and item.get("role") == "user"
        )
        if user_turns:
            self.turns.observe(user_turns)
        if params.get("temperature") is not None:
            self.temperature.observe(float(params["temperature"]))
        # Python's json.dumps (", " and ": " separators, ASCII escapes) is what NeMo Gym counts;
        # the separators add the spaces that split into "words".
        self.words.observe(len(json.dumps(params).split()))
        for key, value in row.items():
            if key in UNSUMMARIZED_FIELDS:
                continue
            for item in value if isinstance(value, list) else [value]:
                self._observe_field(key, item)

    def _observe_field(self, key: str, item: Any) -> None:
        if isinstance(item, bool):
            item = int(item)
        if isinstance(item, int | float):
            stats = self.fields.setdefault(key, RunningStats())
            if isinstance(stats, RunningStats):
                stats.observe(float(item))
        elif isinstance(item, str):
            counter = self.fields.setdefault(key, Counter())
            if isinstance(counter, Counter):
                counter[item] += 1

    def as_dict(self) -> dict[str, Any]:
        """The statistics under NeMo Gym's key names."""
        result: dict[str, Any] = {
            "Number of examples": self.examples,
            "Number of tools": self.tools.summary(),
            "Json-dumped number of words (proxy for token count)": self.words.summary(),
            "Number of turns": self.turns.summary(),
            "Temperature": self.temperature.summary(),
        }
        for key, acc in self.fields.items():
            if isinstance(acc, RunningStats):
                result[key] = acc.summary()
            else:
                result[key] = {"unique_count": len(acc), "total_count": sum(acc.values())}
        return result


def dataset_header(config: DatasetConfig) -> dict[str, Any]:
    """The dataset's config fields that open its metrics file."""
    header = config.model_dump(mode="json", exclude={"source", "prompt_config"})
    if config.source is not None:
        header["source"] = config.source.model_dump(mode="json", exclude_none=True)
    if config.prompt_config is not None:
        header["prompt_config"] = config.prompt_config
    return header


# ---- drift ------------------------------------------------------------------------------------


def metrics_drift(committed: Any, fresh: Any, path: str = "") -> list[str]:
    """Each statistic that changed, as ``"<key path>: old → new"``.

    Keys only in ``fresh`` are allowed (newer statistics); floats compare with the tolerance
    their rounding leaves.
    """
    if isinstance(committed, Mapping) and isinstance(fresh, Mapping):
        drift = []
        for key, old in committed.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in fresh:
                drift.append(f"{sub}: {_show(old)} → (missing)")
            else:
                drift += metrics_drift(old, fresh[key], sub)
        return drift
    if _is_number(committed) and _is_number(fresh):
        old, new = float(committed), float(fresh)
        tolerance = 5e-3 if max(abs(old), abs(new)) >= 1 else 5e-4
        return [] if abs(old - new) <= tolerance else [f"{path}: {_show(committed)} → {_show(fresh)}"]
    return [] if committed == fresh else [f"{path}: {_show(committed)} → {_show(fresh)}"]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def metrics_path_for(jsonl_path: Path) -> Path:
    """``data/train.jsonl`` → ``data/train_metrics.json`` (NeMo Gym's sidecar name)."""
    return jsonl_path.with_name(f"{jsonl_path.stem}_metrics.json")
