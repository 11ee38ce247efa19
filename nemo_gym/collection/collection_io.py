"""The files of a rollout collection: input pre-pass, materialized rows, results, failures, resume.

For ``+output_jsonl_fpath=x.jsonl`` a collection owns four files (:class:`CollectionPaths`):
``x.jsonl`` (results), ``x_materialized_inputs.jsonl``, ``x_failures.jsonl`` and
``x_aggregate_metrics.json``. Everything here streams: no function holds a file's rows in memory.

- :func:`materialize_input` is the pre-pass: it validates every input line (reporting file and
  line number), assigns ``_ng_task_index`` (identical lines share one) and ``_ng_rollout_index``,
  expands repeats and writes the materialized rows, without keeping rows.
- :class:`JsonlAppender` appends one whole line per ``write`` call, so a kill leaves at most one
  torn last line; :func:`scan_results` detects and drops it on resume.
- :func:`compact_failures` keeps the latest failure record per rollout that still has no result.
- :func:`merge_result_shards` merges shard outputs: deduplicated and sorted by (task, rollout).
- :func:`write_metrics_file` assembles ``x_aggregate_metrics.json`` from per-agent answers.

This module is the index: each idea lives in its own module (``row_keys``, ``collection_paths``,
``row_materializer``, ``input_prepass``, ``int_table``, ``result_files``, ``failure_records``,
``shard_merge``, ``metrics_file``, ``notices``) and is re-exported here under its old name.
"""

from __future__ import annotations

from nemo_gym.collection.collection_paths import CollectionPaths
from nemo_gym.collection.failure_records import compact_failures, read_failure_attempts
from nemo_gym.collection.input_prepass import (
    MAX_REPORTED_BAD_LINES,
    BadLine,
    MaterializeReport,
    materialize_input,
)
from nemo_gym.collection.int_table import IntTable, line_digest
from nemo_gym.collection.metrics_file import (
    METRIC_KEYS,
    read_metrics_summary,
    spool_results_by_agent,
    write_metrics_file,
)
from nemo_gym.collection.notices import warn
from nemo_gym.collection.result_files import JsonlAppender, ResultsScan, drop_duplicate_results, scan_results
from nemo_gym.collection.row_keys import (
    AGENT_KIND,
    AGENT_REF_KEY,
    ATTEMPT_INDEX_KEY,
    ERROR_KEY,
    FAILURE_CLASS_KEY,
    INPUT_LINE_KEY,
    MALFORMED_INPUT,
    ROLLOUT_BITS,
    ROLLOUT_INDEX_KEY,
    SKILLS_REF_KEY,
    TASK_INDEX_KEY,
    CollectionInputError,
    agent_name_of,
    iter_jsonl,
    rollout_key,
    row_key,
)
from nemo_gym.collection.row_materializer import PromptConfig, RowMaterializer, with_seed
from nemo_gym.collection.shard_merge import (
    SIDE_FILE_SUFFIXES,
    MergeReport,
    expand_input_glob,
    match_result_files,
    merge_result_shards,
)

__all__ = [
    "AGENT_KIND",
    "AGENT_REF_KEY",
    "ATTEMPT_INDEX_KEY",
    "ERROR_KEY",
    "FAILURE_CLASS_KEY",
    "INPUT_LINE_KEY",
    "MALFORMED_INPUT",
    "MAX_REPORTED_BAD_LINES",
    "METRIC_KEYS",
    "ROLLOUT_BITS",
    "ROLLOUT_INDEX_KEY",
    "SIDE_FILE_SUFFIXES",
    "SKILLS_REF_KEY",
    "TASK_INDEX_KEY",
    "BadLine",
    "CollectionInputError",
    "CollectionPaths",
    "IntTable",
    "JsonlAppender",
    "MaterializeReport",
    "MergeReport",
    "PromptConfig",
    "ResultsScan",
    "RowMaterializer",
    "agent_name_of",
    "compact_failures",
    "drop_duplicate_results",
    "expand_input_glob",
    "iter_jsonl",
    "line_digest",
    "match_result_files",
    "materialize_input",
    "merge_result_shards",
    "read_failure_attempts",
    "read_metrics_summary",
    "rollout_key",
    "row_key",
    "scan_results",
    "spool_results_by_agent",
    "warn",
    "with_seed",
    "write_metrics_file",
]
