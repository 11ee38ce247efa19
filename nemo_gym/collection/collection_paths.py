"""The names of a collection's four files, from its ``+output_jsonl_fpath``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CollectionPaths:
    """The result file and its side files: ``x.jsonl`` → ``x_materialized_inputs.jsonl`` etc."""

    output: Path
    materialized_inputs: Path
    failures: Path
    aggregate_metrics: Path

    @classmethod
    def for_output(cls, output: str | os.PathLike[str]) -> CollectionPaths:
        """The side files of ``output`` (its name without ``.jsonl`` plus a suffix)."""
        path = Path(output)
        stem = path.name[: -len(".jsonl")] if path.name.endswith(".jsonl") else path.name
        return cls(
            output=path,
            materialized_inputs=path.with_name(f"{stem}_materialized_inputs.jsonl"),
            failures=path.with_name(f"{stem}_failures.jsonl"),
            aggregate_metrics=path.with_name(f"{stem}_aggregate_metrics.json"),
        )
