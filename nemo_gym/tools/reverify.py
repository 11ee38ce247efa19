"""``ng_reverify_rollouts`` (``gym eval reverify``): re-score existing rollouts with the current environment.

Each result row's recorded ``response`` is replayed through its environment, ``/seed_session``
then ``/verify`` in one session, exactly as the agent did when it was collected; no model is
called. The re-scored rows go to a new file (each with ``_ng_previous_reward``), and the report
says how many rewards changed, which ones, and the mean before and after. A row whose verify
fails is reported and keeps its recorded reward in the output (never a reward of 0).

By default the command starts only the servers the verify calls need (the environments of the
rows' agents and whatever those reference, e.g. a judge model) on a free head port, and stops
them afterwards; ``+use_running_stack=true`` uses the stack at ``head_server`` instead.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collection.collection_io import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, iter_jsonl
from nemo_gym.console.command import console_command
from nemo_gym.launch.config import (
    ConfigError,
    head_url_from_config,
    iter_server_refs,
    load_config,
    server_instances,
)

AGENT_KIND = "responses_api_agents"
RESOURCES_KIND = "resources_servers"
PREVIOUS_REWARD_KEY = "_ng_previous_reward"
REVERIFY_ERROR_KEY = "_ng_reverify_error"
MAX_CHANGES_SHOWN = 20


@dataclass
class ReverifyChange:
    """One row whose reward changed (or whose verify failed: ``error`` set, ``new`` None)."""

    line: int
    task_index: Any
    rollout_index: Any
    old: float | None
    new: float | None
    error: str | None = None


@dataclass
class ReverifyReport:
    """What a re-verification found."""

    rows: int = 0
    unchanged: int = 0
    changes: list[ReverifyChange] = field(default_factory=list)
    failures: list[ReverifyChange] = field(default_factory=list)
    old_rewards: list[float] = field(default_factory=list)
    new_rewards: list[float] = field(default_factory=list)

    def summary(self) -> str:
        """A few lines for the terminal."""

        def mean(values: list[float]) -> str:
            return f"{sum(values) / len(values):.4f}" if values else "n/a"

        lines = [
            f"re-verified {self.rows} rollouts: {len(self.changes)} reward(s) changed, {self.unchanged} unchanged, "
            f"{len(self.failures)} verify failure(s)",
            f"mean reward: {mean(self.old_rewards)} recorded -> {mean(self.new_rewards)} now "
            f"(over the {len(self.new_rewards)} rows verified)",
        ]
        for change in self.changes[:MAX_CHANGES_SHOWN]:
            lines.append(
                f"  line {change.line} (task {change.task_index}, rollout {change.rollout_index}): "
                f"{change.old} -> {change.new}"
            )
        if len(self.changes) > MAX_CHANGES_SHOWN:
            lines.append(
                f"  ... and {len(self.changes) - MAX_CHANGES_SHOWN} more changed rows (see the output file)"
            )
        for failure in self.failures[:MAX_CHANGES_SHOWN]:
            lines.append(f"  line {failure.line}: verify failed, recorded reward kept: {failure.error}")
        return "\n".join(lines)


def read_rollouts(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` for every result row; a bad line, or one without a response, fails naming it."""
    rows = []
    for number, row in iter_jsonl(path):
        if not isinstance(row.get("response"), dict):
            raise ConfigError(
                f"{path}:{number}: no recorded 'response' to re-verify (is this a results file?)"
            )
        rows.append((number, row))
    return rows


def environment_of_agents(config: Mapping[str, Any]) -> dict[str, str]:
    """Agent instance name → the resources server instance it verifies with."""
    instances = server_instances(config)
    found = {}
    for instance in instances.values():
        if instance.type != AGENT_KIND:
            continue
        refs = [ref["name"] for _, ref in iter_server_refs(instance.fields) if ref["type"] == RESOURCES_KIND]
        if refs:
            found[instance.name] = refs[0]
    return found


def verify_only_config(config: Mapping[str, Any], environments: set[str]) -> dict[str, Any]:
    """The config with only ``environments`` and the servers they reference (judges), plus globals."""
    instances = server_instances(config)
    keep: set[str] = set()
    pending = list(environments)
    while pending:
        name = pending.pop()
        if name in keep or name not in instances:
            continue
        keep.add(name)
        pending += [ref["name"] for _, ref in iter_server_refs(instances[name].fields)]
    return {key: value for key, value in config.items() if key not in instances or key in keep}


def _agent_of(row: dict[str, Any], default_agent: str | None, line: int, path: Path) -> str:
    ref = row.get("agent_ref")
    if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
        return ref["name"]
    if default_agent:
        return default_agent
    raise ConfigError(f"{path}:{line}: the row has no agent_ref; pass +agent_name=<agent>")


