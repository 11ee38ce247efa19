"""Compatibility: Task-data schemas: what a resources server expects of the task fields of a dataset row
(NeMo Gym's ``nemo_gym.task_data``).

A server may ship ``task_data.py`` beside its ``app.py``, exporting ``TaskData``: a pydantic
model (or anything ``TypeAdapter`` accepts, such as a union) over the row's task-owned fields,
written flat. Rows are validated flat whatever their layout: fields kept under a legacy
``verifier_metadata`` mapping or a migrated ``task_data`` mapping are lifted to the top level
first (``normalize_task_fields``). A field marked
``Field(..., json_schema_extra={"legacy_location": "verifier_metadata"})`` is one the server
reads only from ``verifier_metadata``; a row carrying it only at the top level is reported as
misplaced, since the server would never see it.

``TaskDataValidator`` checks rows one by one and keeps a ``TaskDataValidationReport`` (failed
rows with the first few errors, undeclared keys, conflicting and misplaced keys). Schemas load
with nothing but pydantic, so data tools can read them without a server's requirements.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, TypeAdapter

from nemo_gym.episode_types import is_materialized_task_row

TASK_DATA_MODULE_NAME = "task_data"
TASK_DATA_EXPORT_NAME = "TaskData"
LEGACY_METADATA_KEY = "verifier_metadata"
TASK_DATA_ROW_KEY = "task_data"

# Keys the framework owns; every other key of a row belongs to the task and to its schema.
RESERVED_ROW_KEYS = frozenset(
    {"responses_create_params", "agent_ref", "task_source", "_ng_task_index", "_ng_rollout_index"}
)


class TaskDataSchemaError(Exception):
    """A server's ``task_data.py`` exists but cannot be imported or exports no usable ``TaskData``."""


def find_server_dir(server_name: str, base_folder: str = "resources_servers") -> Path | None:
    """The folder ``<base_folder>/<server_name>`` under ``NEMO_GYM_EXTRA_ROOTS``, the working
    directory or the project root (the first where it is a folder), or ``None``."""
    from nemo_gym import _resolve_under_cwd_or_install

    candidate = _resolve_under_cwd_or_install(Path(base_folder) / server_name)
    return candidate if candidate.is_dir() else None


