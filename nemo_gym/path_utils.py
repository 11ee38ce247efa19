"""Compatibility: NeMo Gym's names for a collection's side files (``nemo_gym.path_utils``), over ours
(:class:`nemo_gym.collection.collection_io.CollectionPaths`): ``x.jsonl`` has
``x_failures.jsonl``, ``x_materialized_inputs.jsonl`` and ``x_aggregate_metrics.json``."""

from __future__ import annotations

from pathlib import Path

from nemo_gym.collection.collection_io import CollectionPaths


def failures_path_for(output_fpath: Path) -> Path:
    """``results/x.jsonl`` -> ``results/x_failures.jsonl``."""
    return CollectionPaths.for_output(output_fpath).failures


def materialized_path_for(output_fpath: Path) -> Path:
    """``results/x.jsonl`` -> ``results/x_materialized_inputs.jsonl``."""
    return CollectionPaths.for_output(output_fpath).materialized_inputs


def aggregate_metrics_path_for(output_fpath: Path) -> Path:
    """``results/x.jsonl`` -> ``results/x_aggregate_metrics.json``."""
    return CollectionPaths.for_output(output_fpath).aggregate_metrics
