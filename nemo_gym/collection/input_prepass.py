"""The input pre-pass: every input line validated, numbered and written out as rollout rows.

:func:`materialize_input` reads the input once, one line at a time: it reports bad lines with
file and line number, gives identical lines one task index, expands repeats and writes the
materialized rows, without keeping rows in memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collection.disk_errors import disk_writes
from nemo_gym.collection.int_table import IntTable, line_digest
from nemo_gym.collection.row_keys import (
    ERROR_KEY,
    FAILURE_CLASS_KEY,
    INPUT_LINE_KEY,
    MALFORMED_INPUT,
    ROLLOUT_BITS,
    CollectionInputError,
)
from nemo_gym.collection.row_materializer import RowMaterializer
from nemo_gym.launch.config import ConfigError
from nemo_gym.serving.request_guard import MAX_JSON_DEPTH, nesting_over

MAX_REPORTED_BAD_LINES = 10


@dataclass
class BadLine:
    """A malformed input line: where it is and what is wrong."""

    path: str
    line_number: int
    message: str
    raw: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line_number}: {self.message}"

    def failure_record(self) -> dict[str, Any]:
        """The ``x_failures.jsonl`` record of this line."""
        return {
            FAILURE_CLASS_KEY: MALFORMED_INPUT,
            ERROR_KEY: self.message,
            INPUT_LINE_KEY: self.line_number,
            "_ng_input_fpath": self.path,
            "_ng_raw_line": self.raw,
        }


@dataclass
class MaterializeReport:
    """What the pre-pass found: counts, bad lines, and the agents the rows go to."""

    input_rows: int = 0
    tasks: int = 0
    rollouts: int = 0
    bad_line_count: int = 0
    bad_lines: list[BadLine] = field(default_factory=list)
    agents: set[str] = field(default_factory=set)


def materialize_input(
    input_path: Path,
    output_path: Path,
    materializer: RowMaterializer,
    *,
    limit: int | None = None,
    strict: bool = False,
    on_bad_line: Callable[[BadLine], None] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> MaterializeReport:
    """Validate ``input_path`` line by line and write its rollout rows to ``output_path``.

    Rows are read one at a time and never kept. Identical lines (bytes, surrounding whitespace
    ignored) share a task index: a repeated line continues the rollout numbering of the first.
    ``limit`` counts valid input rows. A malformed line goes to ``on_bad_line`` and is skipped,
    keeping the task index it would have had, so once fixed it gets that index and a resume
    collects it without renumbering the rows after it. With ``strict`` a malformed line makes
    this raise :class:`CollectionInputError` listing the first bad lines (and ``output_path``
    is not written). ``on_row`` sees each materialized row (for counting).
    """
    if not input_path.is_file():
        raise ConfigError(f"+input_jsonl_fpath must name an existing JSONL file, got {str(input_path)!r}")
    report = MaterializeReport()
    task_of_line = IntTable()  # line digest → task index
    next_rollout: dict[int, int] = {}  # the next free rollout index of a repeated line's task
    tmp = output_path.with_name(output_path.name + ".tmp")
    output_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with disk_writes(tmp), input_path.open("rb") as source, tmp.open("wb") as sink:
            for line_number, line in enumerate(source, 1):
                if limit is not None and report.input_rows >= limit:
                    break
                stripped = line.strip()
                if not stripped:
                    continue
                try:
                    depth = nesting_over(stripped, MAX_JSON_DEPTH)
                    if depth is not None:
                        raise ValueError(f"nested {depth} levels deep; at most {MAX_JSON_DEPTH} are accepted")
                    try:
                        parsed = orjson.loads(stripped)
                    except orjson.JSONDecodeError as exc:
                        raise ValueError(f"not valid JSON: {exc}") from exc
                    prepared = materializer.prepare(parsed)
                except ValueError as exc:
                    bad = BadLine(
                        str(input_path), line_number, str(exc), stripped[:500].decode(errors="replace")
                    )
                    report.bad_line_count += 1
                    if len(report.bad_lines) < MAX_REPORTED_BAD_LINES:
                        report.bad_lines.append(bad)
                    if not strict and on_bad_line is not None:
                        on_bad_line(bad)
                    report.tasks += 1  # reserved for the line once it is fixed
                    continue
                report.input_rows += 1
                if report.bad_line_count and strict:
                    continue  # keep scanning only to report every bad line; write nothing
                plan = materializer.plan(parsed)
                report.agents.update(agent for agent, _ in plan if agent is not None)
                count = sum(n for _, n in plan)
                task = task_of_line.setdefault(line_digest(stripped), report.tasks)
                if task == report.tasks:
                    report.tasks += 1
                    first = 0
                else:
                    # Identical lines go to the same agents, so the first one had ``count`` rollouts.
                    first = next_rollout.get(task, count)
                    next_rollout[task] = first + count
                if first + count > 1 << ROLLOUT_BITS:
                    raise CollectionInputError(f"{input_path}:{line_number}: too many rollouts for one task")
                for row in materializer.expand(prepared, task, first, plan):
                    sink.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
                    report.rollouts += 1
                    if on_row is not None:
                        on_row(row)
        if report.bad_line_count and strict:
            shown = "\n  ".join(str(b) for b in report.bad_lines)
            more = report.bad_line_count - len(report.bad_lines)
            raise CollectionInputError(
                f"{report.bad_line_count} malformed input line(s); nothing was run:\n  {shown}"
                + (f"\n  ... and {more} more" if more > 0 else "")
                + "\nFix them, or leave out +strict=true to collect the other lines (bad ones are recorded in the "
                "failures file)."
            )
        os.replace(tmp, output_path)
    finally:
        tmp.unlink(missing_ok=True)
    return report
