"""Collection helpers NeMo Gym environments import from ``nemo_gym.rollout_collection``.

NeMo Gym's own orchestrators (GDPVal's multi-stage runner, Hermes's recipe) reuse pieces of its
collector: which environment server fronts an agent, how many attempts a rollout gets, which
failure rows are final, per-task latency and the drain margin, the per-rollout ``ng_perf``
summary, and moving legacy invalid-judge rows out of a results file. They are re-exported under
NeMo Gym's names by :mod:`nemo_gym.rollout_collection`; our own collector does not use them.
"""

from __future__ import annotations

import bisect
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Container, Mapping
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collection.collection_io import (
    ATTEMPT_INDEX_KEY,
    FAILURE_CLASS_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    CollectionPaths,
)
from nemo_gym.collection.observations import ModelCallRef, TrajectoryRecord
from nemo_gym.collection.row_keys import row_key
from nemo_gym.deliverables import is_deliverable
from nemo_gym.launch.config import ConfigError

logger = logging.getLogger(__name__)

TERMINAL_KEY = "_ng_failure_terminal"
ELAPSED_KEY = "elapsed_seconds"
PERF_KEY = "ng_perf"
MAX_ROLLOUT_ATTEMPTS_ENV = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"
DEFAULT_MAX_ROLLOUT_ATTEMPTS = 3
ENVIRONMENT_SERVERS_KEY = "environment_servers"
_MIGRATED_KEY = "_ng_migrated_invalid_judge_response"


class AgentWithoutEnvironmentServerError(ConfigError):
    """No environment server fronts the agent a row routes to."""


class AmbiguousEnvironmentServerError(ConfigError):
    """Several environment servers front the agent a row routes to."""


# ---- environment servers -------------------------------------------------------------------


def _agent_names(server: Mapping[str, Any]) -> list[str]:
    """The agents one environment server's config references: every field whose value has
    ``type: responses_api_agents``, and ``agent_server`` (whose type may be left out)."""
    names = []
    for field, ref in server.items():
        if not isinstance(ref, Mapping) or ref.get("name") is None:
            continue
        if ref.get("type") == "responses_api_agents" or (field == "agent_server" and ref.get("type") is None):
            names.append(str(ref["name"]))
    return names


