"""Which captured call produced the response a rollout was scored on (terminal attribution).

A rollout's capture holds every call the model server served: auxiliary calls, abandoned
retries, sub-agent branches. The verified ``/run`` response must be joined to exactly one of
them so the builder delivers the chain that earned the reward. Up to four independent witnesses
testify: ``explicit`` (the caller names the call), ``declared`` (the harness reports the response
id it kept; a miss there stops attribution), ``response_id`` (the response's id equals the id
recorded on one entry) and ``content`` (the fingerprint of the response's model-authored items
matches one entry's cumulative fingerprint, its own output, or the response's trailing
model-authored block). A witness that is unsure abstains; witnesses that agree (or name calls
with identical token sequences) attribute; witnesses that disagree attribute nothing, and say so.
Staged custody rows (``CallRecord``, carrying a ``staging_key``) are judged the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_gym.token_id_capture.fingerprint import (
    FINGERPRINT_VERSION,
    _is_assistant_authored,
    assistant_fingerprint,
)


@dataclass(frozen=True)
class TerminalAttribution:
    """The terminal call, the witness that named it, and every reason noted along the way."""

    model_call_id: str | None
    method: str = ""
    reason: str = ""

    @property
    def attributed(self) -> bool:
        """Whether a call was named."""
        return self.model_call_id is not None


def _is_custody_row(entry: Any) -> bool:
    return getattr(entry, "staging_key", None) is not None


def _sequence_identity(entry: Any) -> tuple[Any, ...]:
    if _is_custody_row(entry):
        return (entry.cumulative_hash, entry.chain_hash, entry.cum_len)
    if getattr(entry, "digest", None) and getattr(entry, "cum_len", None) is not None:
        return (entry.digest, entry.cum_len)
    return (tuple(entry.prompt_token_ids), tuple(entry.generation_token_ids))


def _collapse_identical(candidates: list[Any]) -> Any | None:
    """One candidate, or the smallest id among candidates with one token sequence; else None."""
    if not candidates:
        return None
    if len({_sequence_identity(c) for c in candidates}) == 1:
        return min(candidates, key=lambda c: c.model_call_id)
    return None


def _fingerprint_or_empty(items: list[dict[str, Any]]) -> str:
    try:
        return assistant_fingerprint(items)
    except (TypeError, ValueError):
        return ""


def _content_witness(
    entries: list[Any], response: dict[str, Any], reasons: list[str]
) -> tuple[str, Any] | None:
    output = response.get("output")
    if not isinstance(output, list) or not output:
        reasons.append("response_has_no_output")
        return None
    items = [item for item in output if isinstance(item, dict)]
    try:
        target = assistant_fingerprint(items)
    except (TypeError, ValueError):
        reasons.append("response_output_unfingerprintable")
        return None
    if not target:
        reasons.append("no_model_authored_output")
        return None
    trailing: list[dict[str, Any]] = []
    for item in reversed(items):
        if not _is_assistant_authored(item):
            break
        trailing.insert(0, item)
    tail = _fingerprint_or_empty(trailing) if trailing and len(trailing) != len(items) else ""
    own_targets = {target, tail} - {""}

    matches: dict[str, Any] = {}
    cumulative_hit = custody_hit = False
    for entry in entries:
        continuation = getattr(entry, "continuation_fingerprint", None)
        version = getattr(entry, "fingerprint_version", None)
        if _is_custody_row(entry):
            if version != FINGERPRINT_VERSION:
                continue
            if (continuation and continuation == target) or getattr(
                entry, "output_fingerprint", None
            ) in own_targets:
                matches[entry.model_call_id] = entry
                custody_hit = True
            continue
        if continuation and continuation == target and version in (None, FINGERPRINT_VERSION):
            matches[entry.model_call_id] = entry
            cumulative_hit = True
        if entry.output_items and _fingerprint_or_empty(list(entry.output_items)) in own_targets:
            matches[entry.model_call_id] = entry
    winner = _collapse_identical(list(matches.values()))
    if winner is None:
        reasons.append("content_ambiguous" if matches else "no_content_match")
        return None
    method = "content" if custody_hit else "content_cumulative" if cumulative_hit else "content_output"
    return method, winner


def resolve_terminal(
    entries: list[Any],
    response: dict[str, Any] | None,
    explicit_call_id: str | None = None,
    *,
    declared_response_id: str | None = None,
) -> TerminalAttribution:
    """Join the scored response to one captured call (never raises: bad content abstains)."""
    reasons: list[str] = []
    witnesses: list[tuple[str, Any]] = []
    if explicit_call_id:
        named = next((e for e in entries if e.model_call_id == explicit_call_id), None)
        if named is None:
            reasons.append("explicit_terminal_not_captured")
        else:
            witnesses.append(("explicit", named))
    if declared_response_id:
        declared = [e for e in entries if getattr(e, "response_id", None) == declared_response_id]
        winner = _collapse_identical(declared)
        if winner is None:
            reasons.append("declared_ambiguous" if declared else "declared_terminal_not_captured")
            return TerminalAttribution(None, reason=",".join(reasons))
        witnesses.append(("declared", winner))
    if isinstance(response, dict):
        response_id = str(response.get("id") or "")
        if not response_id:
            reasons.append("response_has_no_id")
        else:
            by_id = [e for e in entries if getattr(e, "response_id", None) and e.response_id == response_id]
            winner = _collapse_identical(by_id)
            if winner is not None:
                witnesses.append(("response_id", winner))
            else:
                reasons.append("response_id_ambiguous" if by_id else "response_id_no_match")
        content = _content_witness(entries, response, reasons)
        if content is not None:
            witnesses.append(content)
    else:
        reasons.append("no_response_object")
    if not witnesses:
        return TerminalAttribution(None, reason=",".join(reasons))
    if _collapse_identical([entry for _, entry in witnesses]) is None:
        detail = ";".join(f"{method}={entry.model_call_id}" for method, entry in witnesses)
        reasons.append(f"witness_disagreement[{detail}]")
        return TerminalAttribution(None, reason=",".join(reasons))
    if len(witnesses) > 1:
        reasons.append("corroborated_by=" + "+".join(method for method, _ in witnesses[1:]))
    method, named = witnesses[0]
    return TerminalAttribution(named.model_call_id, method=method, reason=",".join(reasons))
