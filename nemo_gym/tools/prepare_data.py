"""Dataset preparation: validate rows, compute statistics, catch drift, collate for training.

``ng_prepare_data "+config_paths=[...]" +output_dirpath=DIR +mode=train_preparation|example_validation``
reads every dataset an agent instance lists::

    my_env_simple_agent:
      responses_api_agents:
        simple_agent:
          datasets:
            - {name: train, type: train, jsonl_fpath: data/train.jsonl, num_repeats: 2}
            - name: validation
              type: validation
              jsonl_fpath: data/validation.jsonl
              source: {type: huggingface, repo_id: org/repo, artifact_fpath: validation.jsonl}

For each dataset it validates every line (errors name ``file:line`` and the field), computes the
statistics NeMo Gym writes to ``<stem>_metrics.json`` (same keys, so committed files map across),
compares them with the committed file next to the dataset and reports each changed statistic
(``old → new``), then writes ``<type>.jsonl`` (lines repeated ``num_repeats`` times, each stamped
with ``agent_ref``) and ``<type>_metrics.json`` into ``output_dirpath``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson
from pydantic import ValidationError

from nemo_gym.collection.collection_io import PromptConfig
from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, load_config, project_root, server_instances
from nemo_gym.launch.datasets import DatasetConfig
from nemo_gym.tools.dataset_download import DownloadError, download_from_huggingface
from nemo_gym.tools.dataset_statistics import (
    DatasetStatistics,
    dataset_header,
    metrics_drift,
    metrics_path_for,
)

MODE_DATASET_TYPES: dict[str, tuple[str, ...]] = {
    "train_preparation": ("train", "validation", "benchmark"),
    "example_validation": ("example",),
}
AGENT_KIND = "responses_api_agents"
MESSAGE_ROLES = ("user", "system", "developer", "assistant")
MAX_ERRORS_SHOWN = 20


@dataclass
class AgentDataset:
    """A dataset together with the agent instance that lists it."""

    agent: str
    config: DatasetConfig
    path: Path

    @property
    def label(self) -> str:
        """``<agent>/<dataset name> (<type>)`` for messages."""
        return f"{self.agent}/{self.config.name} ({self.config.type})"


@dataclass
class DatasetReport:
    """The outcome of checking one dataset: its statistics, line errors and drift."""

    dataset: AgentDataset
    metrics: dict[str, Any]
    errors: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    metrics_path: Path | None = None
    metrics_written: bool = False


# ---- row validation ---------------------------------------------------------------------------


def validate_row(row: Any) -> list[str]:
    """Problems that stop ``row`` from being a run request, each naming the field; ``[]`` if fine."""
    if not isinstance(row, Mapping):
        return [f"a row must be a JSON object, got {type(row).__name__}"]
    errors: list[str] = []
    params = row.get("responses_create_params")
    if params is None:
        return ["responses_create_params: field required (a Responses create request with 'input')"]
    if not isinstance(params, Mapping):
        return [f"responses_create_params: must be an object, got {type(params).__name__}"]
    errors += _validate_input(params)
    tools = params.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            errors.append(f"responses_create_params.tools: must be a list, got {type(tools).__name__}")
        else:
            for index, spec in enumerate(tools):
                where = f"responses_create_params.tools[{index}]"
                if not isinstance(spec, Mapping):
                    errors.append(f"{where}: must be an object")
                elif spec.get("type", "function") == "function" and not isinstance(spec.get("name"), str):
                    errors.append(f"{where}.name: a function tool needs a string name")
    temperature = params.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        errors.append(f"responses_create_params.temperature: must be a number, got {temperature!r}")
    ref = row.get("agent_ref")
    if ref is not None and (
        not isinstance(ref, Mapping) or ref.get("type") != AGENT_KIND or not isinstance(ref.get("name"), str)
    ):
        errors.append(f"agent_ref: must be {{type: {AGENT_KIND}, name: <agent instance>}}, got {ref!r}")
    return errors


def _validate_input(params: Mapping[str, Any]) -> list[str]:
    if "input" not in params:
        return ["responses_create_params.input: field required (a string or a list of messages)"]
    items = params["input"]
    if isinstance(items, str):
        return []
    if not isinstance(items, list):
        return [f"responses_create_params.input: must be a string or a list, got {type(items).__name__}"]
    errors = []
    for index, item in enumerate(items):
        where = f"responses_create_params.input[{index}]"
        if not isinstance(item, Mapping):
            errors.append(f"{where}: must be an object")
            continue
        if "role" in item:
            if item["role"] not in MESSAGE_ROLES:
                errors.append(
                    f"{where}.role: must be one of {', '.join(MESSAGE_ROLES)}, got {item['role']!r}"
                )
            if not isinstance(item.get("content"), str | list):
                errors.append(f"{where}.content: must be a string or a list of content parts")
        elif not isinstance(item.get("type"), str):
            errors.append(f"{where}: an item needs a 'role' (message) or a 'type' (function_call, ...)")
    return errors


def tool_names(row: Mapping[str, Any]) -> list[str]:
    """The function tool names a row offers the model."""
    params = row.get("responses_create_params") or {}
    return [
        str(spec["name"])
        for spec in params.get("tools") or []
        if isinstance(spec, Mapping) and spec.get("type", "function") == "function" and "name" in spec
    ]


# ---- the command ------------------------------------------------------------------------------


def resolve_data_path(path: str) -> Path:
    """A data file path relative to the working directory, else to the project (bundled data)."""
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists():
        return candidate
    bundled = project_root() / candidate
    return bundled if bundled.exists() else candidate


def agent_datasets(config: Mapping[str, Any], types: Sequence[str] | None = None) -> list[AgentDataset]:
    """Every dataset of every agent instance in ``config`` (of the given types), config checked."""
    found = []
    for instance in server_instances(config).values():
        if instance.type != AGENT_KIND:
            continue
        entries = instance.fields.get("datasets") or []
        if not isinstance(entries, list):
            raise ConfigError(f"{instance.name}.datasets must be a list of datasets")
        for index, entry in enumerate(entries):
            try:
                dataset = DatasetConfig.model_validate(entry)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: {e['msg']}" for e in exc.errors()
                )
                raise ConfigError(f"{instance.name}.datasets[{index}]: {problems}") from exc
            if types is None or dataset.type in types:
                found.append(AgentDataset(instance.name, dataset, resolve_data_path(dataset.jsonl_fpath)))
    return found


def apply_prompt(row: Mapping[str, Any], prompt: PromptConfig) -> dict[str, Any]:
    """A copy of ``row`` whose ``responses_create_params.input`` is the filled prompt template.

    A row that already has an input is an error: the template and the row would disagree.
    """
    params = dict(row.get("responses_create_params") or {})
    if params.get("input"):
        raise ValueError(
            "the row already has responses_create_params.input and the dataset sets prompt_config"
        )
    params["input"] = prompt.input_items(row)
    return {**row, "responses_create_params": params}


def iter_json_lines(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """``(line number, value, None)`` for each non-blank line of a JSONL file, or
    ``(line number, None, "not valid JSON (...)")`` for a line that does not parse."""
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                yield number, None, f"not valid JSON ({exc})"
                continue
            yield number, value, None


def iter_dataset_rows(dataset: AgentDataset) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """``(line number, row or None, error or None)`` for each non-blank line, prompt template applied."""
    prompt = (
        PromptConfig.load(resolve_data_path(dataset.config.prompt_config))
        if dataset.config.prompt_config
        else None
    )
    for number, row, error in iter_json_lines(dataset.path):
        if error is not None:
            yield number, None, error
            continue
        if prompt is not None and isinstance(row, dict):
            try:
                row = apply_prompt(row, prompt)
            except ValueError as exc:
                yield number, None, str(exc)
                continue
        problems = validate_row(row)
        yield number, (None if problems else row), "; ".join(problems) or None


def check_dataset(dataset: AgentDataset) -> DatasetReport:
    """Validate every line of one dataset and compute its statistics (``num_repeats`` counted)."""
    stats = DatasetStatistics()
    errors = []
    for number, row, error in iter_dataset_rows(dataset):
        if row is None:
            errors.append(f"{dataset.path}:{number}: {error}")
            continue
        for _ in range(dataset.config.num_repeats):
            stats.add(row)
    metrics = dataset_header(dataset.config) | stats.as_dict()
    return DatasetReport(dataset, metrics, errors)


def compare_with_committed(report: DatasetReport, overwrite: bool, write_missing: bool = True) -> None:
    """Diff the statistics with the committed ``<stem>_metrics.json``; write it if absent (when
    ``write_missing``) or drifted and ``overwrite``."""
    path = metrics_path_for(report.dataset.path)
    report.metrics_path = path
    if not path.exists() and not write_missing:
        return
    if path.exists():
        try:
            committed = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            report.drift.append(f"{path} is not valid JSON ({exc}); delete it to regenerate")
            return
        report.drift = metrics_drift(committed, report.metrics)
        if not report.drift or not overwrite:
            return
    path.write_text(json.dumps(report.metrics, indent=4, ensure_ascii=False) + "\n")
    report.metrics_written = True


def collate(
    datasets: Sequence[AgentDataset], dataset_type: str, output_dir: Path
) -> tuple[Path, DatasetStatistics]:
    """Write ``<type>.jsonl`` (repeats expanded, ``agent_ref`` stamped, prompts applied)."""
    out_path = output_dir / f"{dataset_type}.jsonl"
    stats = DatasetStatistics()
    with out_path.open("wb") as out:
        for dataset in datasets:
            ref = {"type": AGENT_KIND, "name": dataset.agent}
            for number, row, error in iter_dataset_rows(dataset):
                if row is None:
                    raise ValueError(f"{dataset.path}:{number}: {error}")
                row = {**row, "agent_ref": ref}
                line = orjson.dumps(row) + b"\n"
                for _ in range(dataset.config.num_repeats):
                    out.write(line)
                    stats.add(row)
    return out_path, stats


def prepare_data(config: Mapping[str, Any], out: TextIO | None = None) -> int:
    """Run ``ng_prepare_data`` on a loaded config; returns the exit code (0: all good).

    Progress and problems go to ``out`` (default: standard output).
    """
    out = out or sys.stdout
    mode = config.get("mode")
    if mode not in MODE_DATASET_TYPES:
        raise ConfigError(f"+mode must be one of {', '.join(MODE_DATASET_TYPES)}, got {mode!r}")
    # example_validation without an output folder only checks: it writes nothing at all.
    check_only = mode == "example_validation" and not config.get("output_dirpath")
    if not config.get("output_dirpath") and not check_only:
        raise ConfigError("+output_dirpath is required (the folder for the collated JSONL files)")
    output_dir = Path(str(config.get("output_dirpath") or "."))
    types = MODE_DATASET_TYPES[mode]
    datasets = agent_datasets(config, types)
    if not datasets:
        out.write(f"no {'/'.join(types)} datasets in the agents of this config; nothing to do\n")
        return 1

    failed = _fetch_missing(datasets, config, mode, out)
    reports: list[DatasetReport] = []
    for dataset in datasets:
        if not dataset.path.exists():
            continue
        report = check_dataset(dataset)
        if not report.errors:
            overwrite = bool(config.get("overwrite_metrics_conflicts"))
            compare_with_committed(report, overwrite, write_missing=not check_only or overwrite)
        reports.append(report)
        _print_report(report, out)
    failed = failed or any(r.errors or (r.drift and not r.metrics_written) for r in reports)
    if failed:
        out.write("ng_prepare_data: FAILED (see above); nothing written to the output folder\n")
        return 1
    if check_only:
        updated = [str(r.metrics_path) for r in reports if r.metrics_written]
        written = f"updated {', '.join(updated)}" if updated else "nothing written"
        out.write(
            f"ng_prepare_data: {len(reports)} dataset(s) valid; {written} (no collated files without "
            "+output_dirpath)\n"
        )
        return 0

    output_dir.mkdir(parents=True, exist_ok=True)
    for dataset_type in types:
        of_type = [d for d in datasets if d.config.type == dataset_type]
        if not of_type:
            continue
        try:
            path, stats = collate(of_type, dataset_type, output_dir)
        except ValueError as exc:
            out.write(f"ng_prepare_data: {exc}\n")
            return 1
        metrics_path = output_dir / f"{dataset_type}_metrics.json"
        metrics_path.write_text(json.dumps(stats.as_dict(), indent=4, ensure_ascii=False) + "\n")
        out.write(f"wrote {path} ({stats.examples} rows) and {metrics_path}\n")
    return 0


def _fetch_missing(
    datasets: Sequence[AgentDataset], config: Mapping[str, Any], mode: str, out: TextIO
) -> bool:
    failed = False
    for dataset in datasets:
        if dataset.path.exists():
            continue
        source = dataset.config.download_source()
        if source is None or mode == "example_validation":
            out.write(f"{dataset.label}: {dataset.config.jsonl_fpath} does not exist\n")
            failed = True
        elif not config.get("should_download"):
            out.write(
                f"{dataset.label}: {dataset.config.jsonl_fpath} does not exist; it comes from Hugging Face "
                f"repo {source.repo_id}: rerun with +should_download=true to fetch it\n"
            )
            failed = True
        else:
            out.write(f"{dataset.label}: downloading from Hugging Face repo {source.repo_id}...\n")
            try:
                dataset.path = download_from_huggingface(
                    source,
                    dataset.config.type,
                    Path(dataset.config.jsonl_fpath),
                    token=config.get("hf_token"),
                )
            except DownloadError as exc:
                out.write(f"{dataset.label}: {exc}\n")
                failed = True
    return failed


def _print_report(report: DatasetReport, out: TextIO) -> None:
    metrics = report.metrics
    words = metrics["Json-dumped number of words (proxy for token count)"]
    out.write(
        f"{report.dataset.label}: {report.dataset.path}: {metrics['Number of examples']} rows "
        f"(num_repeats {report.dataset.config.num_repeats}), "
        f"tools/row {metrics['Number of tools']['Average']}, turns/row {metrics['Number of turns']['Average']}, "
        f"words/row {words['Average']}\n"
    )
    for error in report.errors[:MAX_ERRORS_SHOWN]:
        out.write(f"  error: {error}\n")
    if len(report.errors) > MAX_ERRORS_SHOWN:
        out.write(f"  ... and {len(report.errors) - MAX_ERRORS_SHOWN} more bad lines\n")
    if report.drift:
        verdict = (
            "overwritten"
            if report.metrics_written
            else "run with +overwrite_metrics_conflicts=true to accept"
        )
        out.write(f"  statistics drifted from {report.metrics_path} ({verdict}):\n")
        for line in report.drift:
            out.write(f"    {line}\n")
    elif report.metrics_written:
        out.write(f"  wrote {report.metrics_path}\n")


def _prepare_data_command(argv: list[str]) -> int:
    return prepare_data(load_config(argv, validate_refs=False))


ng_prepare_data = console_command(_prepare_data_command, "ng_prepare_data")
