"""Compatibility: Turning a flat dataset row into a materialized task (NeMo Gym's ``nemo_gym.task_materialization``).

A materialized task is ``{"task_id": {"taskset", "task_id"}, "task_input": {...}}``: the task's
identity and its own fields, without the routing the collector adds (``agent_ref``,
``task_source``, ``skills_ref``, every ``_ng_*`` key). The source row is not changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_gym.episode_types import TaskId
from nemo_gym.global_config import (
    AGENT_REF_KEY_NAME,
    SKILLS_REF_KEY_NAME,
    TASK_INDEX_KEY_NAME,
    TASK_SOURCE_KEY_NAME,
)

# Row keys that already name the task, in the order they are trusted.
_TASK_ID_KEYS = ("task_id", "problem_id", "instance_id")
_ROUTING_KEYS = frozenset({AGENT_REF_KEY_NAME, TASK_SOURCE_KEY_NAME, SKILLS_REF_KEY_NAME})


def materialize_task(
    row: Mapping[str, Any], *, taskset: str, task_index: int | None = None
) -> dict[str, Any]:
    """The materialized task of ``row`` in ``taskset``.

    Its id is the row's ``task_id``, ``problem_id`` or ``instance_id`` (the first present, as a
    string); a row with none is numbered by its ``_ng_task_index``, else ``task_index`` (its
    position among the source rows, before repeats: reordering datasets renumbers such rows,
    editing a prompt does not). ``ValueError`` for a row that is already materialized or that
    has neither an id nor a non-negative index.
    """
    if "task_input" in row or isinstance(row.get("task_id"), Mapping):
        raise ValueError("materialize_task takes a flat dataset row; this row is already a materialized task")
    task_id = next((str(row[key]) for key in _TASK_ID_KEYS if row.get(key) is not None), None)
    if task_id is None:
        index = row.get(TASK_INDEX_KEY_NAME, task_index)
        # bool is an int subclass; True is not a position.
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ValueError(
                f"a row without task_id/problem_id/instance_id needs a non-negative task_index "
                f"(or {TASK_INDEX_KEY_NAME}); got {index!r}"
            )
        task_id = str(index)
    task_input = {
        key: value for key, value in row.items() if key not in _ROUTING_KEYS and not key.startswith("_ng_")
    }
    return {
        "task_id": TaskId(taskset=taskset, task_id=task_id).model_dump(mode="json"),
        "task_input": task_input,
    }
