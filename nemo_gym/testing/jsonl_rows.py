"""JSONL test data: written, read back, and varied from an environment's example row."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.launch.config import project_root


def distinct_example_rows(environment_dir: str | Path, count: int) -> list[dict[str, Any]]:
    """``count`` copies of an environment's first example row, each with its own last user message."""
    raw = (project_root() / environment_dir / "data" / "example.jsonl").read_bytes().splitlines()[0]
    rows = []
    for i in range(count):
        row = orjson.loads(raw)
        row["responses_create_params"]["input"][-1]["content"] = f"What is the weather in city number {i}?"
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: Sequence[Any]) -> Path:
    """Write ``rows`` as JSONL; returns ``path``."""
    path.write_bytes(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows))
    return path


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a JSONL file (test data; blank lines skipped)."""
    return [orjson.loads(line) for line in Path(path).read_bytes().splitlines() if line.strip()]
