"""One rollout record through the rollout-scoped health checks: its :class:`RolloutDigest`.

Each check reads the record, its trajectory (:mod:`nemo_gym.collection.health_checks`) and the
bound calls it needs; a check whose evidence is missing is listed as unobserved instead of run,
and a check that raises is reported as ``check_execution_error`` naming it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from nemo_gym.collection.health_checks import (
    INCOMPLETE_CAPTURE_GAPS,
    LENGTH_FINISH_REASONS,
    REFERENCE_GAP_KINDS,
    Bindings,
    Call,
    bind_calls,
    call_identity,
    canonical_trajectory,
    captured_calls,
    has_content,
    has_gap,
    has_tool_call,
    is_failed,
    is_successful,
    reference_gaps,
    reference_key,
)
from nemo_gym.collection.health_types import (
    CALL_BINDING_INPUTS,
    ROLLOUT_ID_KEY,
    ROLLOUT_INDEX_KEY,
    ROLLOUT_SPECS,
    TASK_INDEX_KEY,
    CheckInput,
    Finding,
    RolloutDigest,
    Verdict,
    subject_of,
)

Subject = dict[str, int | str]


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def transcript_tokens(record: dict[str, Any]) -> tuple[int, int, bool]:
    """Prompt and completion tokens of the record's ``response.usage``, and whether both were there."""
    response = record.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return 0, 0, False
    prompt = usage.get("input_tokens", usage.get("prompt_tokens"))
    completion = usage.get("output_tokens", usage.get("completion_tokens"))
    prompt = prompt if type(prompt) is int and prompt >= 0 else None
    completion = completion if type(completion) is int and completion >= 0 else None
    return prompt or 0, completion or 0, prompt is not None and completion is not None


def _locator(call: Call, fallback: Any) -> dict[str, int | str]:
    return {"call_id": str(call.get("model_call_id") or call.get("response_id") or fallback)}


def _turns(trajectory: dict[str, Any]) -> list[tuple[dict[str, int | str], bool, bool, bool]]:
    """Per turn: ``(locator, has a message, has tool calls, references a model call)``."""
    out = []
    for position, turn in enumerate(trajectory.get("turns") or []):
        answer = turn.get("answer")
        refs = any(reference_key(ref) for ref in turn.get("model_calls") or [])
        message = has_content(answer) or has_content(turn.get("reasoning_content"))
        out.append(({"turn": turn.get("turn_no", position)}, message, has_tool_call(answer), refs))
    return out


def _by_model(calls: Sequence[Call]) -> dict[Any, list[Call]]:
    chains: dict[Any, list[Call]] = defaultdict(list)
    for call in calls:
        ref = call.get("model_ref")
        chains[(ref.get("type"), ref.get("name")) if isinstance(ref, dict) else None].append(call)
    return chains


def _in_time(chain: Sequence[Call]) -> list[Call]:
    return sorted(chain, key=lambda call: (call.get("started_at") or 0.0, call.get("call_index") or 0))


def chain_ended_on_failure(chain: Sequence[Call]) -> bool:
    """Whether one model's last call, in time, failed. Every call failed: yes. Some failed but a
    call has no start time: the order is unknown, so no (a retried failure is not an ending)."""
    failed = [call for call in chain if is_failed(call)]
    if not failed:
        return False
    if len(failed) == len(chain):
        return True
    if any(call.get("started_at") is None for call in chain):
        return False
    return is_failed(_in_time(chain)[-1])


def ended_on_failed_call(calls: Sequence[Call]) -> bool:
    """Whether any model's own last call failed."""
    return any(chain_ended_on_failure(chain) for chain in _by_model(calls).values())


def _missing_turns(
    record: dict[str, Any], trajectory: dict[str, Any], bindings: Bindings, subject: Subject
) -> list[Finding]:
    if any(message or tools or refs for _, message, tools, refs in _turns(trajectory)):
        return []
    return [
        Finding(
            check="rollout_missing_agent_turns",
            subject=subject,
            detail={"reason": "no agent turn with model activity"},
        )
    ]


def _hollow_turns(
    record: dict[str, Any], trajectory: dict[str, Any], bindings: Bindings, subject: Subject
) -> list[Finding]:
    return [
        Finding(
            check="agent_turn_hollow",
            subject=subject,
            locator=locator,
            detail={"reason": "agent turn has no message or tool calls"},
        )
        for locator, message, tools, _ in _turns(trajectory)
        if not message and not tools
    ]


