"""The per-rollout health checks: what a rollout record's ``ng_trajectory`` says about its turns
and model calls, and which of :data:`~nemo_gym.collection.health_types.CHECK_REGISTRY`'s rollout
checks find something in it.

A rollout's turns (and agent invocations) reference model calls by ``model_call_id`` or by
``(model_ref, response_id)``; the trajectory's ``model_calls`` are the calls the model server
captured. *Binding* resolves each reference to exactly one captured call: a reference with no
match is a missing capture, one with several is ambiguous. Checks that read bound calls are
unobserved when nothing is bound; every check is unobserved without a readable trajectory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym.collection.observations import TrajectoryRecord

TRAJECTORY_KEY = "ng_trajectory"
TOOL_CALL_TYPES = frozenset(
    {
        "function_call", "tool_call", "tool_use", "mcp_call", "mcp_list_tools", "mcp_approval_request",
        "file_search_call", "web_search_call", "computer_call", "image_generation_call",
        "code_interpreter_call", "local_shell_call", "custom_tool_call",
    }
)  # fmt: skip
INCOMPLETE_CAPTURE_GAPS = frozenset(
    {
        "model_calls_unavailable",
        "model_call_capture_incomplete",
        "model_call_capture_records_unreadable",
        "model_call_capture_unreadable",
    }
)
REFERENCE_GAP_KINDS = {
    "model_call_reference_unmatched": "missing_captured_call",
    "model_call_reference_ambiguous": "duplicated_captured_call",
    "model_call_reference_conflict": "conflicting_call_ownership",
}
LENGTH_FINISH_REASONS = frozenset({"length", "max_output_tokens", "max_tokens"})
_CONTENT_KEYS = (
    "text", "content", "output_text", "answer", "refusal", "encrypted_content", "reasoning",
    "reasoning_content", "summary",
)  # fmt: skip

Call = dict[str, Any]


def has_content(value: Any) -> bool:
    """Whether a message-like value carries any text (nested lists and content parts included)."""
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, list | tuple):
        return any(has_content(item) for item in value)
    if isinstance(value, dict):
        return any(has_content(value.get(key)) for key in _CONTENT_KEYS)
    return False


def has_tool_call(item: Any) -> bool:
    """Whether an answer (an item or a list of them) holds a tool call."""
    if isinstance(item, list | tuple):
        return any(has_tool_call(value) for value in item)
    return isinstance(item, dict) and (item.get("type") in TOOL_CALL_TYPES or bool(item.get("tool_calls")))


def reference_key(ref: Any) -> str | None:
    """``call:<id>`` or ``response:<type>:<name>:<response id>``; None for an unusable reference."""
    if not isinstance(ref, dict):
        return None
    if ref.get("model_call_id"):
        return f"call:{ref['model_call_id']}"
    model_ref, response_id = ref.get("model_ref"), ref.get("response_id")
    if isinstance(model_ref, dict) and response_id:
        return f"response:{model_ref.get('type')}:{model_ref.get('name')}:{response_id}"
    return None


def call_identity(call: Call) -> str | None:
    """A captured call's identity, for spotting the same call recorded twice."""
    return reference_key(call) or (f"response::{call['response_id']}" if call.get("response_id") else None)


