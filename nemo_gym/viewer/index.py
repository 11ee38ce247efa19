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
import os
import time
from array import array
from collections.abc import Iterator
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


def summarize_row(row: Any, row_number: int, with_snippet: bool = True) -> RowSummary:
    """The index summary of one parsed row (anything not a JSON object is a bad line)."""
    if not isinstance(row, dict):
        return RowSummary(-1 - row_number, -1, math.nan, "", 0, FLAG_BAD_LINE, "")
    task = row.get("_ng_task_index")
    rollout = row.get("_ng_rollout_index")
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

    def _lines_from(self, offset: int) -> Iterator[tuple[int, bytes]]:
        with self.path.open("rb") as source:
            source.seek(offset)
            for line in source:
                if not line.endswith(b"\n"):
                    return  # a row still being written
                yield offset, line
                offset += len(line)

    def _scan_from(self, offset: int) -> None:
        cols = self.columns
        add_offset, add_length = cols["offset"].append, cols["length"].append
        add_task, add_rollout = cols["task"].append, cols["rollout"].append
        add_reward, add_agent = cols["reward"].append, cols["agent"].append
        add_tools, add_flags = cols["tool_calls"].append, cols["flags"].append
        snippets, loads = self.snippets, orjson.loads
        row = len(self)
        end = offset
        last_line = b""
        for start, line in self._lines_from(offset):
            end = start + len(line)
            if not line.strip():
                continue
            try:
                parsed = loads(line)
            except orjson.JSONDecodeError:
                parsed = None
            summary = summarize_row(parsed, row, with_snippet=False)
            if summary.task not in snippets:
                snippet = prompt_snippet(parsed) if type(parsed) is dict else ""
                if snippet:
                    snippets[summary.task] = snippet
            add_offset(start)
            add_length(len(line))
            add_task(summary.task)
            add_rollout(summary.rollout)
            add_reward(summary.reward)
            add_agent(self.agent_id(summary.agent))
            add_tools(summary.tool_calls)
            add_flags(summary.flags)
            row += 1
            last_line = line
        if last_line:
            self._last_digest = _digest(last_line)
        self.indexed_bytes = max(end, self.indexed_bytes)
        if not self._head_digest and self.indexed_bytes:
            self._head_digest = self._current_head_digest()

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