def _ended_on_failure(
    record: dict[str, Any], trajectory: dict[str, Any], bindings: Bindings, subject: Subject
) -> list[Finding]:
    findings = []
    for key, chain in _by_model(captured_calls(trajectory)).items():
        if not chain_ended_on_failure(chain):
            continue
        last = _in_time(chain)[-1]
        findings.append(
            Finding(
                check="rollout_ended_on_failed_model_call",
                subject=subject,
                locator=_locator(last, last.get("call_index")),
                detail={
                    "model_ref": "/".join(str(part) for part in key) if key else None,
                    "status": last.get("status_code"),
                    "error_category": last.get("error_category"),
                    "observed_calls": len(chain),
                    "successful_calls": sum(is_successful(call) for call in chain),
                },
            )
        )
    return findings


def _per_call(
    check: str,
    bindings: Bindings,
    subject: Subject,
    detail: Callable[[dict[str, Any]], dict[str, Any] | None],
) -> list[Finding]:
    """A ``check`` finding for each matched model call whose ``detail`` is not None, located at
    that call."""
    findings = []
    for i, call in enumerate(bindings.matched):
        found = detail(call)
        if found is not None:
            findings.append(Finding(check=check, subject=subject, locator=_locator(call, i), detail=found))
    return findings


def _zero_completion(
    record: dict[str, Any], trajectory: dict[str, Any], bindings: Bindings, subject: Subject
) -> list[Finding]:
    return _per_call(
        "model_call_zero_completion_tokens",
        bindings,
        subject,
        lambda call: {"completion_tokens": 0} if call.get("tokens_out") == 0 else None,
    )


def _missing_counts(
    record: dict[str, Any], trajectory: dict[str, Any], bindings: Bindings, subject: Subject
) -> list[Finding]:
    def missing(call: dict[str, Any]) -> dict[str, Any] | None:
        names = [
            name
            for name, key in (("prompt_tokens", "tokens_in"), ("completion_tokens", "tokens_out"))
            if call.get(key) is None
        ]
        return {"missing": names} if names else None

    return _per_call("model_call_missing_token_counts", bindings, subject, missing)


def _capture_mismatch(
    record: dict[str, Any], trajectory: dict[str, Any], bindings: Bindings, subject: Subject
) -> list[Finding]:
    findings: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    problems: list[tuple[str, str, dict[str, Any]]] = [
        (key, "missing_captured_call", {}) for key in bindings.missing
    ]
    problems += [(key, "duplicated_captured_call", {"count": n}) for key, n in bindings.duplicated]
    for key, kind, extra in problems:
        call_id = key.split(":")[-1]
        if (kind, call_id) not in seen:
            seen.add((kind, call_id))
            findings.append(
                Finding(
                    check="trajectory_capture_mismatch",
                    subject=subject,
                    locator={"call_id": call_id},
                    detail={"kind": kind, **extra},
                )
            )
    for gap in reference_gaps(trajectory):
        kind = REFERENCE_GAP_KINDS[gap["code"]]
        call_id = str(gap.get("detail") or "unknown").split(":")[-1]
        if (kind, call_id) not in seen:
            findings.append(
                Finding(
                    check="trajectory_capture_mismatch",
                    subject=subject,
                    locator={"call_id": call_id},
                    detail={
                        "kind": kind,
                        "observation_gap": gap["code"],
                        "invocation_id": gap.get("invocation_id"),
                    },
                )
            )
    return findings


def _failed_calls(
    record: dict[str, Any], trajectory: dict[str, Any], bindings: Bindings, subject: Subject
) -> list[Finding]:
    last = max((call["call_index"] for call in bindings.matched), default=None)

    def failed(call: dict[str, Any]) -> dict[str, Any] | None:
        if not is_failed(call):
            return None
        return {
            "status": call.get("status_code"),
            "error_category": call.get("error_category"),
            "terminal": bindings.complete and last is not None and call["call_index"] == last,
        }

    return _per_call("model_call_failed", bindings, subject, failed)


