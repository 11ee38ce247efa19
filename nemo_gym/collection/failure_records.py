"""A collection's failures file: attempts made so far, and compaction to the latest record per rollout."""

from __future__ import annotations

import os
from collections.abc import Container, Iterator
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collection.row_keys import ATTEMPT_INDEX_KEY, FAILURE_CLASS_KEY, MALFORMED_INPUT, row_key


def read_failure_attempts(path: Path, done: Container[int]) -> dict[int, int]:
    """Attempts made so far for each rollout with a failure record and no result."""
    attempts: dict[int, int] = {}
    if not path.exists():
        return attempts
    for _, record in _iter_tolerant(path):
        key = row_key(record)
        if key is None or key in done:
            continue
        made = int(record.get(ATTEMPT_INDEX_KEY) or 0) + 1
        if made > attempts.get(key, 0):
            attempts[key] = made
    return attempts


def compact_failures(path: Path, succeeded: Container[int], *, drop_malformed: bool) -> int:
    """Rewrite the failures file with the latest record of each rollout not in ``succeeded``
    (and the malformed-input records unless ``drop_malformed``); returns the records kept."""
    if not path.exists():
        return 0
    latest: dict[int, int] = {}
    for line_number, record in _iter_tolerant(path):
        key = row_key(record)
        if key is not None:
            latest[key] = line_number
    kept = 0
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as sink:
        for line_number, record in _iter_tolerant(path):
            key = row_key(record)
            if key is None:
                keep = not drop_malformed and record.get(FAILURE_CLASS_KEY) == MALFORMED_INPUT
            else:
                keep = latest[key] == line_number and key not in succeeded
            if keep:
                sink.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
                kept += 1
    os.replace(tmp, path)
    return kept


def _iter_tolerant(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a file we append to ourselves: a torn or bad line is skipped, not fatal."""
    with path.open("rb") as source:
        for line_number, line in enumerate(source, 1):
            try:
                row = orjson.loads(line) if line.strip() else None
            except orjson.JSONDecodeError:
                continue
            if isinstance(row, dict):
                yield line_number, row