def canonical_trajectory(record: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The record's ``ng_trajectory`` validated as a trajectory record, or the error's type name."""
    raw = record.get(TRAJECTORY_KEY)
    if raw is None:
        return None, None
    try:
        return TrajectoryRecord.model_validate(raw).model_dump(mode="json"), None
    except Exception as exc:  # noqa: BLE001 - any malformed trajectory is a finding, never a crash
        return None, type(exc).__name__


def has_gap(trajectory: dict[str, Any], codes: frozenset[str] | set[str]) -> bool:
    """Whether the trajectory records an observation gap with one of ``codes``."""
    return any(isinstance(gap, dict) and gap.get("code") in codes for gap in trajectory.get("gaps") or [])


def reference_gaps(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The gaps in which the producer said its own call references contradict the capture."""
    return [
        g
        for g in trajectory.get("gaps") or []
        if isinstance(g, dict) and g.get("code") in REFERENCE_GAP_KINDS
    ]


def captured_calls(trajectory: dict[str, Any]) -> list[Call]:
    """The trajectory's captured model calls, flattened to what the checks read."""
    calls = []
    for position, raw in enumerate(trajectory.get("model_calls") or []):
        meta, tokens = raw.get("response_metadata") or {}, raw.get("token_stats") or {}
        calls.append(
            {
                "call_index": position,
                "started_at": raw.get("started_at"),
                "model_call_id": raw.get("model_call_id"),
                "response_id": meta.get("response_id"),
                "model_ref": meta.get("model_ref"),
                "status_code": meta.get("status_code"),
                "response_status": meta.get("response_status"),
                "finish_reason": meta.get("finish_reason"),
                "error_category": meta.get("error_category"),
                "tokens_in": tokens.get("prompt_tokens"),
                "tokens_out": tokens.get("completion_tokens"),
                "response": raw.get("response"),
            }
        )
    return calls


def is_failed(call: Call) -> bool:
    """An HTTP status >= 400, an error category, or a failed/errored/cancelled response."""
    status, response_status = call.get("status_code"), call.get("response_status")
    return (
        (isinstance(status, int) and status >= 400)
        or bool(call.get("error_category"))
        or response_status in ("failed", "error", "cancelled")
    )


def is_successful(call: Call) -> bool:
    """Not failed, and a 2xx/3xx status when one was recorded."""
    status = call.get("status_code")
    return not is_failed(call) and (status is None or (isinstance(status, int) and 200 <= status < 400))


@dataclass(frozen=True)
class Bindings:
    """References resolved against the captured calls."""

    references: tuple[str, ...]
    matched: tuple[Call, ...]
    missing: tuple[str, ...]
    duplicated: tuple[tuple[str, int], ...]

    @property
    def complete(self) -> bool:
        """Some reference, and every one bound to exactly one call."""
        return bool(self.references) and not self.missing and not self.duplicated


def _references(items: Any) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for item in items or []:
        for ref in (item.get("model_calls") or []) if isinstance(item, dict) else []:
            key = reference_key(ref)
            if key is not None and isinstance(ref, dict):
                found.append((key, ref))
    return found


def _signature(ref: dict[str, Any]) -> tuple[str, str, str, str]:
    raw = ref.get("model_ref")
    model_ref: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return (
        str(ref.get("model_call_id") or ""),
        str(model_ref.get("type") or ""),
        str(model_ref.get("name") or ""),
        str(ref.get("response_id") or ""),
    )


def _unique(refs: Sequence[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    seen: set[tuple[str, str, str, str]] = set()
    unique = []
    for key, ref in refs:
        if _signature(ref) not in seen:
            seen.add(_signature(ref))
            unique.append((key, ref))
    return unique


def bind_calls(trajectory: dict[str, Any], calls: list[Call]) -> tuple[Bindings, Bindings]:
    """``(turn bindings, owned bindings)``: the turns' references, and the turns' plus the agent
    invocations' references, each resolved against ``calls``."""
    turn_refs = _unique(_references(trajectory.get("turns")))
    owned_refs = _unique([*turn_refs, *_references(trajectory.get("invocations"))])
    by_id: dict[str, list[Call]] = defaultdict(list)
    by_response: dict[tuple[str, str, str], list[Call]] = defaultdict(list)
    for call in calls:
        if call.get("model_call_id"):
            by_id[str(call["model_call_id"])].append(call)
        model_ref = call.get("model_ref")
        if isinstance(model_ref, dict) and call.get("response_id"):
            by_response[
                (str(model_ref.get("type")), str(model_ref.get("name")), str(call["response_id"]))
            ].append(call)

    def matches(ref: dict[str, Any]) -> list[Call]:
        model_ref, response_id = ref.get("model_ref"), ref.get("response_id")
        if ref.get("model_call_id"):
            return [
                call
                for call in by_id.get(str(ref["model_call_id"]), [])
                if (model_ref is None or model_ref == call.get("model_ref"))
                and (response_id is None or response_id == call.get("response_id"))
            ]
        assert isinstance(model_ref, dict)
        return by_response.get((str(model_ref.get("type")), str(model_ref.get("name")), str(response_id)), [])

    def bind(refs: list[tuple[str, dict[str, Any]]]) -> Bindings:
        matched: dict[int, Call] = {}
        missing, duplicated = [], []
        for key, ref in refs:
            found = matches(ref)
            if not found:
                missing.append(key)
            elif len(found) > 1:
                duplicated.append((key, len(found)))
            else:
                matched.setdefault(found[0]["call_index"], found[0])
        ordered = tuple(matched[index] for index in sorted(matched))
        return Bindings(tuple(key for key, _ in refs), ordered, tuple(missing), tuple(duplicated))

    return bind(turn_refs), bind(owned_refs)
