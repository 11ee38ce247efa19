"""A rollout's trajectory from the evidence its result carries, and model-call joining.

NeMo Gym's trajectory projection (``rollout_collection._build_trajectory_record``,
``_attach_trajectory_record``) and ``rollout_observability.join_model_call_observations``:

- :func:`join_model_call_observations` resolves an agent's model-call references against the
  model server's captured calls, never guessing an owner;
- :func:`build_trajectory_from_evidence` merges the agent's own ``ng_trajectory``, its
  ``ng_agent_observations`` and the model server's ``ng_model_call_capture`` into one
  :class:`TrajectoryRecord`, each missing or invalid piece a gap;
- :func:`attach_trajectory_evidence` stores that record in the result and drops the captured
  calls' payload copies it now holds.

Not :mod:`nemo_gym.collection.trajectory`, which projects a rollout from its final response
alone (for trainers that read ``ng_trajectory`` without capture).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nemo_gym.collection.observations import (
    AgentInvocation,
    AgentObservationBundle,
    ContextCompactionObservation,
    ModelCallRef,
    ObservationGap,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryResponseMetadata,
    TrajectoryTokenStats,
    TrajectoryToolCall,
    TrajectoryTurn,
)

_JOIN_GAP_CODES = frozenset(
    {"model_call_reference_ambiguous", "model_call_reference_conflict", "model_call_reference_unmatched"}
)
# A captured call's heavy payloads: dropped from the capture once the trajectory holds them.
CAPTURE_PAYLOAD_KEYS = ("request", "response", "request_raw", "response_raw")
_CALL_METADATA_KEYS = tuple(TrajectoryResponseMetadata.model_fields)


def _ref_key(ref: Any) -> tuple[str, str] | None:
    return (ref.type, ref.name) if ref is not None else None


def _canonical_ref(call: Any) -> ModelCallRef:
    return ModelCallRef(
        model_call_id=call.model_call_id, model_ref=call.model_ref, response_id=call.response_id
    )


def join_model_call_observations(
    bundle: AgentObservationBundle, calls: Iterable[Any]
) -> AgentObservationBundle:
    """``bundle`` with its model-call references resolved against captured calls (each a
    ``ModelCallRecord``: ``model_call_id``, ``response_id``, ``model_ref``, ``client_session_id``,
    ``call_index``).

    A captured call whose ``client_session_id`` names an invocation is added to that invocation's
    references. Each reference that matches exactly one captured call becomes that call's full
    identity; one that matches none, several, or a call another invocation already owns stays
    as written, with a gap saying so. Captured calls no invocation owns get an
    ``model_call_ownership_unavailable`` gap. Nothing is guessed. ``bundle`` is not changed.
    """
    result = bundle.model_copy(deep=True)
    invocations = [r for r in result.records if isinstance(r, AgentInvocation)]
    compactions = [r for r in result.records if isinstance(r, ContextCompactionObservation)]
    captured = list(calls)
    by_invocation = {invocation.invocation_id: invocation for invocation in invocations}

    for call in captured:
        invocation = by_invocation.get(call.client_session_id or "")
        if invocation is None or not call.model_call_id:
            continue
        if not any(_same_call(ref, call) for ref in invocation.model_calls):
            invocation.model_calls = [*invocation.model_calls, _canonical_ref(call)]

    def candidates(ref: ModelCallRef) -> list[Any]:
        return [call for call in captured if _same_call(ref, call)]

    result.gaps = [
        gap
        for gap in bundle.gaps
        if gap.code not in _JOIN_GAP_CODES
        and not (
            gap.code == "model_call_ownership_unavailable"
            and gap.invocation_id is None
            and (gap.detail or "").startswith("capture:")
        )
    ]
    gaps: list[ObservationGap] = []
    owner: dict[int, str] = {}

    def unresolved(ref: ModelCallRef, found: list[Any], invocation_id: str, prefix: str = "") -> None:
        code = "model_call_reference_ambiguous" if found else "model_call_reference_unmatched"
        detail = f"{prefix}{ref.model_call_id or ref.response_id}"
        gaps.append(ObservationGap(code=code, invocation_id=invocation_id, detail=detail))

    for invocation in invocations:
        resolved: list[ModelCallRef] = []
        for ref in invocation.model_calls:
            found = candidates(ref)
            if len(found) != 1:
                unresolved(ref, found, invocation.invocation_id)
                resolved.append(ref)
            elif id(found[0]) in owner:
                gaps.append(
                    ObservationGap(
                        code="model_call_reference_conflict",
                        invocation_id=invocation.invocation_id,
                        detail=found[0].model_call_id or found[0].response_id,
                    )
                )
                resolved.append(ref)
            else:
                owner[id(found[0])] = invocation.invocation_id
                resolved.append(_canonical_ref(found[0]))
        invocation.model_calls = resolved

    for compaction in compactions:
        resolved = []
        for ref in compaction.model_calls:
            found = candidates(ref)
            holder = owner.get(id(found[0])) if len(found) == 1 else None
            if len(found) != 1:
                unresolved(ref, found, compaction.invocation_id, "model_calls:")
                resolved.append(ref)
            elif holder != compaction.invocation_id:
                code = "model_call_reference_conflict" if holder else "model_call_ownership_unavailable"
                detail = f"model_calls:{found[0].model_call_id or found[0].response_id}"
                gaps.append(ObservationGap(code=code, invocation_id=compaction.invocation_id, detail=detail))
                resolved.append(ref)
            else:
                resolved.append(_canonical_ref(found[0]))
        compaction.model_calls = resolved
        for name in ("before_model_call", "after_model_call"):
            ref = getattr(compaction, name)
            if ref is None:
                continue
            found = candidates(ref)
            if len(found) != 1:
                unresolved(ref, found, compaction.invocation_id, f"{name}:")
                continue
            holder = owner.get(id(found[0]))
            if holder is not None and holder != compaction.invocation_id:
                detail = f"{name}:{found[0].model_call_id or found[0].response_id}"
                gaps.append(
                    ObservationGap(
                        code="model_call_reference_conflict",
                        invocation_id=compaction.invocation_id,
                        detail=detail,
                    )
                )
                continue
            setattr(compaction, name, _canonical_ref(found[0]))

    gaps += [
        ObservationGap(
            code="model_call_ownership_unavailable",
            detail=f"capture:{call.model_call_id or call.response_id or 'unknown'}:call_index={call.call_index}",
        )
        for call in captured
        if id(call) not in owner
    ]
    result.gaps = _unique_gaps([*result.gaps, *gaps])
    return result


def _same_call(ref: ModelCallRef, call: Any) -> bool:
    """Whether a reference names a captured call: by ``model_call_id`` (and, where the reference
    gives them, the same model server and response id), else by model server and response id."""
    if ref.model_call_id:
        return (
            ref.model_call_id == call.model_call_id
            and (ref.model_ref is None or _ref_key(ref.model_ref) == _ref_key(call.model_ref))
            and (ref.response_id is None or ref.response_id == call.response_id)
        )
    return (
        ref.model_ref is not None
        and bool(ref.response_id)
        and _ref_key(ref.model_ref) == _ref_key(call.model_ref)
        and ref.response_id == call.response_id
    )


def _unique_gaps(gaps: Iterable[ObservationGap]) -> list[ObservationGap]:
    return list({(gap.code, gap.invocation_id, gap.detail): gap for gap in gaps}.values())


def _field(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, Mapping) else getattr(item, key, None)


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _turn_parts(request: Any, response: Any) -> tuple[Any, Any, Any, int]:
    """``(question, answer, reasoning, tool calls)`` of one captured call, Responses or Chat dialect."""
    question = request.get("input", request.get("messages")) if isinstance(request, dict) else request
    if isinstance(request, dict) and isinstance(request.get("input"), list):
        # An input message may leave out ``type`` (it defaults to "message"); a turn states it.
        question = [
            {"type": "message", **item}
            if isinstance(item, dict) and "role" in item and "type" not in item
            else item
            for item in request["input"]
        ]
    if isinstance(response, dict) and isinstance(response.get("output"), list):
        items = [item for item in response["output"] if isinstance(item, dict)]
        reasoning = [item for item in items if item.get("type") == "reasoning"] or None
        answer = [item for item in items if item.get("type") != "reasoning"]
        return question, answer, reasoning, sum(item.get("type") == "function_call" for item in answer)
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message") or {}
        thought = message.get("reasoning_content") or message.get("reasoning")
        said = {k: v for k, v in message.items() if k not in ("reasoning_content", "reasoning")}
        return question, said, thought, len(message.get("tool_calls") or [])
    return question, None, None, 0


def _turns_of_calls(
    identity: tuple[str, str],
    invocations: list[AgentInvocation],
    calls: list[TrajectoryModelCall],
    resolved: Any,
) -> list[TrajectoryTurn]:
    """One turn per answered model call that an invocation references (other captured calls,
    a judge's say, are evidence but no agent turn)."""
    owner: dict[str, str] = {}
    for invocation in invocations:
        for ref in invocation.model_calls:
            for key in (ref.model_call_id, ref.response_id and f"response:{ref.response_id}"):
                if key:
                    owner.setdefault(key, invocation.invocation_id)
    turns: list[TrajectoryTurn] = []
    numbers: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    for call in calls:
        response_id = call.response_metadata.response_id
        invocation_id = owner.get(call.model_call_id or "") or owner.get(f"response:{response_id}")
        if call.response is None or invocation_id is None:
            continue
        question, answer, reasoning, tool_calls = _turn_parts(call.request, call.response)
        numbers[invocation_id] += 1
        ref = ModelCallRef(
            model_call_id=call.model_call_id,
            model_ref=call.response_metadata.model_ref,
            response_id=response_id,
        )
        turns.append(
            TrajectoryTurn(
                invocation_id=invocation_id,
                task_id=identity[0],
                rollout_id=identity[1],
                turn_no=numbers[invocation_id],
                timestamp=call.started_at or call.completed_at or 0.0,
                question=question,
                answer=answer,
                reasoning_content=reasoning,
                step_count=steps[invocation_id],
                model_calls=[ref],
            )
        )
        steps[invocation_id] += tool_calls
    if turns and isinstance(resolved, bool):
        turns[-1] = turns[-1].model_copy(update={"resolved": resolved})
    return turns


def _captured_call(raw: dict[str, Any]) -> TrajectoryModelCall:
    metadata = {key: raw[key] for key in _CALL_METADATA_KEYS if raw.get(key) is not None}
    response = raw.get("response") if raw.get("response") is not None else raw.get("response_raw")
    if isinstance(raw.get("response"), dict) and isinstance(raw["response"].get("status"), str):
        metadata.setdefault("response_status", raw["response"]["status"])
    return TrajectoryModelCall(
        model_call_id=raw.get("model_call_id"),
        started_at=raw.get("started_at"),
        completed_at=raw.get("completed_at"),
        duration_ms=raw.get("latency_total_ms"),
        request=raw.get("request") if raw.get("request") is not None else raw.get("request_raw"),
        response=response,
        response_metadata=TrajectoryResponseMetadata.model_validate(metadata),
        token_stats=TrajectoryTokenStats(
            prompt_tokens=_count(raw.get("tokens_in")),
            completion_tokens=_count(raw.get("tokens_out")),
            reasoning_tokens=_count(raw.get("tokens_reasoning")),
            total_tokens=_count(raw.get("tokens_total")),
            cached_tokens=_count(raw.get("cached_tokens")),
        ),
    )


def build_trajectory_from_evidence(identity: tuple[str, str], result: Mapping[str, Any]) -> TrajectoryRecord:
    """The :class:`TrajectoryRecord` of one rollout from the evidence its result carries.

    Evidence, each optional: the agent's own ``ng_trajectory`` (its turns win), its
    ``ng_agent_observations`` bundle (invocations and tool calls, merged in) and the model
    server's ``ng_model_call_capture`` (``calls`` become model calls, merged by ``model_call_id``;
    without an agent trajectory each answered call an invocation references is a turn). Whatever
    is missing or invalid becomes a gap (``turns_unavailable``, ``agent_observations_invalid``,
    ...) rather than an error.
    """
    gaps: list[ObservationGap] = []
    invocations: list[AgentInvocation] = []
    turns: list[TrajectoryTurn] = []
    tools: list[TrajectoryToolCall] = []
    calls: list[TrajectoryModelCall] = []
    own = result.get("ng_trajectory")
    own_turns = False
    if isinstance(own, dict):
        try:
            produced = TrajectoryRecord.model_validate(own)
        except Exception as exc:  # noqa: BLE001 - a producer's bad record is a gap, not a failed rollout
            gaps.append(ObservationGap(code="producer_trajectory_invalid", detail=type(exc).__name__))
        else:
            own_turns = True
            mismatched = [
                name
                for name, value in zip(("task_id", "rollout_id"), identity, strict=True)
                if getattr(produced, name) != value
            ]
            turns = produced.turns
            if mismatched:
                gaps.append(
                    ObservationGap(code="producer_trajectory_identity_mismatch", detail=",".join(mismatched))
                )
                turns = [
                    t.model_copy(update={"task_id": identity[0], "rollout_id": identity[1]}) for t in turns
                ]
            gaps += produced.gaps
            invocations, tools, calls = produced.invocations, produced.tool_calls, produced.model_calls
    if result.get("ng_agent_observations") is not None:
        try:
            bundle = AgentObservationBundle.model_validate(result["ng_agent_observations"])
            gaps += bundle.gaps
            known = {invocation.invocation_id for invocation in invocations}
            invocations += [
                r for r in bundle.records if isinstance(r, AgentInvocation) and r.invocation_id not in known
            ]
            _merge_tool_observations(
                tools, invocations, [r for r in bundle.records if isinstance(r, ToolCallObservation)]
            )
        except Exception as exc:  # noqa: BLE001 - as above
            gaps.append(ObservationGap(code="agent_observations_invalid", detail=type(exc).__name__))
    turns.sort(key=lambda turn: (turn.timestamp, turn.invocation_id, turn.turn_no))

    capture = result.get("ng_model_call_capture")
    capture = capture if isinstance(capture, dict) else {}
    positions = {call.model_call_id: i for i, call in enumerate(calls) if call.model_call_id is not None}
    for raw in capture.get("calls") or []:
        if not isinstance(raw, dict):
            continue
        projected = _captured_call(raw)
        at = positions.pop(projected.model_call_id, None) if projected.model_call_id is not None else None
        if at is None:
            calls.append(projected)
            continue
        merged = calls[at].model_dump(mode="json")
        update = projected.model_dump(mode="json", exclude_none=True)
        for key in ("response_metadata", "token_stats"):
            merged[key].update(update.pop(key))
        calls[at] = TrajectoryModelCall.model_validate({**merged, **update})
    for raw_gap in capture.get("gaps") or []:
        if isinstance(raw_gap, dict):
            try:
                gaps.append(ObservationGap.model_validate(raw_gap))
            except ValueError:
                gaps.append(ObservationGap(code="model_call_capture_gap_invalid"))
    if not isinstance(own, dict):
        # An agent that sent its own trajectory owns its turns (an empty list means none finished).
        turns = _turns_of_calls(identity, invocations, calls, result.get("resolved"))
    if not calls:
        gaps.append(ObservationGap(code="model_calls_unavailable"))
    if not turns and not own_turns:
        gaps.append(ObservationGap(code="turns_unavailable"))
    if not any(invocation.conversation for invocation in invocations):
        gaps.append(ObservationGap(code="conversation_unavailable"))
    return TrajectoryRecord(
        task_id=identity[0],
        rollout_id=identity[1],
        invocations=invocations,
        turns=turns,
        model_calls=calls,
        tool_calls=tools,
        gaps=_unique_gaps(gaps),
    )


def _merge_tool_observations(
    tools: list[TrajectoryToolCall], invocations: list[AgentInvocation], observed: list[ToolCallObservation]
) -> None:
    """Fold observed tool calls into ``tools`` by (invocation, tool call id), with the output the
    invocation's conversation recorded for the call; an observed ``unknown`` status keeps a known one."""
    if not observed:
        return
    outputs = {
        (invocation.invocation_id, _field(item, "call_id")): _field(item, "output")
        for invocation in invocations
        for item in invocation.conversation
        if _field(item, "type") == "function_call_output"
    }
    positions = {(tool.invocation_id, tool.tool_call_id): i for i, tool in enumerate(tools)}
    for observation in observed:
        key = (observation.invocation_id, observation.tool_call_id)
        at = positions.get(key)
        merged = tools[at].model_dump(mode="json") if at is not None else {}
        update = observation.model_dump(mode="json", exclude_none=True)
        if at is not None and observation.status == "unknown" and tools[at].status != "unknown":
            update.pop("status", None)
        merged.update(update)
        if key in outputs:
            merged["output"] = outputs[key]
        projected = TrajectoryToolCall.model_validate(merged)
        if at is None:
            positions[key] = len(tools)
            tools.append(projected)
        else:
            tools[at] = projected


def attach_trajectory_evidence(
    row: Mapping[str, Any],
    result: dict[str, Any],
    identity_of: Callable[[Mapping[str, Any]], tuple[str, str]],
) -> None:
    """Set ``result["ng_trajectory"]`` from the rollout's evidence and drop the captured calls'
    payload copies it now holds. Never raises: a projection that fails leaves the raw evidence
    and a ``trajectory_projection_failed`` gap."""
    try:
        result["ng_trajectory"] = build_trajectory_from_evidence(identity_of(row), result).model_dump(
            mode="json"
        )
    except Exception as exc:  # noqa: BLE001 - one odd rollout must not stop a collection
        result.pop("ng_trajectory", None)
        gap = {"code": "trajectory_projection_failed", "detail": type(exc).__name__}
        holder = result.get("ng_model_call_capture")
        if not isinstance(holder, dict):
            holder = result.get("ng_agent_observations")
        if isinstance(holder, dict) and isinstance(holder.setdefault("gaps", []), list):
            holder["gaps"].append(gap)
            return
        try:
            task_id, rollout_id = identity_of(row)
        except (KeyError, ValueError):
            return
        record = TrajectoryRecord(task_id=task_id, rollout_id=rollout_id, gaps=[ObservationGap(**gap)])
        result["ng_trajectory"] = record.model_dump(mode="json")
        return
    capture = result.get("ng_model_call_capture")
    for call in capture.get("calls") or [] if isinstance(capture, dict) else []:
        if isinstance(call, dict):
            for key in CAPTURE_PAYLOAD_KEYS:
                call.pop(key, None)
