"""Checks that a trainer's own capture transport keeps the contracts Gym's capture relies on.

``await run_conformance(sink_factory, source_factory, lineage_factory)`` runs each named check
on a rollout id of its own (a failed check cannot poison the next) and returns the names that
passed; the first failure raises :class:`ConformanceError` naming the check. Factories must
return fresh clients of one shared backend: visibility across clients is what is checked.
Lineage checks run only with a ``lineage_factory``; the intent check only when the sink offers
``begin_call``. Nothing here imports a server stack.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nemo_gym.token_id_capture.lineage import stamp_continuation
from nemo_gym.token_id_capture.protocols import LineageResolver, TokenSink, TokenSource
from nemo_gym.token_id_capture.records import (
    ParentResolutionStatus,
    TokenEntry,
    cumulative_tokens,
    stamp_lineage,
)

_REQUEST: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]


class ConformanceError(AssertionError):
    """A named contract check failed."""

    def __init__(self, check_name: str, detail: str) -> None:
        self.check_name = check_name
        self.detail = detail
        super().__init__(f"{check_name}: {detail}")


def _require(ok: bool, check: str, detail: str) -> None:
    if not ok:
        raise ConformanceError(check, detail)


def _entry(rollout_id: str, call_id: str, prompt: list[int], generation: list[int], text: str) -> TokenEntry:
    """A committed root entry as capture would write it."""
    entry = TokenEntry(
        rollout_id=rollout_id,
        model_call_id=call_id,
        model="conformance-model",
        prompt_token_ids=prompt,
        generation_token_ids=generation,
        generation_log_probs=[-0.1] * len(generation),
        output_items=[
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        ],
        token_item_index=0,
        created_at=1700000000.0,
    )
    stamp_continuation(entry, list(_REQUEST))
    return stamp_lineage(entry, None, parent_resolution=ParentResolutionStatus.ROOT)


def _first(rollout_id: str) -> TokenEntry:
    return _entry(rollout_id, "call-1", [11, 12], [13, 14], "a")


async def _put_then_freeze(sink: TokenSink, source: Callable[[], TokenSource], rollout_id: str) -> None:
    entry = _first(rollout_id)
    await sink.put(entry)
    snapshot = await source().freeze(rollout_id)
    check = "put_then_freeze_visibility"
    _require(len(snapshot.entries) == 1, check, f"expected one entry, got {len(snapshot.entries)}")
    _require(
        not snapshot.incomplete and bool(snapshot.snapshot_id),
        check,
        "a clean rollout froze incomplete or without an id",
    )
    _require(
        snapshot.entries[0].model_dump(mode="json") == entry.model_dump(mode="json"),
        check,
        "the frozen entry differs from the one put",
    )


async def _idempotent_reput(sink: TokenSink, source: Callable[[], TokenSource], rollout_id: str) -> None:
    entry = _first(rollout_id)
    await sink.put(entry)
    await sink.put(TokenEntry.model_validate(entry.model_dump(mode="json")))
    snapshot = await source().freeze(rollout_id)
    _require(
        len(snapshot.entries) == 1 and not snapshot.incomplete,
        "idempotent_reput",
        "an identical retry duplicated the entry or masked the rollout",
    )


async def _conflicting_reput(sink: TokenSink, source: Callable[[], TokenSource], rollout_id: str) -> None:
    await sink.put(_first(rollout_id))
    try:
        await sink.put(_entry(rollout_id, "call-1", [11, 12], [15], "b"))
    except Exception:  # noqa: BLE001 - refusing at the writer is the first acceptable answer
        return
    snapshot = await source().freeze(rollout_id)
    _require(
        snapshot.incomplete, "conflicting_reput", "a different payload for one call id was accepted silently"
    )


async def _mark_incomplete(sink: TokenSink, source: Callable[[], TokenSource], rollout_id: str) -> None:
    check = "mark_incomplete_durability"
    await sink.put(_first(rollout_id))
    before = await source().freeze(rollout_id)
    await sink.mark_incomplete(rollout_id, "call-2")
    after = await source().freeze(rollout_id)
    _require(after.incomplete, check, "a fresh source does not see the incomplete marker")
    _require(after.version != before.version, check, "mark_incomplete did not change the version")
    stale = await source().drop(rollout_id, snapshot_id=before.snapshot_id, version=before.version)
    _require(not stale, check, "a snapshot made stale by mark_incomplete was retired")


async def _freeze_idempotency(sink: TokenSink, source: Callable[[], TokenSource], rollout_id: str) -> None:
    await sink.put(_first(rollout_id))
    first, second = await source().freeze(rollout_id), await source().freeze(rollout_id)
    same = (first.snapshot_id, first.version, {e.model_call_id: e.digest for e in first.entries}) == (
        second.snapshot_id, second.version, {e.model_call_id: e.digest for e in second.entries},
    )  # fmt: skip
    _require(same, "freeze_idempotency", "freezing twice changed the snapshot id, version or entries")


async def _post_freeze_write(sink: TokenSink, source: Callable[[], TokenSource], rollout_id: str) -> None:
    src = source()
    await sink.put(_first(rollout_id))
    snapshot = await src.freeze(rollout_id)
    try:
        await sink.put(_entry(rollout_id, "call-2", [11, 12, 13, 14], [15], "b"))
    except Exception:  # noqa: BLE001 - a hard fence is acceptable
        return
    stale = await src.drop(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    _require(
        not stale, "post_freeze_write_safety", "a write raced the freeze, yet the stale snapshot was retired"
    )


async def _conditional_retirement(
    sink: TokenSink, source: Callable[[], TokenSource], rollout_id: str
) -> None:
    check = "conditional_retirement"
    src = source()
    await sink.put(_first(rollout_id))
    snapshot = await src.freeze(rollout_id)
    _require(
        not await src.drop(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version + 1),
        check,
        "a stale-version retirement succeeded",
    )
    _require(
        len((await src.freeze(rollout_id)).entries) == 1, check, "a refused retirement discarded the evidence"
    )
    _require(
        await src.drop(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version),
        check,
        "retiring the exact snapshot failed",
    )


async def _lineage_visibility(
    sink: TokenSink, lineage: Callable[[], LineageResolver], rollout_id: str, fresh: bool
) -> None:
    check = "fresh_client_lineage_visibility" if fresh else "lineage_visibility"
    resolver = None if fresh else lineage()
    entry = _entry(rollout_id, "call-1", [101, 102, 103], [201, 202], "It is sunny.")
    await sink.put(entry)
    resolver = resolver or lineage()
    faithful = [*_REQUEST, *entry.output_items, {"role": "user", "content": "And tomorrow?"}]
    resolution = await resolver.resolve(rollout_id, faithful)
    _require(
        resolution.status == ParentResolutionStatus.RESOLVED,
        check,
        f"a faithful continuation resolved {resolution.status.value}: {resolution.reason}",
    )
    assert resolution.match is not None
    _require(resolution.match.model_call_id == "call-1", check, "resolved to the wrong parent")
    _require(
        list(resolution.match.cumulative_token_ids) == cumulative_tokens(entry),
        check,
        "the parent's cumulative tokens are wrong",
    )
    rewritten = await resolver.resolve(
        rollout_id, [{"role": "user", "content": "REWRITTEN"}, *entry.output_items]
    )
    _require(
        rewritten.status == ParentResolutionStatus.UNRESOLVED,
        check,
        f"a rewritten context resolved {rewritten.status.value}",
    )
    root = await resolver.resolve(rollout_id, [{"role": "user", "content": "fresh question"}])
    _require(
        root.status == ParentResolutionStatus.ROOT,
        check,
        f"a request with no model turn resolved {root.status.value}",
    )


async def _begin_call_custody(sink: TokenSink, source: Callable[[], TokenSource], rollout_id: str) -> None:
    await sink.begin_call(rollout_id, "call-lost")  # type: ignore[attr-defined]
    snapshot = await source().freeze(rollout_id)
    _require(
        snapshot.incomplete, "begin_call_custody", "an announced call with no entry did not mask the rollout"
    )


async def run_conformance(
    sink_factory: Callable[[], TokenSink],
    source_factory: Callable[[], TokenSource],
    lineage_factory: Callable[[], LineageResolver] | None = None,
    *,
    rollout_id: str = "conformance-rollout",
) -> list[str]:
    """Run the checks in order; return the names that passed (the first failure raises)."""
    opened: list[Any] = []

    def track(factory: Callable[[], Any]) -> Callable[[], Any]:
        def make() -> Any:
            opened.append(factory())
            return opened[-1]

        return make

    sink, source = track(sink_factory), track(source_factory)
    checks: list[tuple[str, Callable[[str], Awaitable[None]]]] = [
        ("put_then_freeze_visibility", lambda r: _put_then_freeze(sink(), source, r)),
        ("idempotent_reput", lambda r: _idempotent_reput(sink(), source, r)),
        ("conflicting_reput", lambda r: _conflicting_reput(sink(), source, r)),
        ("mark_incomplete_durability", lambda r: _mark_incomplete(sink(), source, r)),
        ("freeze_idempotency", lambda r: _freeze_idempotency(sink(), source, r)),
        ("post_freeze_write_safety", lambda r: _post_freeze_write(sink(), source, r)),
        ("conditional_retirement", lambda r: _conditional_retirement(sink(), source, r)),
    ]
    if lineage_factory is not None:
        lineage = track(lineage_factory)
        checks += [
            ("lineage_visibility", lambda r: _lineage_visibility(sink(), lineage, r, False)),
            ("fresh_client_lineage_visibility", lambda r: _lineage_visibility(sink(), lineage, r, True)),
        ]
    if getattr(sink(), "begin_call", None) is not None:
        checks.append(("begin_call_custody", lambda r: _begin_call_custody(sink(), source, r)))
    passed: list[str] = []
    try:
        for name, check in checks:
            try:
                await check(f"{rollout_id}-{name.replace('_', '-')}")
            except ConformanceError:
                raise
            except Exception as exc:  # noqa: BLE001 - a backend that raises fails the check, not the run
                raise ConformanceError(name, f"unexpected {type(exc).__name__}: {exc}") from exc
            passed.append(name)
    finally:
        for client in opened:
            await client.close()
    return passed