def environment_servers_by_agent(global_config: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each agent instance's name → the environment server instances that front it."""
    by_agent: dict[str, list[str]] = {}
    for name, instance in global_config.items():
        servers = instance.get(ENVIRONMENT_SERVERS_KEY) if isinstance(instance, Mapping) else None
        if not isinstance(servers, Mapping):
            continue
        for server in servers.values():
            if isinstance(server, Mapping):
                for agent in _agent_names(server):
                    by_agent.setdefault(agent, []).append(str(name))
    return by_agent


def environment_server_for_agent(agent_name: str, servers_by_agent: Mapping[str, list[str]]) -> str:
    """The one environment server fronting ``agent_name``; a clear error for none or several."""
    servers = list(servers_by_agent.get(agent_name, []))
    if len(servers) == 1:
        return servers[0]
    if not servers:
        raise AgentWithoutEnvironmentServerError(
            f"agent {agent_name!r} has no environment server in the config: add one whose "
            "agent_server names it"
        )
    raise AmbiguousEnvironmentServerError(
        f"agent {agent_name!r} is fronted by several environment servers {sorted(servers)}: rows that "
        "route by agent cannot choose; name the environment server in each row"
    )


# ---- attempts, terminal failures, latency --------------------------------------------------


def get_max_rollout_attempts() -> int:
    """Attempts per rollout: ``$NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`` (a positive integer), else 3."""
    raw = os.environ.get(MAX_ROLLOUT_ATTEMPTS_ENV, "")
    if not raw:
        return DEFAULT_MAX_ROLLOUT_ATTEMPTS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        logger.warning(
            "%s=%r is not a positive integer; using %d",
            MAX_ROLLOUT_ATTEMPTS_ENV,
            raw,
            DEFAULT_MAX_ROLLOUT_ATTEMPTS,
        )
        return DEFAULT_MAX_ROLLOUT_ATTEMPTS
    return value


def is_terminal_failure(record: Mapping[str, Any], *, retry_terminal_timeouts: bool = False) -> bool:
    """Whether a failure row is final (not dispatched again on resume).

    A row is final when stamped ``_ng_failure_terminal``. With ``retry_terminal_timeouts``, a
    per-task timeout (``timeout_exceeded``) and GDPVal's repairable environment faults
    (``reference_missing``, ``eval_missing``, ``transport_ineligible``) stay retryable even when
    stamped, and a ``skipped`` sample is final even when not.
    """
    if retry_terminal_timeouts:
        failure_class = record.get(FAILURE_CLASS_KEY)
        if failure_class in ("timeout_exceeded", "reference_missing", "eval_missing", "transport_ineligible"):
            return False
        if failure_class == "skipped":
            return True
    return bool(record.get(TERMINAL_KEY))


def terminal_failure_keys(
    failures: Path, done: Container[int], *, retry_terminal_timeouts: bool = False
) -> set[int]:
    """Row keys of the rollouts whose latest record in the ``failures`` file is final
    (:func:`is_terminal_failure`), those already in ``done`` left out: a resume does not
    dispatch them again. Lines that are not JSON objects are skipped."""
    latest: dict[int, Mapping[str, Any]] = {}
    if not failures.exists():
        return set()
    with failures.open("rb") as source:
        for line in source:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            key = row_key(record) if isinstance(record, dict) else None
            if key is not None and key not in done:
                latest[key] = record
    return {
        key
        for key, record in latest.items()
        if is_terminal_failure(record, retry_terminal_timeouts=retry_terminal_timeouts)
    }


def observed_elapsed(record: Mapping[str, Any]) -> float | None:
    """A rollout's wall time in seconds from its row (``elapsed_seconds``, at the top or in the
    response's ``metadata``), or None when neither is a positive number."""
    response = record.get("response")
    metadata = response.get("metadata") if isinstance(response, Mapping) else None
    candidates = [
        record.get(ELAPSED_KEY),
        metadata.get(ELAPSED_KEY) if isinstance(metadata, Mapping) else None,
    ]
    for candidate in candidates:
        try:
            value = float(candidate) if candidate is not None else 0.0
        except (TypeError, ValueError):
            continue
        if value > 0:
            return value
    return None


class DispatchLatencyTracker:
    """Per-task latencies a dispatcher observed, their quantiles, and the drain margin.

    A throughput number alone hides that more concurrency makes each task slower; the
    percentiles beside it show tasks approaching their timeout while there is time to react.
    """

    def __init__(self) -> None:
        self._durations: list[float] = []  # sorted: quantiles are read before every dispatch
        self._drained = 0

    def record(self, seconds: float) -> None:
        """Add one finished task's latency (non-positive values are ignored)."""
        if seconds > 0:
            bisect.insort(self._durations, seconds)

    def record_drained(self) -> None:
        """Count a task not dispatched because too little time was left."""
        self._drained += 1

    @property
    def drained(self) -> int:
        """Tasks not dispatched for lack of time."""
        return self._drained

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0..1, linear interpolation) of the latencies, None without any."""
        if not self._durations:
            return None
        position = (len(self._durations) - 1) * q
        low = int(position)
        high = min(low + 1, len(self._durations) - 1)
        weight = position - low
        return self._durations[low] * (1 - weight) + self._durations[high] * weight

    def drain_margin(self, configured: float | None) -> float | None:
        """Seconds a task needs left to be worth starting: ``configured`` when given, else this
        run's p75 once five tasks finished, else None."""
        if configured is not None:
            return configured
        return self.quantile(0.75) if len(self._durations) >= 5 else None

    def summary(self) -> str:
        """A few lines for the log: latency percentiles, task-hours, drained tasks."""
        if not self._durations:
            lines = ["No completed rollouts to report latency for."]
        else:
            minutes = {q: (self.quantile(q) or 0.0) / 60 for q in (0.5, 0.9, 0.99)}
            lines = [
                f"Per-task latency over {len(self._durations)} completed rollout(s): median "
                f"{minutes[0.5]:.1f} min, p90 {minutes[0.9]:.1f} min, p99 {minutes[0.99]:.1f} min, "
                f"max {self._durations[-1] / 60:.1f} min",
                f"Task-time delivered: {sum(self._durations) / 3600:.1f} task-hours",
            ]
        if self._drained:
            lines.append(
                f"Drained (not dispatched, no time left in the budget): {self._drained}; "
                "they wrote no row and are dispatched again on resume."
            )
        return "\n".join(lines)


