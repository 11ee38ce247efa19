"""``x_aggregate_metrics.json``: rows spooled per agent, and the agents' answers copied in as bytes."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collection.row_keys import AGENT_KIND, AGENT_REF_KEY, agent_name_of, iter_jsonl

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
