"""``gym eval export --format atif`` (``ng_export_atif``): rollouts as ATIF v1.7 trajectory files.

Each rollout becomes ``<task>-<rollout>.json`` in a new folder, listed in ``manifest.jsonl``
(``trajectory_path``, ``_ng_task_index``, ``_ng_rollout_index``, ``expected_sha256``), the layout
NeMo Gym 0.7.0 writes. The trajectory is built from the rollout's own transcript, which every
rollout carries: ``responses_create_params.input`` gives the system and user steps (earlier
assistant turns there are agent steps marked ``is_copied_context``), and ``response.output`` the
agent steps, one per model call: reasoning, message and tool calls, with the tool outputs as the
step's observation and, when the rollout has token IDs, the call's token IDs and log-probs as its
metrics. The export is all or nothing: every row is checked first, each error names its line and
field, and the folder appears only when all rows converted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.collection.collection_io import iter_jsonl
from nemo_gym.collection.row_keys import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, agent_name_of
from nemo_gym.console.settings_command import settings_command
from nemo_gym.launch.config import ConfigError
from nemo_gym.tools.atif_schema import (
    AtifAgent,
    AtifFinalMetrics,
    AtifObservation,
    AtifObservationResult,
    AtifStep,
    AtifStepMetrics,
    AtifToolCall,
    AtifTrajectory,
)

MANIFEST_NAME = "manifest.jsonl"
CONVERSION_PROFILE = "responses-transcript-to-atif-v1"


class AtifExportError(ConfigError):
    """A rollout cannot be written as ATIF; the message names the line and field."""


class ExportAtifSettings(BaseModel):
    """The arguments of ``gym eval export`` (NeMo Gym's ``ExportAtifConfig``)."""

    model_config = ConfigDict(extra="ignore")

    format: Literal["atif"] = Field(default="atif", description="Output trajectory format (atif).")
    rollouts_jsonl_fpath: str = Field(description="The rollouts JSONL to export.")
    output_dirpath: str = Field(description="A new folder for the trajectory files (must not exist).")
    session_id: str = Field(min_length=1, description="Stable identifier of the evaluation run.")
    agent_version: str = Field(min_length=1, description="Version of the agent that produced the rollouts.")


def _text(content: Any, path: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") in ("refusal",):
                texts.append(str(part.get("refusal") or ""))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise AtifExportError(f"{path}[{index}]: {kind} content is not exported (text only)")
        return "".join(texts)
    raise AtifExportError(f"{path}: expected a string or a list of content parts")


class _StepBuilder:
    """The agent step of one model call while its items are read."""

    def __init__(self, copied: bool, model: str | None) -> None:
        self.copied, self.model = copied, model
        self.message: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[AtifToolCall] = []
        self.results: list[AtifObservationResult] = []
        self.metrics: AtifStepMetrics | None = None
        self.closed = False

    def build(self, step_id: int) -> AtifStep:
        return AtifStep(
            step_id=step_id,
            source="agent",
            message="".join(self.message),
            model_name=None if self.copied else self.model,
            reasoning_content="\n".join(self.reasoning) or None,
            tool_calls=self.calls or None,
            observation=AtifObservation(results=self.results) if self.results else None,
            metrics=self.metrics,
            llm_call_count=None if self.copied else 1,
            is_copied_context=True if self.copied else None,
        )


def transcript_steps(
    items: list[Any], path: str, *, copied: bool, model: str | None, steps: list[AtifStep]
) -> None:
    """Append the steps of a list of Responses items to ``steps``."""
    current: _StepBuilder | None = None

    def close() -> None:
        nonlocal current
        if current is not None:
            steps.append(current.build(len(steps) + 1))
            current = None

    for index, item in enumerate(items):
        where = f"{path}[{index}]"
        if not isinstance(item, dict):
            raise AtifExportError(f"{where}: expected an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if kind == "message" and role in ("system", "developer", "user"):
            close()
            source: Literal["system", "user"] = "user" if role == "user" else "system"
            steps.append(
                AtifStep(
                    step_id=len(steps) + 1,
                    source=source,
                    message=_text(item.get("content"), f"{where}.content"),
                )
            )
            continue
        if kind == "function_call_output":
            call_id = str(item.get("call_id"))
            if current is None or call_id not in {call.tool_call_id for call in current.calls}:
                raise AtifExportError(
                    f"{where}: output of call_id {call_id!r}, which no tool call of this step made"
                )
            output = item.get("output")
            content = (
                output
                if isinstance(output, str)
                else _text(output, f"{where}.output")
                if isinstance(output, list)
                else json.dumps(output)
            )
            current.results.append(AtifObservationResult(source_call_id=call_id, content=content))
            continue
        if kind not in ("message", "reasoning", "function_call"):
            raise AtifExportError(f"{where}: item type {kind!r} is not exported")
        if current is None or current.closed or current.results or (kind == "message" and current.message):
            close()
            current = _StepBuilder(copied, model)
        if kind == "message":
            current.message.append(_text(item.get("content"), f"{where}.content"))
        elif kind == "reasoning":
            parts = [*(item.get("summary") or []), *(item.get("content") or [])]
            current.reasoning.append(_text(parts, f"{where}.summary"))
        else:
            try:
                arguments = json.loads(item.get("arguments") or "{}")
            except (TypeError, json.JSONDecodeError):
                arguments = None
            if not isinstance(arguments, dict):
                raise AtifExportError(f"{where}.arguments: not a JSON object")
            current.calls.append(
                AtifToolCall(
                    tool_call_id=str(item.get("call_id")),
                    function_name=str(item.get("name")),
                    arguments=arguments,
                )
            )
        generated = item.get("generation_token_ids")
        if isinstance(generated, list) and not copied:
            prompt = item.get("prompt_token_ids") or []
            current.metrics = AtifStepMetrics(
                prompt_tokens=len(prompt),
                completion_tokens=len(generated),
                prompt_token_ids=prompt,
                completion_token_ids=generated,
                logprobs=item.get("generation_log_probs"),
            )
            current.closed = True
    close()


def _index(row: dict[str, Any], key: str, line: int) -> int:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AtifExportError(f"line {line}: {key}: expected a non-negative integer, got {value!r}")
    return value


def rollout_to_atif(row: dict[str, Any], line: int, *, session_id: str, agent_version: str) -> AtifTrajectory:
    """One rollout row as an ATIF trajectory."""
    task, rollout = _index(row, TASK_INDEX_KEY, line), _index(row, ROLLOUT_INDEX_KEY, line)
    agent = agent_name_of(row)
    if not agent:
        raise AtifExportError(f"line {line}: agent_ref.name: missing (the agent is the trajectory's author)")
    params, response = row.get("responses_create_params"), row.get("response")
    if (
        not isinstance(params, dict)
        or not isinstance(response, dict)
        or not isinstance(response.get("output"), list)
    ):
        raise AtifExportError(
            f"line {line}: needs responses_create_params and response.output (a rollout row)"
        )
    raw_model = response.get("model")
    model = raw_model if isinstance(raw_model, str) else None
    steps: list[AtifStep] = []
    given = params.get("input")
    if isinstance(params.get("instructions"), str):
        steps.append(AtifStep(step_id=1, source="system", message=params["instructions"]))
    if isinstance(given, str):
        steps.append(AtifStep(step_id=len(steps) + 1, source="user", message=given))
    else:
        transcript_steps(
            given or [], f"line {line}: responses_create_params.input", copied=True, model=model, steps=steps
        )
    transcript_steps(
        response["output"], f"line {line}: response.output", copied=False, model=model, steps=steps
    )
    raw_usage = response.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    raw_details = usage.get("input_tokens_details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    try:
        return AtifTrajectory(
            session_id=session_id,
            trajectory_id=f"{session_id}:{task}:{rollout}",
            agent=AtifAgent(name=agent, version=agent_version, model_name=model),
            steps=steps,
            final_metrics=AtifFinalMetrics(
                total_prompt_tokens=usage.get("input_tokens"),
                total_completion_tokens=usage.get("output_tokens"),
                total_cached_tokens=details.get("cached_tokens"),
                total_steps=len(steps),
            ),
            extra={
                "nemo_gym": {
                    "source": {
                        "format": "responses_transcript",
                        "task_index": task,
                        "rollout_index": rollout,
                    },
                    "reward": row.get("reward"),
                    "conversion": {"profile": CONVERSION_PROFILE, "status": "complete"},
                }
            },
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise AtifExportError(f"line {line}: {where}: {first['msg']}") from None


def export_atif(settings: ExportAtifSettings) -> tuple[Path, int]:
    """Write the trajectories and manifest into a new folder; ``(folder, trajectories)``."""
    source = Path(settings.rollouts_jsonl_fpath)
    output = Path(settings.output_dirpath).absolute()
    if not source.is_file():
        raise AtifExportError(f"+rollouts_jsonl_fpath: no such file {source}")
    if output.exists():
        raise AtifExportError(f"+output_dirpath: {output} already exists (the export writes a new folder)")
    files: dict[str, bytes] = {}
    manifest: list[str] = []
    errors: list[str] = []
    agents: set[str] = set()
    for line, row in iter_jsonl(source):
        try:
            trajectory = rollout_to_atif(
                row, line, session_id=settings.session_id, agent_version=settings.agent_version
            )
        except AtifExportError as exc:
            errors.append(str(exc))
            continue
        agents.add(trajectory.agent.name)
        name = f"{row[TASK_INDEX_KEY]}-{row[ROLLOUT_INDEX_KEY]}.json"
        if name in files:
            errors.append(
                f"line {line}: rollout ({row[TASK_INDEX_KEY]}, {row[ROLLOUT_INDEX_KEY]}) appears twice"
            )
            continue
        files[name] = (trajectory.model_dump_json(indent=2, exclude_none=True) + "\n").encode()
        entry = {
            "trajectory_path": name,
            TASK_INDEX_KEY: row[TASK_INDEX_KEY],
            ROLLOUT_INDEX_KEY: row[ROLLOUT_INDEX_KEY],
            "expected_sha256": hashlib.sha256(files[name]).hexdigest(),
        }
        manifest.append(json.dumps(entry, sort_keys=True, separators=(",", ":")))
    if errors:
        raise AtifExportError(
            f"{source}: {len(errors)} row(s) cannot be exported:\n" + "\n".join(f"- {e}" for e in errors)
        )
    if not files:
        raise AtifExportError(f"{source}: no rollouts to export")
    if len(agents) != 1:
        raise AtifExportError(
            f"{source}: rollouts of {sorted(agents)}; export one agent per file (+agent_version is per file)"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        for name, data in files.items():
            (staging / name).write_bytes(data)
        (staging / MANIFEST_NAME).write_text("\n".join(manifest) + "\n")
        staging.chmod(0o755)
        os.replace(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output, len(files)


def _export(settings: ExportAtifSettings) -> int:
    folder, count = export_atif(settings)
    print(f"Exported {count} ATIF trajectory file(s) to {folder}")
    print(f"Manifest: {folder / MANIFEST_NAME}")
    return 0


ng_export_atif = settings_command(
    _export,
    ExportAtifSettings,
    "ng_export_atif",
    "Export rollouts as ATIF v1.7 trajectories (one JSON file per rollout and a manifest with their "
    "SHA-256) into a new folder; every row is checked first and each error names its line.",
    examples=(
        "ng_export_atif +rollouts_jsonl_fpath=results/rollouts.jsonl +output_dirpath=results/atif "
        "+session_id=run-1 +agent_version=1.0",
    ),
)
