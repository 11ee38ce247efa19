"""The files of a rollout collection: input pre-pass, materialized rows, results, failures, resume.

For ``+output_jsonl_fpath=x.jsonl`` a collection owns four files (:class:`CollectionPaths`):
``x.jsonl`` (results), ``x_materialized_inputs.jsonl``, ``x_failures.jsonl`` and
``x_aggregate_metrics.json``. Everything here streams: no function holds a file's rows in memory.

- :func:`materialize_input` is the pre-pass: it validates every input line (reporting file and
  line number), assigns ``_ng_task_index`` (identical lines share one) and ``_ng_rollout_index``,
  expands repeats and writes the materialized rows, without keeping rows.
- :class:`JsonlAppender` appends one whole line per ``write`` call, so a kill leaves at most one
  torn last line; :func:`scan_results` detects and drops it on resume.
- :func:`compact_failures` keeps the latest failure record per rollout that still has no result.
- :func:`merge_result_shards` merges shard outputs: deduplicated and sorted by (task, rollout).
- :func:`write_metrics_file` assembles ``x_aggregate_metrics.json`` from per-agent answers.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import string
import sys
from array import array
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from nemo_gym.collection.disk_errors import disk_writes
from nemo_gym.launch.config import ConfigError, deep_merge
from nemo_gym.serving.request_guard import MAX_JSON_DEPTH, json_nesting_depth

TASK_INDEX_KEY = "_ng_task_index"
ROLLOUT_INDEX_KEY = "_ng_rollout_index"
ATTEMPT_INDEX_KEY = "_ng_attempt_index"
FAILURE_CLASS_KEY = "_ng_failure_class"
ERROR_KEY = "_ng_error"
INPUT_LINE_KEY = "_ng_input_line"
AGENT_REF_KEY = "agent_ref"
SKILLS_REF_KEY = "skills_ref"
AGENT_KIND = "responses_api_agents"
MALFORMED_INPUT = "malformed_input"
# Rollout keys pack (task, rollout) into one int: cheap to hold a million of them in a set.
_ROLLOUT_BITS = 32
MAX_REPORTED_BAD_LINES = 10


class CollectionInputError(ConfigError):
    """An input or output file cannot be used; the message names the file and line."""


def rollout_key(task_index: int, rollout_index: int) -> int:
    """One int standing for (task, rollout); both must be non-negative and rollout < 2**32."""
    return (task_index << _ROLLOUT_BITS) | rollout_index


def row_key(row: Mapping[str, Any]) -> int | None:
    """The rollout key of a row carrying non-negative int task and rollout indices, else None."""
    task, rollout = row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY)
    if type(task) is not int or type(rollout) is not int or task < 0 or not 0 <= rollout < 1 << _ROLLOUT_BITS:
        return None
    return rollout_key(task, rollout)


def agent_name_of(row: Mapping[str, Any], default: str | None = None) -> str | None:
    """The agent a row goes to: its ``agent_ref.name``, else ``default``."""
    ref = row.get(AGENT_REF_KEY)
    if isinstance(ref, Mapping) and isinstance(ref.get("name"), str) and ref["name"]:
        return str(ref["name"])
    return default


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


# ---- turning input rows into rollout rows --------------------------------------------------
@dataclass(frozen=True)
class PromptConfig:
    """``system`` and ``user`` templates (``str.format`` over the row's fields) for the input."""

    system: str | None
    user: str
    path: str

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PromptConfig:
        """Read a prompt YAML with a ``user`` template and an optional ``system`` template."""
        source = Path(path)
        if not source.is_file():
            raise ConfigError(f"+prompt_config: file {str(path)!r} does not exist")
        try:
            data = yaml.safe_load(source.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"+prompt_config {str(path)!r} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"+prompt_config {str(path)!r} must be a mapping with 'user' (and 'system')")
        unknown = sorted(set(data) - {"system", "user"})
        if unknown:
            raise ConfigError(f"+prompt_config {str(path)!r}: unknown keys {unknown}; allowed: system, user")
        if not isinstance(data.get("user"), str):
            raise ConfigError(f"+prompt_config {str(path)!r}: 'user' must be a template string")
        if data.get("system") is not None and not isinstance(data["system"], str):
            raise ConfigError(f"+prompt_config {str(path)!r}: 'system' must be a template string")
        for name in ("system", "user"):
            if isinstance(data.get(name), str):
                try:
                    list(string.Formatter().parse(data[name]))
                except ValueError as exc:
                    raise ConfigError(f"+prompt_config {str(path)!r}: bad '{name}' template: {exc}") from exc
        return cls(system=data.get("system"), user=data["user"], path=str(path))

    def input_items(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        """The ``input`` messages for a row; raises ``ValueError`` naming a missing field."""
        items = []
        for role, template in (("system", self.system), ("user", self.user)):
            if template is None:
                continue
            try:
                text = template.format_map(row)
            except KeyError as exc:
                raise ValueError(
                    f"prompt_config {role} template needs field {exc.args[0]!r}, which the row lacks"
                ) from exc
            except (IndexError, AttributeError, ValueError) as exc:
                raise ValueError(
                    f"prompt_config {role} template cannot be filled from the row: {exc}"
                ) from exc
            items.append({"role": role, "content": text})
        return items


@dataclass(frozen=True)
class RowMaterializer:
    """Prepares input rows: agent, prompt, ``responses_create_params`` overrides, repeats, seeds."""

    agent_name: str | None = None
    num_repeats: int | Mapping[str, int] = 1
    add_seed: bool = False
    responses_create_params: Mapping[str, Any] = field(default_factory=dict)
    prompt: PromptConfig | None = None
    # The run's skills (+skills.path), stamped on every row for the agent (NeMo Gym's skills_ref).
    skills_ref: Mapping[str, Any] | None = None

    def repeats_for(self, agent: str) -> int:
        """Rollouts per task for ``agent`` (a map's ``_default``, else 1, for unlisted agents)."""
        if isinstance(self.num_repeats, Mapping):
            return int(self.num_repeats.get(agent, self.num_repeats.get("_default", 1)))
        return int(self.num_repeats)

    def prepare(self, row: Any) -> dict[str, Any]:
        """The row to repeat, or ``ValueError`` saying what is wrong with it."""
        if not isinstance(row, dict):
            raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
        agent = agent_name_of(row, self.agent_name)
        if agent is None:
            raise ValueError("row has no agent_ref.name and no +agent_name was given")
        params = row.get("responses_create_params")
        if params is None and self.prompt is None:
            raise ValueError("row has no responses_create_params (required unless +prompt_config is given)")
        if params is not None and not isinstance(params, dict):
            raise ValueError(f"responses_create_params must be an object, got {type(params).__name__}")
        prepared = dict(row)
        params = dict(params or {})
        if self.prompt is not None:
            if params.get("input") is not None:
                raise ValueError(
                    "row already has responses_create_params.input, and +prompt_config would replace it; "
                    "drop one of the two"
                )
            params["input"] = self.prompt.input_items(row)
        if self.responses_create_params:
            params = deep_merge(params, self.responses_create_params)
        prepared["responses_create_params"] = params
        ref = row.get(AGENT_REF_KEY)
        prepared[AGENT_REF_KEY] = {
            **(ref if isinstance(ref, Mapping) else {}),
            "type": AGENT_KIND,
            "name": agent,
        }
        for key in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, ATTEMPT_INDEX_KEY):
            prepared.pop(key, None)  # the collector assigns these
        if self.skills_ref is not None:
            prepared[SKILLS_REF_KEY] = dict(self.skills_ref)
        return prepared

    def expand(
        self, prepared: dict[str, Any], task_index: int, first_rollout: int
    ) -> Iterator[dict[str, Any]]:
        """The rollout rows of one prepared row: indices first, then the row's fields."""
        agent = prepared[AGENT_REF_KEY]["name"]
        for rollout in range(first_rollout, first_rollout + self.repeats_for(agent)):
            row = {TASK_INDEX_KEY: task_index, ROLLOUT_INDEX_KEY: rollout, **prepared}
            if self.add_seed:
                row["responses_create_params"] = with_seed(row["responses_create_params"], rollout)
            yield row


def with_seed(params: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """``params`` with ``metadata.extra_body`` (a JSON string, as Responses metadata values are)
    carrying ``{"seed": seed}``, merged into an ``extra_body`` already there."""
    metadata = dict(params.get("metadata") or {})
    extra: Any = {}
    if isinstance(metadata.get("extra_body"), str):
        try:
            extra = orjson.loads(metadata["extra_body"])
        except orjson.JSONDecodeError:
            extra = {}
    if not isinstance(extra, dict):
        extra = {}
    metadata["extra_body"] = json.dumps({**extra, "seed": seed})  # NeMo Gym's spelling, byte for byte
    return {**params, "metadata": metadata}


# ---- the input pre-pass ----------------------------------------------------------------------
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
                    depth = json_nesting_depth(stripped)
                    if depth > MAX_JSON_DEPTH:
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
                agent = prepared[AGENT_REF_KEY]["name"]
                report.agents.add(agent)
                count = materializer.repeats_for(agent)
                task = task_of_line.setdefault(line_digest(stripped), report.tasks)
                if task == report.tasks:
                    report.tasks += 1
                    first = 0
                else:
                    # Identical lines go to the same agent, so the first one had ``count`` rollouts.
                    first = next_rollout.get(task, count)
                    next_rollout[task] = first + count
                if first + count > 1 << _ROLLOUT_BITS:
                    raise CollectionInputError(f"{input_path}:{line_number}: too many rollouts for one task")
                for row in materializer.expand(prepared, task, first):
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


class IntTable:
    """Non-negative int keys (< 2**63) → int values, in two flat arrays (open addressing).

    A Python dict or set of a million ints costs 60-120 MB of objects; this costs 32 MB, which
    keeps the pre-pass and resume of a million-row collection well inside its memory budget.
    """

    _MULTIPLIER = 0x9E3779B97F4A7C15  # Fibonacci hashing spreads keys whose low bits repeat

    def __init__(self) -> None:
        self._bits = 10
        self._keys = array("Q", bytes(8 << self._bits))  # key + 1; 0 marks a free slot
        self._values = array("q", bytes(8 << self._bits))
        self._size = 0

    def _find(self, stored: int) -> int:
        keys, mask = self._keys, (1 << self._bits) - 1
        slot = ((stored * self._MULTIPLIER) & 0xFFFFFFFFFFFFFFFF) >> (64 - self._bits)
        while keys[slot] and keys[slot] != stored:
            slot = (slot + 1) & mask
        return slot

    def setdefault(self, key: int, value: int) -> int:
        """The value stored for ``key``, storing ``value`` first if the key is new."""
        slot = self._find(key + 1)
        if self._keys[slot]:
            return int(self._values[slot])
        self._keys[slot], self._values[slot] = key + 1, value
        self._size += 1
        if self._size * 2 > len(self._keys):
            self._grow()
        return value

    def add(self, key: int) -> None:
        """Store ``key`` (with value 0) if it is new."""
        self.setdefault(key, 0)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and bool(self._keys[self._find(key + 1)])

    def __len__(self) -> int:
        return self._size

    def _grow(self) -> None:
        old_keys, old_values = self._keys, self._values
        self._bits += 1
        self._keys, self._values = array("Q", bytes(8 << self._bits)), array("q", bytes(8 << self._bits))
        for stored, value in zip(old_keys, old_values, strict=True):
            if stored:
                slot = self._find(stored)
                self._keys[slot], self._values[slot] = stored, value


def line_digest(line: bytes) -> int:
    """A 63-bit digest of a line's bytes (identical lines, identical digests)."""
    return int.from_bytes(hashlib.blake2b(line, digest_size=8).digest(), "little") >> 1


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` for each non-blank line; a bad line raises naming file and line."""
    with path.open("rb") as source:
        for line_number, line in enumerate(source, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise CollectionInputError(f"{path}:{line_number}: not valid JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise CollectionInputError(f"{path}:{line_number}: expected a JSON object")
            yield line_number, row


# ---- results and failures --------------------------------------------------------------------
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


# ---- merging shards --------------------------------------------------------------------------
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


# ---- the metrics file ------------------------------------------------------------------------
METRIC_KEYS = ("agent_metrics", "key_metrics", "group_level_metrics")


def spool_results_by_agent(results_path: Path, spool_dir: Path) -> dict[str, tuple[dict[str, Any], Path]]:
    """Split a results file into one JSONL file per agent of rows with heavy fields stripped
    (what ``/aggregate_metrics`` reads); returns ``{agent name: (agent_ref, spool path)}``."""
    from nemo_gym.collection.metrics import strip_heavy_fields

    spools: dict[str, tuple[dict[str, Any], Path]] = {}
    handles: dict[str, Any] = {}
    try:
        if results_path.exists():
            for _, row in iter_jsonl(results_path):
                name = agent_name_of(row) or "unknown_agent"
                if name not in spools:
                    ref = row.get(AGENT_REF_KEY)
                    ref = dict(ref) if isinstance(ref, Mapping) else {"type": AGENT_KIND, "name": name}
                    spools[name] = (ref, spool_dir / f"agent{len(spools)}.jsonl")
                    handles[name] = spools[name][1].open("wb")
                handles[name].write(orjson.dumps(strip_heavy_fields(row), option=orjson.OPT_APPEND_NEWLINE))
    finally:
        for handle in handles.values():
            handle.close()
    return spools


def read_metrics_summary(answer_path: Path) -> dict[str, Any]:
    """``agent_metrics`` and ``key_metrics`` of an ``/aggregate_metrics`` answer saved in a file,
    read without parsing ``group_level_metrics`` (a million tasks parse into ~450 MB of objects).
    Raises ``ValueError`` if the answer is not an object holding all three keys."""
    size = answer_path.stat().st_size
    with answer_path.open("rb") as source:
        head = source.read(1 << 20)
        if size <= len(head):
            answer = orjson.loads(head)
            if not isinstance(answer, dict) or any(k not in answer for k in METRIC_KEYS):
                raise ValueError(f"the answer lacks one of {', '.join(METRIC_KEYS)}")
            return {k: answer[k] for k in METRIC_KEYS[:2]}
        summary: dict[str, Any] = {}
        found = _find_keys(source, [f'"{k}":'.encode() for k in METRIC_KEYS])
        if not head.lstrip().startswith(b"{") or len(found) != len(METRIC_KEYS):
            raise ValueError(f"the answer is not an object holding {', '.join(METRIC_KEYS)}")
        decoder = json.JSONDecoder()
        for key in METRIC_KEYS[:2]:
            source.seek(found[f'"{key}":'.encode()])
            text = source.read(1 << 22).decode(errors="replace")
            summary[key], _ = decoder.raw_decode(text.lstrip())  # a flat map of numbers: small
        return summary


def _find_keys(source: Any, markers: list[bytes]) -> dict[bytes, int]:
    """File offsets just past the first occurrence of each marker (scanned in 1 MB blocks)."""
    found: dict[bytes, int] = {}
    overlap = max(len(m) for m in markers)
    source.seek(0)
    offset, tail = 0, b""
    while len(found) < len(markers) and (block := source.read(1 << 20)):
        window = tail + block
        for marker in markers:
            at = window.find(marker) if marker not in found else -1
            if at >= 0:
                found[marker] = offset - len(tail) + at + len(marker)
        offset += len(block)
        tail = window[-overlap:]
    return found


def write_metrics_file(metrics_path: Path, answers: list[tuple[dict[str, Any], Path]]) -> None:
    """``[{agent_ref, agent_metrics, key_metrics, group_level_metrics}, ...]``: each agent's
    answer file copied in as bytes after its ``agent_ref`` (never parsed whole), one per line."""
    tmp = metrics_path.with_name(metrics_path.name + ".tmp")
    with tmp.open("wb") as sink:
        sink.write(b"[")
        for index, (ref, answer_path) in enumerate(answers):
            sink.write((b",\n" if index else b"\n") + b'{"agent_ref":' + orjson.dumps(ref) + b",")
            with answer_path.open("rb") as source:
                block = source.read(1 << 20).lstrip()[1:]  # past the answer's opening brace
                while block:
                    sink.write(block)
                    block = source.read(1 << 20)
        sink.write(b"\n]\n")
    os.replace(tmp, metrics_path)


def warn(message: str) -> None:
    """A one-line notice on stderr (progress bars write there too)."""
    sys.stderr.write(f"[nemo_gym collect] {message}\n")
    sys.stderr.flush()
