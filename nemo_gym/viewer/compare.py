"""The Compare page: two collections paired task by task, the change in reward and the tasks that flipped."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from nemo_gym.viewer.collection import MAX_PAGE, Collection, TaskStats, ViewerInputError


def compare(
    a: Collection, b: Collection, *, show: str = "all", offset: int = 0, limit: int = 100
) -> dict[str, Any]:
    """The Compare page: tasks present in both collections (matched by ``_ng_task_index``),
    the change in mean reward, and the tasks that flipped.

    Pairing by task index is only meaningful when both collections ran the same input: tasks
    whose prompts differ are counted in ``prompts_differ``, flagged per row, and ``warning``
    says so (two runs on different data, or on differently ordered data, compare nothing).

    A task *passes* in a collection when at least half of its scored repeats are solved.
    ``show``: ``all``, ``flipped``, ``gained`` (fails in ``a``, passes in ``b``), ``lost``
    or ``changed`` (any change in mean reward). Rows are sorted by the change, largest first.

    Raises:
        ViewerInputError: for an unknown ``show`` or a bad page.
    """
    if show not in ("all", "flipped", "gained", "lost", "changed"):
        raise ViewerInputError(f"show must be all, flipped, gained, lost or changed; got {show!r}")
    if offset < 0 or not 1 <= limit <= MAX_PAGE:
        raise ViewerInputError(f"offset must be >= 0 and limit between 1 and {MAX_PAGE}")

    key_ab = (id(b), a.version, b.version)
    cached = a._compare_cache.get(key_ab)
    if cached is None:
        changed: list[tuple[float, int, TaskStats, TaskStats, str | None]] = []
        same: list[tuple[float, int, TaskStats, TaskStats, str | None]] = []
        other = b.tasks_by_key
        gained = lost = 0
        sum_a = sum_b = 0.0
        snippets_a, snippets_b = a.index.snippets, b.index.snippets
        differ: set[int] = set()
        for key, sa in a.tasks_by_key.items():
            sb = other.get(key)
            if sb is None or key < 0 or not sa.scored or not sb.scored:
                continue
            if snippets_a.get(key, "") != snippets_b.get(key, ""):
                differ.add(key)
            mean_a, mean_b = sa.total / sa.scored, sb.total / sb.scored
            sum_a += mean_a
            sum_b += mean_b
            pass_a, pass_b = 2 * sa.solved >= sa.scored, 2 * sb.solved >= sb.scored
            flip = None
            if pass_a != pass_b:
                flip = "gained" if pass_b else "lost"
                gained += pass_b
                lost += pass_a
            delta = mean_b - mean_a
            (changed if delta else same).append((delta, key, sa, sb, flip))
        # Biggest change first, then by task; most tasks usually did not change at all.
        changed.sort(key=lambda r: (-abs(r[0]), r[1]))
        same.sort(key=itemgetter(1))
        cached = {
            "rows": changed + same,
            "changed": len(changed),
            "gained": gained,
            "lost": lost,
            "sum_a": sum_a,
            "sum_b": sum_b,
            "only_a": sum(1 for k in a.tasks_by_key.keys() - other.keys() if k >= 0),
            "only_b": sum(1 for k in other.keys() - a.tasks_by_key.keys() if k >= 0),
            "differ": differ,
        }
        a._compare_cache.clear()  # keep one comparison: files grow and the pair changes
        a._compare_cache[key_ab] = cached
    rows = cached["rows"]
    common = len(rows)
    if show == "flipped":
        rows = [r for r in rows if r[4]]
    elif show in ("gained", "lost"):
        rows = [r for r in rows if r[4] == show]
    elif show == "changed":
        rows = rows[: cached["changed"]]
    page = rows[offset : offset + limit]
    differ = cached["differ"]
    warning = None
    if differ:
        warning = (
            f"{len(differ)} of the {common} tasks in both collections have different prompts: tasks "
            "are paired by _ng_task_index, so these two collections did not run the same input "
            "(or not in the same order) and their comparison is not meaningful"
        )
    return {
        "a": a.summary(),
        "b": b.summary(),
        "common_tasks": common,
        "only_a": cached["only_a"],
        "only_b": cached["only_b"],
        "mean_a": cached["sum_a"] / common if common else None,
        "mean_b": cached["sum_b"] / common if common else None,
        "gained": cached["gained"],
        "lost": cached["lost"],
        "prompts_differ": len(differ),
        "warning": warning,
        "total": len(rows),
        "offset": offset,
        "tasks": [
            {
                "task": key,
                "prompt": a.index.snippets.get(key) or b.index.snippets.get(key, ""),
                "prompt_b": b.index.snippets.get(key, "") if key in differ else None,
                "mean_a": sa.mean,
                "mean_b": sb.mean,
                "delta": delta,
                "rows_a": a.rows_of(sa),
                "rows_b": b.rows_of(sb),
                "flip": flip,
            }
            for delta, key, sa, sb, flip in page
        ],
    }
