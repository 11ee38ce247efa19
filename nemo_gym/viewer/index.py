"""The offset index of a rollouts JSONL file: where each row starts, and the few fields pages need.

A collection can hold a million rows; the viewer must open it in seconds and page through it
without holding the rows in memory. One streaming pass over the file records, per row, its
byte offset and length plus a summary (task and rollout index, reward, agent, tool calls,
whether it carries token IDs), and per task a short prompt snippet for search. The index is
saved beside the file as ``<file>.ngindex`` and reused while the file's size and mtime match.

A file that grows (a collection still running appends and flushes whole lines) is not
re-read: :meth:`RowIndex.refresh` checks that the indexed prefix is unchanged and parses only
the new complete lines. A file that shrank or whose prefix changed is indexed again from the
start. A trailing line without its newline is a row still being written; it waits.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import os
import time
from array import array
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final, NamedTuple

import orjson

__all__ = ["INDEX_SUFFIX", "FLAG_BAD_LINE", "FLAG_TOKEN_IDS", "RowIndex", "RowSummary", "summarize_row"]

INDEX_SUFFIX: Final = ".ngindex"
_MAGIC: Final = b"NGINDEX2\n"
_HEAD_BYTES: Final = 4096  # the file's first bytes, hashed to notice a rewritten file
_SNIPPET_CHARS: Final = 240
# How often a growing file's index is written back to disk (it is always current in memory).
_PERSIST_EVERY_S: Final = 10.0
# A first index over this many bytes is built by worker processes, one stretch of the file each.
_PARALLEL_BYTES: Final = 64 * 2**20
_MAX_WORKERS: Final = 8

FLAG_TOKEN_IDS: Final = 1  # some output item carries token IDs
FLAG_BAD_LINE: Final = 2  # the line is not a JSON object (shown as such, never dropped silently)

# Column name → array typecode. Row numbers are positions in these arrays.
_COLUMNS: Final[dict[str, str]] = {
    "offset": "q",
    "length": "q",
    "task": "q",
    "rollout": "q",
    "reward": "d",
    "agent": "l",
    "tool_calls": "l",
    "flags": "l",
}


class RowSummary(NamedTuple):
    """What the index keeps about one row. ``task`` is ``-1 - row`` when the row has no
    ``_ng_task_index`` (every such row is its own task); ``reward`` is NaN when absent."""

    task: int
    rollout: int
    reward: float
    agent: str
    tool_calls: int
    flags: int
    snippet: str


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("text")
        )
    return ""


def prompt_snippet(row: dict[str, Any], limit: int = _SNIPPET_CHARS) -> str:
    """The last user message of a row's prompt (what the task asks), cut to ``limit`` characters."""
    params = row.get("responses_create_params")
    prompt = params.get("input") if isinstance(params, dict) else None
    text = ""
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list):
        for message in prompt:
            if isinstance(message, dict) and message.get("role") == "user":
                text = _text_of(message.get("content"))
    return " ".join(text.split())[:limit]


_MAX_INDEX = 2**63 - 1


def _out_of_range(value: Any) -> bool:
    return type(value) is int and not 0 <= value <= _MAX_INDEX


def summarize_row(row: Any, row_number: int, with_snippet: bool = True) -> RowSummary:
    """The index summary of one parsed row (anything not a JSON object is a bad line)."""
    task = row.get("_ng_task_index") if isinstance(row, dict) else None
    rollout = row.get("_ng_rollout_index") if isinstance(row, dict) else None
    if not isinstance(row, dict) or _out_of_range(task) or _out_of_range(rollout):
        # Indexes live in 64-bit columns: a negative or huge one is a bad line, not a crash.
        return RowSummary(-1 - row_number, -1, math.nan, "", 0, FLAG_BAD_LINE, "")
    reward = row.get("reward")
    agent_ref = row.get("agent_ref")
    agent = agent_ref.get("name") if type(agent_ref) is dict else None
    tool_calls, flags = 0, 0
    response = row.get("response")
    output = response.get("output") if type(response) is dict else None
    if type(output) is list:
        for item in output:
            if type(item) is dict:
                kind = item.get("type")
                if kind == "function_call":
                    tool_calls += 1
                elif kind != "function_call_output" and item.get("generation_token_ids") is not None:
                    flags |= FLAG_TOKEN_IDS
    reward_type = type(reward)
    reward_value = (
        float(reward) if reward is not None and (reward_type is float or reward_type is int) else math.nan
    )
    return RowSummary(
        task if type(task) is int else -1 - row_number,
        rollout if type(rollout) is int else -1,
        reward_value,
        str(agent) if agent else "",
        tool_calls,
        flags,
        prompt_snippet(row) if with_snippet else "",
    )


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class _Chunk(NamedTuple):
    """What :func:`scan_range` found: column bytes, local agent names, snippets, where it ended."""

    columns: dict[str, bytes]
    agents: list[str]
    snippets: dict[int, str]
    has_unindexed_tasks: bool
    end: int
    last_digest: str