def load_task_data_schema(server_dir: Path) -> TypeAdapter | None:
    """A ``TypeAdapter`` over ``TaskData`` of ``<server_dir>/task_data.py``; ``None`` when the
    server has no such file; ``TaskDataSchemaError`` when it does not import or lacks ``TaskData``."""
    module_path = Path(server_dir) / f"{TASK_DATA_MODULE_NAME}.py"
    if not module_path.is_file():
        return None
    # A module name of its own per server, so two servers' schemas never replace each other.
    module_name = f"nemo_gym_task_data.{Path(server_dir).name}"
    spec = importlib.util.spec_from_file_location(module_name, module_path)
    if spec is None or spec.loader is None:
        raise TaskDataSchemaError(f"{module_path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses and forward references look the module up there.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise TaskDataSchemaError(f"{module_path}: importing it failed: {exc}") from exc
    schema = getattr(module, TASK_DATA_EXPORT_NAME, None)
    if schema is None:
        raise TaskDataSchemaError(
            f"{module_path}: defines no `{TASK_DATA_EXPORT_NAME}` (a pydantic model or a union of them)"
        )
    try:
        return TypeAdapter(schema)
    except Exception as exc:
        raise TaskDataSchemaError(
            f"{module_path}: `{TASK_DATA_EXPORT_NAME}` is not a type pydantic can validate: {exc}"
        ) from exc


def normalize_task_fields(row: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The task-owned fields of ``row``, flat, and the keys found twice with different values.

    Framework keys are dropped; the contents of ``verifier_metadata`` and ``task_data`` mappings
    are lifted to the top level (a key already there with the same value is fine; with another
    value it is a conflict and keeps the top-level value). A container that is not a mapping is
    left in place for the schema to reject."""
    fields = {key: value for key, value in row.items() if key not in RESERVED_ROW_KEYS}
    conflicts: list[str] = []
    for container_key in (LEGACY_METADATA_KEY, TASK_DATA_ROW_KEY):
        if container_key not in fields:
            continue
        container = fields.pop(container_key)
        if not isinstance(container, dict):
            if container is not None:
                fields[container_key] = container
            continue
        for key, value in container.items():
            if key in fields and fields[key] != value:
                conflicts.append(key)
            else:
                fields[key] = value
    return fields, conflicts


@dataclass
class TaskDataValidationReport:
    """What validating one dataset file against one server's schema found."""

    server_name: str
    dataset_fpath: str
    rows: int = 0
    error_rows: int = 0
    errors: list[str] = field(default_factory=list)
    unknown_keys: dict[str, int] = field(default_factory=dict)
    conflicting_keys: dict[str, int] = field(default_factory=dict)
    misplaced_keys: dict[str, int] = field(default_factory=dict)

    # Only the first few failures are kept verbatim; the rest are counted.
    MAX_RECORDED_ERRORS = 5

    @property
    def clean(self) -> bool:
        """No failed row and no unknown, conflicting or misplaced key."""
        return not (self.error_rows or self.unknown_keys or self.conflicting_keys or self.misplaced_keys)

    def record_error(self, row_index: int, message: str) -> None:
        """Count one failed row, keeping its message while fewer than ``MAX_RECORDED_ERRORS`` are kept."""
        self.error_rows += 1
        if len(self.errors) < self.MAX_RECORDED_ERRORS:
            self.errors.append(f"{row_index}: {message}")

    def summary(self) -> str:
        """A few lines for a person: failed rows first, then each kind of suspicious key."""
        lines = [
            f"{self.dataset_fpath}: {self.error_rows}/{self.rows} rows failed task_data validation "
            f"against the `{self.server_name}` schema."
        ]
        lines += [f"  row {message}" for message in self.errors]
        if self.error_rows > len(self.errors):
            lines.append(f"  ... and {self.error_rows - len(self.errors)} more rows")
        for counts, what in (
            (
                self.conflicting_keys,
                "keys with different values at the top level and in verifier_metadata/task_data",
            ),
            (
                self.misplaced_keys,
                "keys the server reads from verifier_metadata but found only at the top level",
            ),
            (self.unknown_keys, "keys the schema does not declare (a typo, or a field the schema lacks?)"),
        ):
            if counts:
                listed = ", ".join(f"{key} ({n} rows)" for key, n in sorted(counts.items()))
                lines.append(f"  {what}: {listed}")
        return "\n".join(lines)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def legacy_metadata_fields(adapter: TypeAdapter) -> frozenset[str]:
    """Fields of the schema's models marked ``legacy_location: verifier_metadata``."""
    names = set()
    for model in _models_in(getattr(adapter, "_type", None)):
        for name, info in model.model_fields.items():
            extra = info.json_schema_extra
            if isinstance(extra, dict) and extra.get("legacy_location") == LEGACY_METADATA_KEY:
                names.add(name)
    return frozenset(names)


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


class TaskDataValidator:
    """Validates rows against one server's ``TaskData`` schema; findings pile up in ``report``."""

    def __init__(self, server_name: str, adapter: TypeAdapter, dataset_fpath: str) -> None:
        self._adapter = adapter
        self._legacy_fields = legacy_metadata_fields(adapter)
        self.report = TaskDataValidationReport(server_name=server_name, dataset_fpath=dataset_fpath)

    def _flatten_materialized(
        self, row_index: int, row: Mapping[str, Any]
    ) -> tuple[dict[str, Any], bool] | None:
        """A materialized task's fields (``task_input``, with its ``task_data`` lifted), and
        whether it had a ``task_data``; ``None`` (row counted as failed) when malformed."""
        task_input = row.get("task_input")
        if not isinstance(task_input, Mapping):
            self.report.record_error(
                row_index, f"task_input must be an object, got {type(task_input).__name__}"
            )
            return None
        if "task_data" in task_input and not isinstance(task_input["task_data"], Mapping):
            kind = type(task_input["task_data"]).__name__
            self.report.record_error(row_index, f"task_input.task_data must be an object, got {kind}")
            return None
        flat = dict(task_input.get("task_data") or {})
        for key, value in task_input.items():
            if key == "task_data":
                continue
            if key in flat and flat[key] != value:
                _bump(self.report.conflicting_keys, key)
            else:
                flat[key] = value
        return flat, "task_data" in task_input

    def validate_row(self, row_index: int, row: dict[str, Any]) -> None:
        """Validate one row (flat, legacy-nested, migrated or a materialized task) and record
        what is wrong with it in ``report``."""
        self.report.rows += 1
        migrated = TASK_DATA_ROW_KEY in row
        if is_materialized_task_row(row):
            flattened = self._flatten_materialized(row_index, row)
            if flattened is None:
                return
            row, migrated = flattened
        # A field the server reads only from verifier_metadata, present only at the top level:
        # the schema (flat) would accept it, the server would never see it. Migrated rows keep
        # everything at the top level of task_data by design, so they are not checked.
        if self._legacy_fields and not migrated:
            nested = row.get(LEGACY_METADATA_KEY)
            nested_keys = set(nested) if isinstance(nested, dict) else set()
            for key in sorted((set(row) & self._legacy_fields) - nested_keys):
                _bump(self.report.misplaced_keys, key)
        fields, conflicts = normalize_task_fields(row)
        for key in conflicts:
            _bump(self.report.conflicting_keys, key)
        try:
            validated = self._adapter.validate_python(fields)
        except Exception as exc:
            self.report.record_error(row_index, str(exc).strip().replace("\n", "; ")[:400])
            return
        # extra="allow" models keep undeclared keys in __pydantic_extra__ (for unions too: the
        # member pydantic chose), which is how unknown keys are found.
        if isinstance(validated, BaseModel):
            for key in validated.__pydantic_extra__ or {}:
                _bump(self.report.unknown_keys, key)


def validate_jsonl_rows(
    server_name: str, adapter: TypeAdapter, dataset_fpath: str, lines: Iterable[str]
) -> TaskDataValidationReport:
    """Validate every non-blank JSONL line (row numbers count from 0) and return the report."""
    validator = TaskDataValidator(server_name=server_name, adapter=adapter, dataset_fpath=dataset_fpath)
    for index, line in enumerate(lines):
        if line.strip():
            validator.validate_row(index, json.loads(line))
    return validator.report
