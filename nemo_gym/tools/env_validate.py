"""``gym env validate`` (``ng_validate``): check a config without starting a server.

The config is composed as ``ng_run`` composes it (``+config_paths``, ``env.yaml``, overrides), so
an unknown server ref fails with its "did you mean". Then, for every server instance: its
folder and entrypoint exist; every ``datasets`` entry has NeMo Gym's fields; a dataset file that
is present reads as JSONL rows with ``responses_create_params`` (or a ``prompt_config`` to make
them), checked against the resources server's ``task_data.py`` schema when it ships one; a
prompt file that is named exists. Each problem names the instance, field, file and line. An
``example`` dataset must be present; a train or validation file that is absent is only noted
(``ng_prepare_data`` fetches or prepares it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nemo_gym import _resolve_under_cwd_or_install
from nemo_gym.collection.collection_io import iter_jsonl
from nemo_gym.console.command import console_command
from nemo_gym.console.command_help import CommandHelp
from nemo_gym.console.settings_command import describe_error
from nemo_gym.launch.config import ConfigError, ServerInstance, load_config, project_root, server_instances
from nemo_gym.launch.datasets import DatasetConfig
from nemo_gym.task_data import load_task_data_schema, validate_jsonl_rows

MAX_ROW_PROBLEMS = 5


def _server_folder(instance: ServerInstance) -> Path | None:
    for root in (Path.cwd(), project_root()):
        folder = root / instance.type / instance.impl
        if folder.is_dir():
            return folder
    return None


def _check_rows(where: str, path: Path, dataset: DatasetConfig, schema_folder: Path | None) -> list[str]:
    problems: list[str] = []
    try:
        for line, row in iter_jsonl(path):
            if "responses_create_params" not in row and not dataset.prompt_config:
                problems.append(f"{where}: {path}:{line}: no responses_create_params (and no prompt_config)")
            elif "responses_create_params" in row and not isinstance(row["responses_create_params"], Mapping):
                problems.append(f"{where}: {path}:{line}: responses_create_params is not an object")
            if len(problems) >= MAX_ROW_PROBLEMS:
                break
    except ConfigError as exc:
        return [f"{where}: {exc}"]
    adapter = load_task_data_schema(schema_folder) if schema_folder else None
    if adapter is not None and not problems:
        with path.open() as lines:
            report = validate_jsonl_rows(
                schema_folder.name if schema_folder else "", adapter, str(path), lines
            )
        # Row numbers of the report count from 0; a file's lines from 1.
        for message in report.errors:
            index, _, error = message.partition(": ")
            row_line = str(int(index) + 1) if index.isdigit() else index
            problems.append(
                f"{where}: {path}:{row_line}: does not match {schema_folder}/task_data.py: {error}"
            )
    return problems


def _resources_folder(instance: ServerInstance, instances: Mapping[str, ServerInstance]) -> Path | None:
    ref = instance.fields.get("resources_server")
    if isinstance(ref, Mapping) and ref.get("name") in instances:
        return _server_folder(instances[str(ref["name"])])
    return None


def validate_config(config: Mapping[str, Any]) -> tuple[list[str], list[str], int]:
    """``(problems, notes, datasets checked)`` of a composed config."""
    problems: list[str] = []
    notes: list[str] = []
    checked = 0
    instances = server_instances(config)
    if not instances:
        problems.append("the config has no server instances (give +config_paths=[...] or --config)")
    for instance in instances.values():
        folder = _server_folder(instance)
        entrypoint = str(instance.fields.get("entrypoint", "app.py"))
        if folder is None:
            problems.append(f"{instance.name}: no folder {instance.type}/{instance.impl}")
            continue
        if not (folder / entrypoint).is_file():
            problems.append(f"{instance.name}.entrypoint: {folder / entrypoint} does not exist")
        datasets = instance.fields.get("datasets") or []
        if not isinstance(datasets, list):
            problems.append(f"{instance.name}.datasets: must be a list")
            continue
        for index, entry in enumerate(datasets):
            where = f"{instance.name}.datasets[{index}]"
            try:
                dataset = DatasetConfig.model_validate(entry)
            except ValidationError as exc:
                problems += [f"{where}: {describe_error(err).lstrip('+')}" for err in exc.errors()]
                continue
            if (
                dataset.prompt_config
                and not Path(_resolve_under_cwd_or_install(dataset.prompt_config)).is_file()
            ):
                problems.append(f"{where}.prompt_config: no file {dataset.prompt_config}")
            path = Path(_resolve_under_cwd_or_install(dataset.jsonl_fpath))
            if not path.is_file():
                message = f"{where}.jsonl_fpath: {dataset.jsonl_fpath} is not there"
                if dataset.type == "example":
                    problems.append(message)
                else:
                    notes.append(message + " (ng_prepare_data fetches or prepares it)")
                continue
            checked += 1
            problems += _check_rows(where, path, dataset, _resources_folder(instance, instances))
    return problems, notes, checked


def _validate(argv: list[str]) -> int:
    config = load_config(argv)
    problems, notes, checked = validate_config(config)
    for note in notes:
        print(f"note: {note}")
    for problem in problems:
        print(f"error: {problem}")
    servers = len(server_instances(config))
    if problems:
        print(f"invalid: {len(problems)} problem(s) in {servers} server(s)")
        return 1
    print(f"valid: {servers} server(s), {checked} dataset file(s) checked, nothing started")
    return 0


ng_validate = console_command(
    _validate,
    "ng_validate",
    CommandHelp(
        "ng_validate",
        "Check a config without starting anything: server refs, each server's folder and entrypoint, "
        "its datasets' fields, files and rows (against the resources server's task_data.py when it "
        "has one), and prompt files. Exit code 1 lists every problem.",
        examples=(
            'ng_validate "+config_paths=[resources_servers/example_multi_step/configs/example_multi_step.yaml,'
            'responses_api_models/scripted_model/configs/scripted_model.yaml]"',
        ),
    ),
)
