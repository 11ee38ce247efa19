"""Merging result shards: deduplicated and sorted by (task, rollout), holding only offsets in memory."""

from __future__ import annotations

import glob
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from nemo_gym.collection.row_keys import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, CollectionInputError, row_key
from nemo_gym.launch.config import ConfigError

SIDE_FILE_SUFFIXES = ("_materialized_inputs.jsonl", "_failures.jsonl")


def match_result_files(patterns: str) -> list[str]:
    """The files a glob, or comma-separated globs, match: each pattern's matches sorted, each file
    once (first match wins), a collection's ``*_materialized_inputs.jsonl`` and ``*_failures.jsonl``
    side files skipped (they sit next to its results and match ``shard*.jsonl`` too)."""
    found: dict[str, None] = {}
    for pattern in (p.strip() for p in patterns.split(",")):
        for match in sorted(glob.glob(pattern)) if pattern else ():
            if not match.endswith(SIDE_FILE_SUFFIXES):
                found.setdefault(match, None)
    return list(found)


def expand_input_glob(patterns: str) -> list[Path]:
    """:func:`match_result_files` as absolute paths (one file once however it is spelled); a
    pattern that matches nothing, or no pattern at all, is an error naming it."""
    for pattern in (p.strip() for p in patterns.split(",")):
        if pattern and not glob.glob(pattern):
            raise ConfigError(f"+input_glob: no file matches {pattern!r}")
    found = dict.fromkeys(os.path.abspath(match) for match in match_result_files(patterns))
    if not found:
        raise ConfigError("+input_glob is empty; give a glob such as 'results/shard*.jsonl'")
    return [Path(p) for p in found]


@dataclass
class MergeReport:
    """Counts from :func:`merge_result_shards`."""

    files: int = 0
    rows_read: int = 0
    rows_written: int = 0
    duplicates: int = 0
    torn_lines: list[str] = field(default_factory=list)


def merge_result_shards(inputs: list[Path], output: Path) -> MergeReport:
    """Write the rows of ``inputs`` to ``output`` sorted by (task, rollout), each key once (the
    first seen, in file order). Only (key, file, offset, length) per row is held in memory."""
    report = MergeReport(files=len(inputs))
    keys, files, offsets, lengths = array("Q"), array("H"), array("Q"), array("Q")
    for file_index, path in enumerate(inputs):
        offset = 0
        with path.open("rb") as source:
            for line_number, line in enumerate(source, 1):
                start, offset = offset, offset + len(line)
                if not line.strip():
                    continue
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    if not line.endswith(b"\n"):  # a shard killed mid-write: its last line is cut
                        report.torn_lines.append(f"{path}:{line_number}")
                        continue
                    raise CollectionInputError(f"{path}:{line_number}: not valid JSON: {exc}") from exc
                key = row_key(row) if isinstance(row, dict) else None
                if key is None:
                    raise CollectionInputError(
                        f"{path}:{line_number}: a result row needs integer {TASK_INDEX_KEY} and {ROLLOUT_INDEX_KEY}"
                    )
                keys.append(key)
                files.append(file_index)
                offsets.append(start)
                lengths.append(len(line))
                report.rows_read += 1
    order = sorted(range(len(keys)), key=keys.__getitem__)  # stable: first seen wins on ties
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    handles = [path.open("rb") for path in inputs]
    try:
        with tmp.open("wb") as sink:
            previous: int | None = None
            for index in order:
                if keys[index] == previous:
                    report.duplicates += 1
                    continue
                previous = keys[index]
                handle = handles[files[index]]
                handle.seek(offsets[index])
                data = handle.read(lengths[index])
                sink.write(data if data.endswith(b"\n") else data + b"\n")
                report.rows_written += 1
        os.replace(tmp, output)
    finally:
        for handle in handles:
            handle.close()
        tmp.unlink(missing_ok=True)
    return report
