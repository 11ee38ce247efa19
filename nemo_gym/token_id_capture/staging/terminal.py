"""The terminal call of a staged manifest when the harness named none (a heuristic over parent links).

Among roots, one that was continued wins over ones that were not, then the earliest admitted
(unstamped last, manifest order breaking ties); at each level below, a child with descendants
wins over childless siblings; two such children make the terminal ambiguous.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nemo_gym.token_id_capture.staging.records import (
    TERMINAL_AMBIGUOUS,
    TERMINAL_DUPLICATE_CALL_ID,
    TERMINAL_NO_RECORDS,
    TERMINAL_NO_ROOT,
    TERMINAL_ORPHANED_ROW,
    TERMINAL_SELECTED,
    CallRecord,
)


@dataclass(frozen=True)
class TerminalSelection:
    """The selected terminal call, or why none could be selected."""

    terminal_model_call_id: str | None
    reason: str


def select_terminal_call(records: Sequence[CallRecord]) -> TerminalSelection:
    """Select the terminal call of ``records`` from their parent links."""
    if not records:
        return TerminalSelection(None, TERMINAL_NO_RECORDS)
    by_id = {r.model_call_id: r for r in records}
    if len(by_id) != len(records):
        return TerminalSelection(None, TERMINAL_DUPLICATE_CALL_ID)
    if any(r.parent_call_id is not None and r.parent_call_id not in by_id for r in records):
        return TerminalSelection(None, TERMINAL_ORPHANED_ROW)
    children: dict[str, list[CallRecord]] = {}
    for record in records:
        if record.parent_call_id is not None:
            children.setdefault(record.parent_call_id, []).append(record)
    roots = [r for r in records if r.parent_call_id is None]
    if not roots:
        return TerminalSelection(None, TERMINAL_NO_ROOT)
    position = {r.model_call_id: i for i, r in enumerate(records)}

    def continued_first(candidates: list[CallRecord]) -> list[CallRecord]:
        return [r for r in candidates if children.get(r.model_call_id)] or candidates

    node = min(
        continued_first(roots),
        key=lambda r: (r.admitted_at is None, r.admitted_at or 0.0, position[r.model_call_id]),
    )
    while children.get(node.model_call_id):
        pool = continued_first(children[node.model_call_id])
        if len(pool) > 1:
            return TerminalSelection(None, TERMINAL_AMBIGUOUS)
        node = pool[0]
    return TerminalSelection(node.model_call_id, TERMINAL_SELECTED)