def scan_range(path: str, start: int, stop: int | None) -> _Chunk:
    """Summarize the lines of ``path`` from byte ``start`` up to ``stop`` (None: to the last
    complete line). Row numbers, and so the task keys of rows without ``_ng_task_index``, count
    from 0 at ``start``; :meth:`RowIndex._append` makes them global."""
    columns: dict[str, array[Any]] = {name: array(code) for name, code in _COLUMNS.items()}
    add_offset, add_length = columns["offset"].append, columns["length"].append
    add_task, add_rollout = columns["task"].append, columns["rollout"].append
    add_reward, add_agent = columns["reward"].append, columns["agent"].append
    add_tools, add_flags = columns["tool_calls"].append, columns["flags"].append
    agents: dict[str, int] = {}
    snippets: dict[int, str] = {}
    loads = orjson.loads
    row, offset, last_line, unindexed = 0, start, b"", False
    with open(path, "rb") as source:
        source.seek(start)
        for line in source:
            if not line.endswith(b"\n") or (stop is not None and offset >= stop):
                break  # a row still being written, or the next chunk's
            line_start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                parsed = loads(line)
            except orjson.JSONDecodeError:
                parsed = None
            summary = summarize_row(parsed, row, with_snippet=False)
            task = summary.task
            if task < 0:
                unindexed = True
            if task not in snippets and type(parsed) is dict:
                snippet = prompt_snippet(parsed)
                if snippet:
                    snippets[task] = snippet
            agent = agents.get(summary.agent)
            if agent is None:
                agent = agents[summary.agent] = len(agents)
            add_offset(line_start)
            add_length(len(line))
            add_task(task)
            add_rollout(summary.rollout)
            add_reward(summary.reward)
            add_agent(agent)
            add_tools(summary.tool_calls)
            add_flags(summary.flags)
            row += 1
            last_line = line
    return _Chunk(
        columns={name: column.tobytes() for name, column in columns.items()},
        agents=list(agents),
        snippets=snippets,
        has_unindexed_tasks=unindexed,
        end=offset,
        last_digest=_digest(last_line) if last_line else "",
    )


def _scan_in_parallel(path: Path, offset: int, workers: int) -> list[_Chunk]:
    """Split ``path`` from ``offset`` into ``workers`` stretches at line starts and scan them in
    worker processes (a fresh interpreter each: the caller may be running threads)."""
    size = path.stat().st_size
    bounds = [offset]
    with path.open("rb") as source:
        for k in range(1, workers):
            source.seek(offset + k * (size - offset) // workers)
            source.readline()  # to the start of the next line
            position = source.tell()
            if bounds[-1] < position < size:
                bounds.append(position)
    stops: list[int | None] = [*bounds[1:], None]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=len(bounds), mp_context=context) as pool:
        return list(pool.map(scan_range, [str(path)] * len(bounds), bounds, stops))


