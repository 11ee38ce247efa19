"""A rollout's trajectory record (``ng_trajectory``), projected from its verify answer.

NeMo RL calls ``attach_trajectory_record(row, result)`` after each rollout to get one standard
record of what happened: the rollout's identity, its model calls (token counts, the output
items each produced) and its tool calls with their outputs. Here it is built from
``result["response"]["output"]``: a model call ends at each output item that carries
``generation_token_ids`` (or, without token IDs, the whole response is one call). Nothing in the
result is changed except the ``ng_trajectory`` key; a result that cannot be projected gets a
record with a ``gaps`` entry instead of an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_gym.collection.collection_io import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from nemo_gym.collection.rollouts import ROLLOUT_ID_KEY

TRAJECTORY_KEY = "ng_trajectory"
SCHEMA_VERSION = "1.0"


def trajectory_identity(row: Mapping[str, Any]) -> tuple[str, str]:
    """``(task_id, rollout_id)`` of a row: its own id fields when present, else its indices."""
    task_id = next(
        (str(row[key]) for key in ("task_id", "problem_id", "instance_id") if row.get(key) is not None),
        str(row.get(TASK_INDEX_KEY, "")),
    )
    given = row.get(ROLLOUT_ID_KEY)
    rollout_id = str(given) if given else f"{row.get(TASK_INDEX_KEY, '')}-{row.get(ROLLOUT_INDEX_KEY, '')}"
    return task_id, rollout_id


def build_trajectory_record(row: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ng_trajectory`` record of one rollout (a JSON-ready dict)."""
    task_id, rollout_id = trajectory_identity(row)
    response = result.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    if not isinstance(output, list):
        raise ValueError("result has no response.output list")
    model_calls: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    outputs_by_call: dict[str, Any] = {}
    pending: list[dict[str, Any]] = []
    for item in output:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "function_call_output":
            outputs_by_call[str(item.get("call_id"))] = item.get("output")
            continue
        pending.append({k: v for k, v in item.items() if not k.endswith(("_token_ids", "_log_probs"))})
        if kind == "function_call":
            tool_calls.append(
                {"call_id": item.get("call_id"), "name": item.get("name"), "arguments": item.get("arguments")}
            )
        ids = item.get("generation_token_ids")
        if isinstance(ids, list):
            prompt = item.get("prompt_token_ids")
            model_calls.append(_model_call(len(model_calls), pending, prompt, ids))
            pending = []
    if pending and (not model_calls or any(i.get("type") != "function_call" for i in pending)):
        model_calls.append(_model_call(len(model_calls), pending, None, None))
    # A harness program that ran its tools itself: their outputs are its own, never graded
    # (harness.program_items), but they are what the call returned: shown, marked as the program's.
    program_outputs = _program_tool_outputs(result)
    for call in tool_calls:
        call_id = str(call["call_id"])
        call["output"] = outputs_by_call.get(call_id)
        if call_id not in outputs_by_call and call_id in program_outputs:
            call["output"] = program_outputs[call_id]
            call["output_source"] = "program"
    return {
        "schema_version": SCHEMA_VERSION,
        "task_id": task_id,
        "rollout_id": rollout_id,
        "turns": [],
        "model_calls": model_calls,
        "tool_calls": tool_calls,
        "gaps": [] if model_calls else [{"code": "no_model_calls"}],
    }


def _program_tool_outputs(result: Mapping[str, Any]) -> dict[str, Any]:
    """Tool outputs a harness program wrote itself, by call id (``harness.program_items``)."""
    harness = result.get("harness")
    entries = harness.get("program_items") if isinstance(harness, Mapping) else None
    found: dict[str, Any] = {}
    for entry in entries if isinstance(entries, list) else []:
        item = entry.get("item") if isinstance(entry, Mapping) else None
        if isinstance(item, Mapping) and item.get("type") == "function_call_output":
            found.setdefault(str(item.get("call_id")), item.get("output"))
    return found


def _model_call(index: int, items: list[dict[str, Any]], prompt: Any, generation: Any) -> dict[str, Any]:
    stats: dict[str, int] = {}
    if isinstance(prompt, list):
        stats["prompt_tokens"] = len(prompt)
    if isinstance(generation, list):
        stats["completion_tokens"] = len(generation)
    if stats.keys() == {"prompt_tokens", "completion_tokens"}:
        stats["total_tokens"] = stats["prompt_tokens"] + stats["completion_tokens"]
    return {"model_call_id": f"call-{index}", "response": {"output": items}, "token_stats": stats}


def attach_trajectory_record(row: Mapping[str, Any], result: dict[str, Any]) -> None:
    """Set ``result["ng_trajectory"]``; a result that cannot be projected gets a record whose
    ``gaps`` says why. Never raises for a malformed result."""
    try:
        result[TRAJECTORY_KEY] = build_trajectory_record(row, result)
    except Exception as exc:  # noqa: BLE001 - a trainer's step must not die on one odd result
        task_id, rollout_id = trajectory_identity(row)
        result[TRAJECTORY_KEY] = {
            "schema_version": SCHEMA_VERSION,
            "task_id": task_id,
            "rollout_id": rollout_id,
            "turns": [],
            "model_calls": [],
            "tool_calls": [],
            "gaps": [{"code": "trajectory_projection_failed", "detail": f"{type(exc).__name__}: {exc}"}],
        }