def _token_mismatch(
    record: dict[str, Any], trajectory: dict[str, Any], bindings: Bindings, subject: Subject
) -> list[Finding]:
    prompt, completion, present = transcript_tokens(record)
    captured_prompt = sum(_count(call.get("tokens_in")) for call in bindings.matched)
    captured_completion = sum(_count(call.get("tokens_out")) for call in bindings.matched)
    if not present or (prompt, completion) == (captured_prompt, captured_completion):
        return []
    detail = {
        "transcript_prompt": prompt,
        "transcript_completion": completion,
        "capture_prompt": captured_prompt,
        "capture_completion": captured_completion,
    }
    return [Finding(check="rollout_token_count_mismatch", subject=subject, detail=detail)]


def _response_has_content(response: Any) -> bool:
    if not isinstance(response, dict):
        return False
    choices = [c for c in response.get("choices") or [] if isinstance(c, dict)]
    return (
        has_content(response.get("output_text"))
        or has_content(response.get("content"))
        or has_content(response.get("output"))
        or any(
            has_content(c.get("text")) or has_content((c.get("message") or {}).get("content"))
            for c in choices
        )
    )


def _runaway(
    record: dict[str, Any], trajectory: dict[str, Any], bindings: Bindings, subject: Subject
) -> list[Finding]:
    def runaway(call: dict[str, Any]) -> dict[str, Any] | None:
        if call.get("finish_reason") in LENGTH_FINISH_REASONS and not _response_has_content(
            call.get("response")
        ):
            return {"finish_reason": call.get("finish_reason")}
        return None

    return _per_call("model_call_runaway_generation", bindings, subject, runaway)


def _nothing(
    record: dict[str, Any], trajectory: dict[str, Any], bindings: Bindings, subject: Subject
) -> list[Finding]:
    return []  # judged outside the per-rollout pass (parse errors, duplicates across records)


ROLLOUT_CHECKS: dict[str, Callable[[dict[str, Any], dict[str, Any], Bindings, Subject], list[Finding]]] = {
    "check_execution_error": _nothing,
    "record_unreadable": _nothing,
    "rollout_duplicate_identity": _nothing,
    "rollout_missing_agent_turns": _missing_turns,
    "rollout_ended_on_failed_model_call": _ended_on_failure,
    "agent_turn_hollow": _hollow_turns,
    "model_call_zero_completion_tokens": _zero_completion,
    "model_call_missing_token_counts": _missing_counts,
    "trajectory_capture_mismatch": _capture_mismatch,
    "model_call_failed": _failed_calls,
    "rollout_token_count_mismatch": _token_mismatch,
    "model_call_runaway_generation": _runaway,
}


def _unobserved_reason(
    spec_id: str,
    reads: frozenset[CheckInput],
    record: dict[str, Any],
    trajectory: dict[str, Any] | None,
    calls: list[Call],
    turn_bindings: Bindings,
    owned_bindings: Bindings,
) -> Bindings | None:
    """The bindings a check runs on, or None when its evidence is missing (it is then unobserved)."""
    observed = trajectory is not None and not has_gap(trajectory, {"trajectory_projection_failed"})
    if CheckInput.TRAJECTORY in reads and not observed:
        return None
    gaps = trajectory if trajectory is not None else {}
    if CheckInput.AGENT_TURNS in reads and (not observed or has_gap(gaps, {"turns_unavailable"})):
        return None
    calls_complete = observed and not has_gap(gaps, INCOMPLETE_CAPTURE_GAPS)
    if CheckInput.OBSERVED_MODEL_CALLS in reads and not (calls_complete and calls):
        return None
    binding_input = next(iter(reads & CALL_BINDING_INPUTS), None)
    bindings = owned_bindings if binding_input == CheckInput.OWNED_MODEL_CALLS else turn_bindings
    if binding_input is not None:
        if not calls_complete:
            return None
        enough = (
            bool(bindings.references) or bool(reference_gaps(gaps))
            if spec_id == "trajectory_capture_mismatch"
            else bool(bindings.matched)
        )
        if not enough:
            return None
    if spec_id == "rollout_token_count_mismatch" and (
        not observed
        or has_gap(gaps, {"turn_model_call_scope_incomplete"})
        or not bindings.complete
        or not transcript_tokens(record)[2]
        or any(call.get("tokens_in") is None or call.get("tokens_out") is None for call in bindings.matched)
    ):
        return None
    if spec_id == "model_call_runaway_generation" and any(
        call.get("finish_reason") in LENGTH_FINISH_REASONS and call.get("response") is None
        for call in bindings.matched
    ):
        return None
    return bindings


