"""Compatibility: NeMo Gym's ``nemo_gym.rollout_collection``: collect verified rollouts from files or a training loop.

The public surface, with NeMo Gym's names, fields and return shapes, over
:mod:`nemo_gym.collection`:

- configs: ``SharedRolloutCollectionConfig`` (the base of ``RolloutCollectionConfig`` and
  ``E2ERolloutCollectionConfig``) and ``RolloutAggregationConfig``;
- ``RolloutCollectionHelper`` (``run_examples``, ``run_from_config``, ``setup_server_client``,
  ``_preprocess_rows_from_config``, ``_load_from_cache``, ``_call_aggregate_metrics``) and
  ``RolloutAggregationHelper.run_from_config`` (returns the metrics file's path);
- the commands, which are these functions: ``collect_rollouts`` (``ng_collect_rollouts``),
  ``aggregate_rollouts`` (``ng_aggregate_rollouts``), ``e2e_rollout_collection``
  (``ng_e2e_collect_rollouts``);
- ``attach_trajectory_record``, ``_expand_input_glob``, ``_rollout_request_debug_summary``;
- what NeMo Gym's own agents and orchestrators import from here:
  ``_attach_trajectory_record``/``_build_trajectory_record``/``_trajectory_identity`` (the
  trajectory from the evidence a result carries: :mod:`nemo_gym.collection.trajectory_evidence`;
  ``attach_trajectory_record`` projects it from the final response alone),
  ``_environment_servers_by_agent``/``_environment_server_for_agent``, ``DispatchLatencyTracker``,
  ``get_max_rollout_attempts`` (and 0.4.0-0.6.0's ``_get_max_rollout_attempts``), ``is_terminal_failure``, ``observed_elapsed``,
  ``migrate_invalid_judge_main_rows`` and ``_attach_ng_perf``
  (:mod:`nemo_gym.collection.nemo_gym_compat`), ``_CompletedRollout`` (one finished ``/run``
  with its latency beside it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_gym.collection.aggregation import aggregate_results_file, format_key_metrics
from nemo_gym.collection.collection_io import match_result_files
from nemo_gym.collection.collector import CollectionSummary
from nemo_gym.collection.commands import (
    EXIT_TOO_MANY_FAILURES,
    aggregate_command,
    collect_command,
    e2e_command,
    failure_exit_code,
)
from nemo_gym.collection.helper import RolloutAggregationHelper, RolloutCollectionHelper
from nemo_gym.collection.nemo_gym_compat import (
    DispatchLatencyTracker,
    attach_ng_perf,
    environment_server_for_agent,
    environment_servers_by_agent,
    get_max_rollout_attempts,
    is_terminal_failure,
    migrate_invalid_judge_main_rows,
    observed_elapsed,
)
from nemo_gym.collection.observations import TrajectoryRecord
from nemo_gym.collection.rollouts import (
    MAX_ERROR_CHARS,
    RolloutFailedError,
    RolloutOutcome,
    classify_error,
    rollout_request_debug_summary,
)
from nemo_gym.collection.settings import (
    DEFAULT_MAX_FAILURE_RATIO,
    NO_PERSIST_KEY,
    E2ERolloutCollectionConfig,
    RolloutAggregationConfig,
    RolloutCollectionConfig,
    SharedRolloutCollectionConfig,
)
from nemo_gym.collection.trajectory import attach_trajectory_record
from nemo_gym.collection.trajectory_evidence import attach_trajectory_evidence, build_trajectory_from_evidence
from nemo_gym.console.command import console_command
from nemo_gym.global_config import (  # get_global_config_dict: NeMo Gym's tests patch it here
    ROLLOUT_INDEX_KEY_NAME,
    TASK_INDEX_KEY_NAME,
    get_global_config_dict,
)
from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body

__all__ = [
    "DEFAULT_MAX_FAILURE_RATIO",
    "DispatchLatencyTracker",
    "EXIT_TOO_MANY_FAILURES",
    "MAX_ERROR_CHARS",
    "CollectionSummary",
    "E2ERolloutCollectionConfig",
    "RolloutAggregationConfig",
    "RolloutAggregationHelper",
    "RolloutCollectionConfig",
    "RolloutCollectionHelper",
    "RolloutFailedError",
    "RolloutOutcome",
    "SharedRolloutCollectionConfig",
    "aggregate_results_file",
    "aggregate_rollouts",
    "attach_trajectory_record",
    "classify_error",
    "collect_rollouts",
    "e2e_rollout_collection",
    "failure_exit_code",
    "format_key_metrics",
    "get_global_config_dict",
    "get_max_rollout_attempts",
    "is_terminal_failure",
    "migrate_invalid_judge_main_rows",
    "observed_elapsed",
]

# NeMo Gym 0.4.0 to 0.6.0 spell it with an underscore (gdpval's orchestrator imports that name).
_get_max_rollout_attempts = get_max_rollout_attempts

collect_rollouts = console_command(collect_command, "ng_collect_rollouts")
aggregate_rollouts = console_command(aggregate_command, "ng_aggregate_rollouts")
e2e_rollout_collection = console_command(e2e_command, "ng_e2e_collect_rollouts")
# The console scripts' names (pyproject.toml points at these).
ng_collect_rollouts = collect_rollouts
ng_aggregate_rollouts = aggregate_rollouts
ng_e2e_collect_rollouts = e2e_rollout_collection


def _expand_input_glob(input_glob: str) -> list[str]:
    """A glob, or comma-separated globs, as a sorted, de-duplicated list of paths (results side
    files skipped; a pattern matching nothing adds nothing)."""
    return match_result_files(input_glob)


def _rollout_request_debug_summary(row: dict[str, Any]) -> dict[str, Any]:
    """The task index, rollout index and agent name of a row (those it has), for a log line."""
    return rollout_request_debug_summary(row)


@dataclass(frozen=True)
class _CompletedRollout:
    """One finished ``/run``, as NeMo Gym's dispatch yields it: the materialized ``row``, the
    agent's ``result`` as it answered, and the rollout's wall time in milliseconds beside it
    (``None`` when not measured), never inside the result; which environment server ran it,
    when one did. NeMo Gym's orchestrators (gdpval's multistage driver) read these fields."""

    row: dict[str, Any]
    result: dict[str, Any]
    rollout_latency_ms: float | None
    environment_server: str | None = None
    environment_server_type: str | None = None


_environment_servers_by_agent = environment_servers_by_agent
_environment_server_for_agent = environment_server_for_agent
_attach_ng_perf = attach_ng_perf


def _trajectory_identity(row: Mapping[str, Any]) -> tuple[str, str]:
    """``(task_id, rollout_id)`` of a row: its ``task_id``/``problem_id``/``instance_id`` (else its
    task index) and its rollout id (``_ng_rollout_id``, else ``<task>-<rollout>``)."""
    task_id = next(
        (str(row[key]) for key in ("task_id", "problem_id", "instance_id") if row.get(key) is not None),
        str(row[TASK_INDEX_KEY_NAME]),
    )
    rollout_id = (
        maybe_rollout_id_from_run_body(row) or f"{row[TASK_INDEX_KEY_NAME]}-{row[ROLLOUT_INDEX_KEY_NAME]}"
    )
    return task_id, rollout_id


def _build_trajectory_record(row: dict[str, Any], result: dict[str, Any]) -> TrajectoryRecord:
    """The trajectory of one rollout from the evidence its result carries (see module docstring)."""
    return build_trajectory_from_evidence(_trajectory_identity(row), result)


def _attach_trajectory_record(row: dict[str, Any], result: dict[str, Any]) -> None:
    """Set ``result["ng_trajectory"]`` from the rollout's evidence (never raises)."""
    attach_trajectory_evidence(row, result, _trajectory_identity)


if __name__ == "__main__":
    collect_rollouts(None)


# NeMo Gym's row keys its environments read and set: the failure class a result names (our
# collector files such a result as a failure row), whether a failure is final (not retried on
# resume), and a result not to be written.
NG_FAILURE_CLASS_KEY = "_ng_failure_class"
NG_TERMINAL_KEY = "_ng_failure_terminal"
NG_NO_PERSIST_KEY = NO_PERSIST_KEY