# ---- ng_perf -------------------------------------------------------------------------------


def build_ng_perf(result: Mapping[str, Any], *, rollout_latency_ms: float | None) -> dict[str, Any] | None:
    """The ``ng_perf`` summary of a rollout from its ``ng_trajectory``, or None without invocations.

    Counts the turns of every invocation (its turns, else the model calls it owns, else 1) and its
    tool calls, and sums the token counts of the captured calls the invocations reference (each
    call once); ``token_observability_coverage`` is the share of turns whose call was found.
    """
    raw = result.get("ng_trajectory")
    if not isinstance(raw, Mapping):
        return None
    try:
        trajectory = TrajectoryRecord.model_validate(raw)
    except ValueError:
        return None
    if not trajectory.invocations:
        return None
    calls = trajectory.model_calls

    def match(ref: ModelCallRef) -> int | None:
        found = [
            i
            for i, call in enumerate(calls)
            if (
                (ref.model_call_id and call.model_call_id == ref.model_call_id)
                or (not ref.model_call_id and ref.response_id and ref.model_ref is not None)
            )
            and (ref.model_ref is None or ref.model_ref == call.response_metadata.model_ref)
            and (ref.response_id is None or ref.response_id == call.response_metadata.response_id)
        ]
        return found[0] if len(found) == 1 else None

    claimed: set[int] = set()
    owned: Counter[str] = Counter()
    for invocation in trajectory.invocations:
        for ref in invocation.model_calls:
            index = match(ref)
            if index is not None and index not in claimed:
                claimed.add(index)
                owned[invocation.invocation_id] += 1
    turns = Counter(turn.invocation_id for turn in trajectory.turns)
    tools = Counter(tool.invocation_id for tool in trajectory.tool_calls)
    ids = [invocation.invocation_id for invocation in trajectory.invocations]
    num_turns = sum(turns.get(i, 0) or owned.get(i, 0) or 1 for i in ids)
    perf: dict[str, Any] = {
        "num_turns": num_turns,
        "num_tool_calls": sum(tools.get(i, 0) for i in ids),
        "token_observability_coverage": min(1.0, len(claimed) / num_turns),
    }
    for key, stat in (
        ("prompt_tokens", "prompt_tokens"),
        ("cached_prompt_tokens", "cached_tokens"),
        ("completion_tokens", "completion_tokens"),
        ("reasoning_tokens", "reasoning_tokens"),
    ):
        values = [getattr(calls[i].token_stats, stat) for i in sorted(claimed)]
        known = [v for v in values if v is not None]
        if known:
            perf[key] = sum(known)
    if isinstance(rollout_latency_ms, int | float):
        perf["total_latency_ms"] = rollout_latency_ms
    return perf


def attach_ng_perf(
    result: dict[str, Any], *, observability_enabled: bool, rollout_latency_ms: float | None = None
) -> None:
    """Set ``result["ng_perf"]`` when observability is on and the trajectory allows it (never raises)."""
    if not observability_enabled:
        return
    try:
        perf = build_ng_perf(result, rollout_latency_ms=rollout_latency_ms)
    except Exception:  # noqa: BLE001 - a summary must not fail a rollout
        logger.warning("could not build ng_perf for a rollout", exc_info=True)
        return
    if perf is not None:
        result[PERF_KEY] = perf


# ---- metrics over tasks ---------------------------------------------------------------------