def digest_rollout(
    record: dict[str, Any],
    parse_error: str | None,
    *,
    ordinal: int,
    source: tuple[str, int, int],
    ignored: frozenset[str],
) -> RolloutDigest:
    """Run every rollout check on one record. ``source`` is ``(file, file number, line)``;
    ``parse_error`` the error's type name when the line did not parse (the record is then ``{}``)."""
    path, file_number, line = source
    unreadable_id = f"__unreadable_record__:input-{file_number}:line-{line}"
    task_index = record.get(TASK_INDEX_KEY, unreadable_id if parse_error else ordinal)
    rollout_index = record.get(ROLLOUT_INDEX_KEY, 0)
    raw_trajectory = record.get("ng_trajectory")
    trajectory_id = raw_trajectory.get("rollout_id") if isinstance(raw_trajectory, dict) else None
    rollout_id = str(record.get(ROLLOUT_ID_KEY) or trajectory_id or f"{task_index}-{rollout_index}")
    subject = subject_of(task_index, rollout_index)
    trajectory, trajectory_error = (None, None) if parse_error else canonical_trajectory(record)
    observed = trajectory is not None and not has_gap(trajectory, {"trajectory_projection_failed"})
    calls = captured_calls(trajectory) if observed and trajectory is not None else []
    turn_bindings, owned_bindings = bind_calls(trajectory if observed and trajectory else {}, calls)
    findings: list[Finding] = []
    unobserved: list[str] = []
    for spec in ROLLOUT_SPECS:
        if spec.id in ignored:
            continue
        if parse_error or trajectory_error:
            if spec.id == "record_unreadable":
                reason = (
                    "rollout record is unreadable" if parse_error else "canonical trajectory is unreadable"
                )
                locator: dict[str, int | str] | None = (
                    {"source_file": path, "line": line} if parse_error else None
                )
                detail = {"reason": reason, "error": parse_error or trajectory_error}
                findings.append(Finding(check=spec.id, subject=subject, locator=locator, detail=detail))
            elif parse_error:
                unobserved.append(spec.id)
            if parse_error or spec.id == "record_unreadable":
                continue
        bindings = _unobserved_reason(
            spec.id, spec.reads, record, trajectory, calls, turn_bindings, owned_bindings
        )
        if bindings is None:
            unobserved.append(spec.id)
            continue
        try:
            findings += ROLLOUT_CHECKS[spec.id](record, trajectory or {}, bindings, subject)
        except Exception as exc:  # noqa: BLE001 - a broken check is reported, never fatal
            unobserved.append(spec.id)
            if "check_execution_error" not in ignored:
                detail = {
                    "reason": "check raised an unexpected exception",
                    "failed_check": spec.id,
                    "error": type(exc).__name__,
                }
                findings.append(Finding(check="check_execution_error", subject=subject, detail=detail))
    verdict: Verdict = "unhealthy" if findings else "unobserved" if unobserved else "healthy"
    failed = [call for call in calls if is_failed(call)]
    statuses = Counter(
        str(call["status_code"]) if call.get("status_code") is not None else "unknown" for call in failed
    )
    identities = Counter(identity for call in calls if (identity := call_identity(call)) is not None)
    prompt, completion, _ = transcript_tokens(record)
    scope_complete = (
        observed and trajectory is not None and not has_gap(trajectory, {"turn_model_call_scope_incomplete"})
    )
    return RolloutDigest(
        task_index=task_index,
        rollout_index=rollout_index,
        stage_index=record.get("stage_index"),
        rollout_id=rollout_id,
        verdict=verdict,
        findings=findings,
        unobserved=unobserved,
        capture_observed=bool(calls),
        policy_calls_observed=scope_complete and turn_bindings.complete,
        model_calls=len(calls),
        successful_model_calls=sum(is_successful(call) for call in turn_bindings.matched),
        model_call_errors=len(failed),
        errors_by_status=dict(statuses),
        ended_on_error=ended_on_failed_call(calls),
        duplicated_calls=sum(n - 1 for n in identities.values() if n > 1),
        transcript_prompt_tokens=prompt,
        transcript_completion_tokens=completion,
        capture_prompt_tokens=sum(_count(call.get("tokens_in")) for call in calls),
        capture_completion_tokens=sum(_count(call.get("tokens_out")) for call in calls),
    )
