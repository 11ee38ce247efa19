"""A collection's results file: appended one whole line at a time, scanned (and repaired) on resume.

:class:`JsonlAppender` appends one whole line per ``write`` call, so a kill leaves at most one torn
last line; :func:`scan_results` detects and drops it on resume.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collection.disk_errors import disk_writes
from nemo_gym.collection.int_table import IntTable
from nemo_gym.collection.row_keys import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, CollectionInputError, row_key


class JsonlAppender:
    """Appends JSON lines to a file, each with a single ``write`` call on an ``O_APPEND`` descriptor.

    Nothing is buffered in this process: a line is in the file (the OS page cache) as soon as
    :meth:`append` returns, and a process killed at any moment leaves at most one torn last line.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, row: Mapping[str, Any]) -> None:
        """Write one row as one line."""
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        data = memoryview(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE, default=str))
        with disk_writes(self.path):
            while data:  # a regular file takes it in one call; loop only for the rare short write
                data = data[os.write(self._fd, data) :]

    def close(self) -> None:
        """Flush to disk and close."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                with disk_writes(self.path):
                    os.fsync(fd)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EROFS):  # a device or pipe cannot fsync
                    raise
            finally:
                os.close(fd)

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class ResultsScan:
    """What an existing results file holds: finished rollout keys and counts."""

    done: IntTable = field(default_factory=IntTable)
    rows: int = 0
    duplicates: int = 0
    torn_line_dropped: bool = False


def scan_results(path: Path, *, repair: bool = True) -> ResultsScan:
    """Keys of the rollouts already in ``path``. A torn last line (no newline, or not JSON: a
    write cut by a kill) is cut off the file when ``repair``; a bad line elsewhere is an error."""
    scan = ResultsScan()
    if not path.exists():
        return scan
    good_end = 0
    torn: tuple[int, int] | None = None
    with path.open("rb") as source:
        offset = 0
        for line_number, line in enumerate(source, 1):
            start, offset = offset, offset + len(line)
            if torn is not None:
                raise CollectionInputError(
                    f"{path}:{torn[0]}: not valid JSON (and not the last line, so not a cut-off write); "
                    "fix or remove that line"
                )
            if not line.strip():
                good_end = offset
                continue
            try:
                row = orjson.loads(line) if line.endswith(b"\n") else None
            except orjson.JSONDecodeError:
                row = None
            if not isinstance(row, dict):
                torn = (line_number, start)
                continue
            key = row_key(row)
            if key is None:
                raise CollectionInputError(
                    f"{path}:{line_number}: a result row without integer {TASK_INDEX_KEY} and {ROLLOUT_INDEX_KEY}"
                )
            if key in scan.done:
                scan.duplicates += 1
            scan.done.add(key)
            scan.rows += 1
            good_end = offset
    if torn is not None:
        scan.torn_line_dropped = True
        if repair:
            os.truncate(path, good_end)
    return scan


def drop_duplicate_results(path: Path) -> int:
    """Rewrite ``path`` keeping the first row of each (task, rollout) key; returns rows dropped.

    The rewrite goes to a temporary file that replaces ``path`` only once complete and synced,
    so a kill during it leaves the original file whole."""
    seen = IntTable()
    dropped = 0
    tmp = path.with_name(path.name + ".dedup.tmp")
    with path.open("rb") as source, tmp.open("wb") as sink:
        for line in source:
            try:
                row = orjson.loads(line) if line.strip() else None
            except orjson.JSONDecodeError:
                row = None
            key = row_key(row) if isinstance(row, dict) else None
            if key is not None:
                if key in seen:
                    dropped += 1
                    continue
                seen.add(key)
            sink.write(line)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(tmp, path)
    return dropped