def task_grouped_metrics(
    verify_responses: list[dict[str, Any]],
    compute_metrics: Callable[[list[list[dict[str, Any]]]], Mapping[str, Any] | None],
    key_metrics: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
    answer_field: str | None = None,
    compute_repeat_metrics: Callable[[list[list[Any]]], Mapping[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """The default metrics of verify answers plus a NeMo Gym-style ``compute_metrics(tasks)``
    (answers grouped by task index; its ``per_task_metrics``, a list of dicts naming their
    ``_ng_task_index`` or a dict by task index, merged into each task's group metrics, the rest
    into ``agent_metrics``) and NeMo Gym's field statistics
    (:func:`nemo_gym.collection.field_stats.add_field_stats`, with ``compute_repeat_metrics``),
    with ``key_metrics(agent_metrics, default)`` choosing the key metrics."""
    from nemo_gym.collection.field_stats import add_field_stats
    from nemo_gym.collection.metrics import compute_aggregate_metrics

    metrics = compute_aggregate_metrics(verify_responses, answer_field=answer_field)
    by_task: dict[Any, list[dict[str, Any]]] = {}
    for row in verify_responses:
        by_task.setdefault(row.get(TASK_INDEX_KEY, 0), []).append(row)
    custom = dict(compute_metrics([by_task[k] for k in sorted(by_task, key=str)]) or {})
    per_task = custom.pop("per_task_metrics", None)
    if isinstance(per_task, list):  # NeMo Gym's shape: one dict per task, naming its task index
        per_task = {m[TASK_INDEX_KEY]: m for m in per_task if isinstance(m, dict) and TASK_INDEX_KEY in m}
    if isinstance(per_task, dict):
        for group in metrics["group_level_metrics"]:
            extra = per_task.get(group.get(TASK_INDEX_KEY), {})
            group.update({k: v for k, v in extra.items() if k != TASK_INDEX_KEY})
    metrics["agent_metrics"].update(custom)
    add_field_stats(metrics, verify_responses, compute_repeat_metrics)
    metrics["key_metrics"] = key_metrics(metrics["agent_metrics"], metrics["key_metrics"])
    return metrics


# ---- invalid-judge rows --------------------------------------------------------------------


def migrate_invalid_judge_main_rows(output_fpath: Path) -> int:
    """Move rows marked ``invalid_judge_response`` from a results file to its failures file.

    Older GDPVal runs wrote an unusable judge verdict as a reward-0 result. Each such row goes to
    ``<stem>_failures.jsonl`` once (class ``judge_invalid``, not terminal, so resume retries it;
    ``reuse_cached_deliverable`` when its deliverables are still on disk), and the results file is
    rewritten without it, atomically, after the failures file is synced. Returns how many rows
    were marked (0 leaves both files untouched).
    """
    output_fpath = Path(output_fpath)
    if not output_fpath.exists():
        return 0
    rows = [orjson.loads(line) for line in output_fpath.read_bytes().splitlines() if line.strip()]
    marked = sum(1 for row in rows if row.get("invalid_judge_response"))
    if not marked:
        return 0

    def key(row: Mapping[str, Any]) -> tuple[Any, ...]:
        return (
            int(row.get("stage_index", 0) or 0),
            row.get(TASK_INDEX_KEY),
            row.get(ROLLOUT_INDEX_KEY),
            int(row.get(ATTEMPT_INDEX_KEY, 0) or 0),
        )

    failures = CollectionPaths.for_output(output_fpath).failures
    failures.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if failures.exists():
        for line in failures.read_bytes().splitlines():
            if line.strip() and (row := orjson.loads(line)).get(_MIGRATED_KEY):
                done.add(key(row))
    kept: list[bytes] = []
    with failures.open("ab") as sink:
        for row in rows:
            if not row.get("invalid_judge_response"):
                kept.append(orjson.dumps(row))
                continue
            if key(row) in done:
                continue
            moved = {
                **row,
                FAILURE_CLASS_KEY: row.get(FAILURE_CLASS_KEY) or "judge_invalid",
                _MIGRATED_KEY: True,
            }
            moved.pop(TERMINAL_KEY, None)
            moved.pop("reuse_cached_deliverable", None)
            if _has_deliverable(row.get("deliverables_dir")):
                moved["reuse_cached_deliverable"] = True
            sink.write(orjson.dumps(moved) + b"\n")
            done.add(key(row))
        sink.flush()
        os.fsync(sink.fileno())
    mode = output_fpath.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(dir=output_fpath.parent, prefix=f".{output_fpath.name}.migrate-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(b"".join(line + b"\n" for line in kept))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, output_fpath)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return marked


def _has_deliverable(directory: Any) -> bool:
    try:
        return (
            bool(directory)
            and Path(directory).is_dir()
            and any(map(is_deliverable, Path(directory).iterdir()))
        )
    except (OSError, TypeError):
        return False
