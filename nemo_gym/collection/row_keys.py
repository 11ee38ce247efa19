"""The keys a collection's rows carry, the int that stands for a rollout, and reading rows back.

Every row of a collection's files carries ``_ng_task_index`` and ``_ng_rollout_index``;
:func:`rollout_key` packs the pair into one int so a million of them fit in a flat table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from nemo_gym import failure_classes
from nemo_gym.launch.config import ConfigError

TASK_INDEX_KEY = "_ng_task_index"
ROLLOUT_INDEX_KEY = "_ng_rollout_index"
ATTEMPT_INDEX_KEY = "_ng_attempt_index"
# NeMo Gym's row key for a caller-chosen rollout id (NeMo RL stamps one per rollout): it becomes the
# ``/ng-rollout/<id>`` prefix of every call of that rollout.
ROLLOUT_ID_KEY = "_ng_rollout_id"
FAILURE_CLASS_KEY = "_ng_failure_class"
ERROR_KEY = "_ng_error"
INPUT_LINE_KEY = "_ng_input_line"
AGENT_REF_KEY = "agent_ref"
SKILLS_REF_KEY = "skills_ref"
TASK_SOURCE_KEY = "task_source"
AGENT_KIND = "responses_api_agents"
MALFORMED_INPUT = failure_classes.MALFORMED_INPUT
# Rollout keys pack (task, rollout) into one int: cheap to hold a million of them in a set.
ROLLOUT_BITS = 32


class CollectionInputError(ConfigError):
    """An input or output file cannot be used; the message names the file and line."""


def rollout_key(task_index: int, rollout_index: int) -> int:
    """One int standing for (task, rollout); both must be non-negative and rollout < 2**32."""
    return (task_index << ROLLOUT_BITS) | rollout_index


def row_key(row: Mapping[str, Any]) -> int | None:
    """The rollout key of a row carrying non-negative int task and rollout indices, else None."""
    task, rollout = row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY)
    if type(task) is not int or type(rollout) is not int or task < 0 or not 0 <= rollout < 1 << ROLLOUT_BITS:
        return None
    return rollout_key(task, rollout)


def task_source_of(row: Mapping[str, Any]) -> str | None:
    """The row's ``task_source`` when it is a non-empty string, else None."""
    source = row.get(TASK_SOURCE_KEY)
    return source if isinstance(source, str) and source else None


def agent_name_of(row: Mapping[str, Any], default: str | None = None) -> str | None:
    """The agent a row goes to: its ``agent_ref.name``, else ``default``."""
    ref = row.get(AGENT_REF_KEY)
    if isinstance(ref, Mapping) and isinstance(ref.get("name"), str) and ref["name"]:
        return str(ref["name"])
    return default


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