def _reward(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


async def reverify_rows(
    rows: list[tuple[int, dict[str, Any]]],
    environment_for_row: list[str],
    client: Any,
    parallel: int = 32,
) -> tuple[list[dict[str, Any]], ReverifyReport]:
    """Verify every row again through ``client`` (a ``ServerClient``); the re-scored rows and the report."""
    semaphore = asyncio.Semaphore(parallel)
    report = ReverifyReport(rows=len(rows))

    async def one(line: int, row: dict[str, Any], environment: str) -> tuple[dict[str, Any], ReverifyChange]:
        body = {key: value for key, value in row.items() if not key.startswith("_ng_")}
        old = _reward(row.get("reward"))
        change = ReverifyChange(line, row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY), old, None)
        async with semaphore:
            rollout = client.rollout()
            try:
                await rollout.post_json(environment, "/seed_session", body)
                verified = await rollout.post_json(environment, "/verify", body)
            except Exception as exc:  # noqa: BLE001 - any failure is reported for this row, never a reward
                change.error = f"{environment}: {exc}"
                return {**row, REVERIFY_ERROR_KEY: change.error}, change
        change.new = _reward(verified.get("reward")) if isinstance(verified, dict) else None
        if change.new is None:
            change.error = f"{environment}: /verify answered without a numeric reward"
            return {**row, REVERIFY_ERROR_KEY: change.error}, change
        new_row = {
            **row,
            **{k: v for k, v in verified.items() if k not in ("responses_create_params", "response")},
        }
        new_row[PREVIOUS_REWARD_KEY] = old
        return new_row, change

    results = await asyncio.gather(
        *(one(line, row, env) for (line, row), env in zip(rows, environment_for_row, strict=True))
    )
    out_rows = []
    for new_row, change in results:
        out_rows.append(new_row)
        if change.error:
            report.failures.append(change)
            continue
        assert change.new is not None
        if change.old is not None:
            report.old_rewards.append(change.old)
        report.new_rewards.append(change.new)
        if change.old is None or abs(change.new - change.old) > 1e-9:
            report.changes.append(change)
        else:
            report.unchanged += 1
    return out_rows, report


def reverify(config: Mapping[str, Any]) -> int:
    """Run ``ng_reverify_rollouts`` on a loaded config; returns the exit code (1 if a verify failed)."""
    from nemo_gym.launch.launcher import StackHandle
    from nemo_gym.serving.server_client import ServerClient

    input_arg = config.get("input_jsonl_fpath")
    if not input_arg or not Path(str(input_arg)).is_file():
        raise ConfigError(f"+input_jsonl_fpath must name an existing rollouts JSONL file, got {input_arg!r}")
    input_path = Path(str(input_arg))
    output_path = Path(str(config.get("output_jsonl_fpath") or input_path.with_suffix(".reverified.jsonl")))
    if output_path.resolve() == input_path.resolve():
        raise ConfigError(
            "+output_jsonl_fpath must differ from +input_jsonl_fpath (the recorded rows are kept)"
        )
    agents = environment_of_agents(config)
    if not agents:
        raise ConfigError(
            "no agent with a resources_server in the config; add the environment's config to +config_paths"
        )
    default_agent = config.get("agent_name") or (next(iter(agents)) if len(agents) == 1 else None)
    rows = read_rollouts(input_path)
    environments = []
    for line, row in rows:
        agent = _agent_of(row, default_agent, line, input_path)
        if agent not in agents:
            raise ConfigError(
                f"{input_path}:{line}: agent {agent!r} is not in the config; configured agents: {', '.join(sorted(agents))}"
            )
        environments.append(agents[agent])
    parallel = int(config.get("num_samples_in_parallel") or 32)

    async def run(head_url: str) -> tuple[list[dict[str, Any]], ReverifyReport]:
        client = ServerClient(head_url)
        try:
            return await reverify_rows(rows, environments, client, parallel)
        finally:
            await client.close()

    if config.get("use_running_stack"):
        out_rows, report = asyncio.run(run(head_url_from_config(config)))
    else:
        stack_config = verify_only_config(config, set(environments))
        stack_config["head_server"] = {**dict(config.get("head_server") or {}), "port": 0}
        handle = StackHandle.start(stack_config)
        try:
            out_rows, report = asyncio.run(run(handle.head_url))
        finally:
            handle.stop()
    output_path.parent.mkdir(parents=True, exist_ok=True)
    partial = output_path.with_name(output_path.name + ".partial")
    with partial.open("wb") as handle_out:
        for row in out_rows:
            handle_out.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    os.replace(partial, output_path)
    print(report.summary())
    print(f"wrote {len(out_rows)} re-verified rows to {output_path}")
    return 1 if report.failures else 0


def _reverify_command(argv: list[str]) -> int:
    # Only the environments start: the model servers the agents name need not be configured.
    return reverify(load_config(argv, validate_refs=False))


ng_reverify_rollouts = console_command(_reverify_command, "ng_reverify_rollouts")