class RowIndex:
    """Byte offsets and summaries of a JSONL file's rows, kept current as the file grows.

    Columns are :mod:`array` arrays (``offset``, ``length``, ``task``, ``rollout``, ``reward``,
    ``agent``, ``tool_calls``, ``flags``), one entry per row. ``agents`` names agent ids;
    ``snippets`` maps a task to its prompt snippet. Use :meth:`open`, then :meth:`refresh`
    before reading when the file may have changed; :meth:`read_row` returns one parsed row.
    """

    def __init__(self, path: Path, index_path: Path | None = None) -> None:
        self.path = path
        self.index_path = index_path or path.with_name(path.name + INDEX_SUFFIX)
        self.columns: dict[str, array[Any]] = {name: array(code) for name, code in _COLUMNS.items()}
        self.agents: list[str] = []
        self._agent_ids: dict[str, int] = {}
        self.snippets: dict[int, str] = {}
        self.indexed_bytes = 0
        self._head_digest = ""
        self._last_digest = ""  # of the last indexed row's bytes
        self._stat: tuple[int, int] = (-1, -1)
        self._persisted_at = 0.0
        self._dirty = False
        self.rebuilt = False  # whether the last open/refresh re-read the file from the start
        self.loaded_rows = 0  # rows taken from the saved index at open (not re-parsed)
        self._listeners: list[Any] = []

    # ---- public --------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, index_path: Path | None = None) -> RowIndex:
        """The index of ``path``: loaded from its ``.ngindex`` file when that still matches,
        extended when the file only grew, otherwise built by one streaming pass (and saved).

        Raises:
            FileNotFoundError: when ``path`` does not exist.
        """
        index = cls(Path(path), index_path)
        if not index.path.is_file():
            raise FileNotFoundError(f"rollouts file {index.path} does not exist")
        index._load()
        index.refresh(force=True)
        return index

    def __len__(self) -> int:
        return len(self.columns["offset"])

    def on_rows(self, listener: Any) -> None:
        """Call ``listener(start_row, reset)`` after rows are added (``reset``: rebuilt from 0)."""
        self._listeners.append(listener)

    def refresh(self, force: bool = False) -> int:
        """Bring the index up to date with the file; returns how many rows were added.

        Cheap when nothing changed (one ``stat``). Re-reads from the start when the file shrank
        or its indexed prefix changed; otherwise parses only the complete lines appended since.
        """
        stat = self.path.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        if key == self._stat and not force:
            return 0
        if stat.st_size < self.indexed_bytes or not self._prefix_unchanged():
            self._reset()
        start = len(self)
        reset = self.rebuilt
        self._scan_from(self.indexed_bytes)
        self._stat = key
        added = len(self) - start
        if added or reset:
            self._dirty = True
            for listener in self._listeners:
                listener(start, reset)
        self.rebuilt = False
        if self._dirty and (force or time.monotonic() - self._persisted_at >= _PERSIST_EVERY_S):
            self._save()
        return added

    def read_row(self, row: int) -> Any:
        """Row number ``row`` parsed; a line that is not a JSON object comes back as
        ``{"_ng_viewer_bad_line": <text>, "error": <why>}``.

        Raises:
            IndexError: when there is no such row.
        """
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range: {self.path} has {len(self)} rows")
        with self.path.open("rb") as source:
            source.seek(self.columns["offset"][row])
            line = source.read(self.columns["length"][row])
        try:
            parsed = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            return {"_ng_viewer_bad_line": line.decode("utf-8", "replace")[:2000], "error": str(exc)}
        if not isinstance(parsed, dict):
            return {
                "_ng_viewer_bad_line": line.decode("utf-8", "replace")[:2000],
                "error": f"line {row + 1} is a JSON {type(parsed).__name__}, not an object (a rollout row)",
            }
        return parsed

    def agent_id(self, name: str) -> int:
        """The id of agent ``name`` (new names get the next id)."""
        found = self._agent_ids.get(name)
        if found is None:
            found = self._agent_ids[name] = len(self.agents)
            self.agents.append(name)
        return found

    # ---- scanning ------------------------------------------------------------------------
    def _reset(self) -> None:
        self.columns = {name: array(code) for name, code in _COLUMNS.items()}
        self.agents, self._agent_ids, self.snippets = [], {}, {}
        self.indexed_bytes = 0
        self._head_digest = ""
        self._last_digest = ""
        self.rebuilt = True

    def _scan_from(self, offset: int) -> None:
        """Index the complete lines from ``offset`` on; a big stretch is split across processes."""
        stretch = self.path.stat().st_size - offset
        workers = min(os.cpu_count() or 1, _MAX_WORKERS)
        if stretch >= _PARALLEL_BYTES and workers > 1:
            chunks = _scan_in_parallel(self.path, offset, workers)
        else:
            chunks = [scan_range(str(self.path), offset, None)]
        for chunk in chunks:
            self._append(chunk)
        if not self._head_digest and self.indexed_bytes:
            self._head_digest = self._current_head_digest()

    def _append(self, chunk: _Chunk) -> None:
        """Add a scanned chunk: its agent ids and its row-numbered task keys made global."""
        base = len(self)
        agent_map = [self.agent_id(name) for name in chunk.agents]
        for name in _COLUMNS:
            column = array(_COLUMNS[name])
            column.frombytes(chunk.columns[name])
            if name == "agent" and agent_map != list(range(len(agent_map))):
                column = array(_COLUMNS[name], [agent_map[a] for a in column])
            elif name == "task" and base and chunk.has_unindexed_tasks:
                column = array(_COLUMNS[name], [t - base if t < 0 else t for t in column])
            self.columns[name].extend(column)
        for task, text in chunk.snippets.items():
            self.snippets.setdefault(task - base if task < 0 else task, text)
        if chunk.last_digest:
            self._last_digest = chunk.last_digest
        self.indexed_bytes = max(chunk.end, self.indexed_bytes)

    def _current_head_digest(self) -> str:
        with self.path.open("rb") as source:
            return _digest(source.read(min(_HEAD_BYTES, self.indexed_bytes)))

    def _prefix_unchanged(self) -> bool:
        """Whether the bytes already indexed are still there: the head and the last indexed row."""
        if not self.indexed_bytes:
            return True
        if self._current_head_digest() != self._head_digest:
            return False
        if not len(self):
            return True
        offset, length = self.columns["offset"][-1], self.columns["length"][-1]
        with self.path.open("rb") as source:
            source.seek(offset)
            line = source.read(length)
        return line.endswith(b"\n") and self._last_digest == _digest(line)

    # ---- persistence ---------------------------------------------------------------------
    def _save(self) -> None:
        """Write the index beside the file (atomically); an unwritable folder only costs speed."""
        header = {
            "source": self.path.name,
            "indexed_bytes": self.indexed_bytes,
            "head_digest": self._head_digest,
            "last_row_digest": self._last_digest,
            "rows": len(self),
            "agents": self.agents,
            "columns": {name: len(self.columns[name]) * self.columns[name].itemsize for name in _COLUMNS},
        }
        snippets = orjson.dumps({str(task): text for task, text in self.snippets.items()})
        partial = self.index_path.with_name(self.index_path.name + f".{os.getpid()}.partial")
        try:
            with partial.open("wb") as sink:
                sink.write(_MAGIC)
                sink.write(orjson.dumps({**header, "snippets_bytes": len(snippets)}) + b"\n")
                for name in _COLUMNS:
                    sink.write(self.columns[name].tobytes())
                sink.write(snippets)
            os.replace(partial, self.index_path)
        except OSError:
            partial.unlink(missing_ok=True)
            return
        self._persisted_at = time.monotonic()
        self._dirty = False

    def _load(self) -> None:
        """Load a saved index; anything unreadable or for other contents is ignored (rebuilt)."""
        try:
            with self.index_path.open("rb") as source:
                if source.readline() != _MAGIC:
                    return
                header = orjson.loads(source.readline())
                columns = {}
                for name, code in _COLUMNS.items():
                    column = array(code)
                    size = header["columns"][name]
                    column.frombytes(source.read(size))
                    if len(column) != header["rows"]:
                        return
                    columns[name] = column
                snippets = orjson.loads(source.read(header["snippets_bytes"]))
        except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            return
        self.columns = columns
        self.agents = list(header["agents"])
        self._agent_ids = {name: i for i, name in enumerate(self.agents)}
        self.snippets = {int(task): text for task, text in snippets.items()}
        self.indexed_bytes = int(header["indexed_bytes"])
        self._head_digest = str(header["head_digest"])
        self._last_digest = str(header["last_row_digest"])
        self._persisted_at = time.monotonic()
        self.loaded_rows = len(self)
        if self.path.stat().st_size < self.indexed_bytes or not self._prefix_unchanged():
            self._reset()
            self.loaded_rows = 0
