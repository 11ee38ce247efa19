"""``gym eval compare`` (``ng_compare_runs``): a baseline run against one or more candidate runs.

A run is a rollouts file (``x.jsonl``) and its ``x_aggregate_metrics.json``; when the metrics file
is missing, the metrics are computed from the rollouts. For each agent both sides ran, the report
has one row per metric (baseline value, each candidate's value, delta and delta in percent; key
metrics marked) and, per candidate, the tasks that moved (joined on ``_ng_task_index``): with
rewards of only 0 and 1 a task passes when its mean reward is 1, and flips are ``pass_to_fail``
or ``fail_to_pass``; otherwise every task whose mean changed is listed. It writes NeMo Gym 0.7.0's
``compare_report.md`` and ``compare_report.json`` (``schema_version`` "1") into ``+output_dirpath``
(default: the last candidate's folder).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_gym.collection.collection_io import CollectionPaths, iter_jsonl
from nemo_gym.collection.metrics import compute_aggregate_metrics
from nemo_gym.collection.row_keys import agent_name_of
from nemo_gym.console.settings_command import settings_command
from nemo_gym.launch.config import ConfigError

MARKDOWN_REPORT_NAME = "compare_report.md"
JSON_REPORT_NAME = "compare_report.json"
TASK_INDEX_KEY = "_ng_task_index"
DEFAULT_AGENT = "unknown_agent"


def _paths(value: Any) -> Any:
    return [part for part in value.split(",") if part] if isinstance(value, str) else value


class CompareSettings(BaseModel):
    """The arguments of ``gym eval compare`` (NeMo Gym's ``ComparisonConfig``)."""

    model_config = ConfigDict(extra="ignore")

    baseline_rollouts_jsonl_fpath: str = Field(description="The baseline run's rollouts JSONL.")
    candidate_rollouts_jsonl_fpaths: list[str] = Field(
        description="The candidate runs' rollouts JSONL (a list, or comma-separated).",
        json_schema_extra={"metavar": "PATH[,PATH]"},
    )
    baseline_aggregate_metrics_fpath: str | None = Field(
        default=None, description="The baseline's aggregate metrics JSON, when not beside its rollouts."
    )
    candidate_aggregate_metrics_fpaths: list[str] | None = Field(
        default=None, description="The candidates' aggregate metrics JSON, in candidate order."
    )
    agent_name: str | None = Field(
        default=None, description="Compare only this agent (default: every shared one)."
    )
    baseline_agent_name: str | None = Field(
        default=None, description="The agent to read from the baseline run."
    )
    candidate_agent_names: list[str] | None = Field(
        default=None, description="The agent to read from each candidate run, in candidate order."
    )
    output_dirpath: str | None = Field(
        default=None,
        description="Where to write the report.",
        json_schema_extra={"help_default": "the last candidate's folder"},
    )
    report_format: Literal["md", "json", "both"] = Field(
        default="both", description="Report files to write: md, json or both."
    )

    _split = field_validator(
        "candidate_rollouts_jsonl_fpaths",
        "candidate_aggregate_metrics_fpaths",
        "candidate_agent_names",
        mode="before",
    )(_paths)


class Run(BaseModel):
    """One side of the comparison: its files and, per agent, metrics and per-task rewards."""

    role: Literal["baseline", "candidate"]
    index: int = 0
    rollouts_jsonl_fpath: str
    aggregate_metrics_fpath: str | None
    metrics_source: Literal["file", "computed"]
    agent_metrics: dict[str, dict[str, float]] = Field(default_factory=dict, exclude=True)
    key_metrics: dict[str, dict[str, float]] = Field(default_factory=dict, exclude=True)
    task_rewards: dict[str, dict[int, list[float]]] = Field(default_factory=dict, exclude=True)


def load_run(
    path: str, metrics_override: str | None, role: Literal["baseline", "candidate"], index: int = 0
) -> Run:
    """Read a run; a missing rollouts file or a malformed metrics file is a ConfigError naming it."""
    rollouts = Path(path)
    where = (
        "+baseline_rollouts_jsonl_fpath"
        if role == "baseline"
        else f"+candidate_rollouts_jsonl_fpaths[{index}]"
    )
    if not rollouts.is_file():
        raise ConfigError(f"{where}: no such file {rollouts}")
    rows_by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line, row in iter_jsonl(rollouts):
        if not isinstance(row.get("reward"), int | float):
            raise ConfigError(f"{rollouts}:{line}: no numeric reward (is this a rollouts file?)")
        rows_by_agent[agent_name_of(row) or DEFAULT_AGENT].append(row)
    metrics_path = (
        Path(metrics_override) if metrics_override else CollectionPaths.for_output(rollouts).aggregate_metrics
    )
    run = Run(
        role=role,
        index=index,
        rollouts_jsonl_fpath=str(rollouts),
        aggregate_metrics_fpath=str(metrics_path) if metrics_path.is_file() else None,
        metrics_source="file" if metrics_path.is_file() else "computed",
    )
    if metrics_path.is_file():
        _read_metrics_file(run, metrics_path)
    elif metrics_override:
        raise ConfigError(f"{where}: aggregate metrics file {metrics_path} does not exist")
    for agent, rows in rows_by_agent.items():
        if agent not in run.agent_metrics:
            computed = compute_aggregate_metrics(rows)
            run.agent_metrics[agent] = computed["agent_metrics"]
            run.key_metrics[agent] = computed["key_metrics"]
        tasks: dict[int, list[float]] = defaultdict(list)
        for position, row in enumerate(rows):
            task = row.get(TASK_INDEX_KEY)
            tasks[task if isinstance(task, int) else position].append(float(row["reward"]))
        run.task_rewards[agent] = dict(tasks)
    return run


def _read_metrics_file(run: Run, path: Path) -> None:
    try:
        entries = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: expected a list of per-agent entries (ng_collect_rollouts' format)")
    for position, entry in enumerate(entries):
        ref = entry.get("agent_ref") if isinstance(entry, dict) else None
        if not isinstance(ref, dict) or not isinstance(entry.get("agent_metrics"), dict):
            raise ConfigError(f"{path}: entry {position} lacks agent_ref or agent_metrics")
        name = str(ref.get("name") or DEFAULT_AGENT)
        run.agent_metrics[name] = {
            k: v for k, v in entry["agent_metrics"].items() if isinstance(v, int | float)
        }
        run.key_metrics[name] = dict(entry.get("key_metrics") or {})


def metric_rows(
    baseline: dict[str, float], candidates: list[dict[str, float]], keys: set[str]
) -> list[dict[str, Any]]:
    """One row per metric any side reports: values, deltas, where it is present."""
    rows = []
    for name in sorted(set(baseline).union(*candidates), key=lambda n: (n not in keys, n)):
        base = baseline.get(name)
        cells = []
        for candidate in candidates:
            value = candidate.get(name)
            delta = None if value is None or base is None else value - base
            pct = None if delta is None or not base else 100.0 * delta / abs(base)
            cells.append(None if value is None else {"value": value, "delta": delta, "delta_pct": pct})
        present = (["baseline"] if base is not None else []) + [
            f"candidate_{i}" for i, c in enumerate(candidates) if name in c
        ]
        rows.append(
            {
                "metric": name,
                "is_key_metric": name in keys,
                "present_in": present,
                "baseline": None if base is None else {"value": base},
                "candidates": cells,
            }
        )
    return rows


def flip_summary(
    baseline: dict[int, list[float]], candidate: dict[int, list[float]], index: int
) -> dict[str, Any]:
    """Per-task movement between two runs, joined on task index."""
    common = sorted(set(baseline) & set(candidate))
    summary: dict[str, Any] = {
        "candidate_index": index,
        "field": "reward",
        "common_task_count": len(common),
        "baseline_only_task_count": len(set(baseline) - set(candidate)),
        "candidate_only_task_count": len(set(candidate) - set(baseline)),
    }
    if not common:
        return {**summary, "mode": "unavailable", "reason": "no overlapping task indices", "flips": []}
    binary = all(r in (0.0, 1.0) for task in common for side in (baseline, candidate) for r in side[task])
    flips: list[dict[str, Any]] = []
    for task in common:
        before = sum(baseline[task]) / len(baseline[task])
        after = sum(candidate[task]) / len(candidate[task])
        if binary and (before == 1.0) == (after == 1.0):
            continue
        if not binary and before == after:
            continue
        direction = "changed" if not binary else "pass_to_fail" if before == 1.0 else "fail_to_pass"
        flips.append(
            {
                "task_index": task,
                "baseline_score": before,
                "candidate_score": after,
                "delta": after - before,
                "direction": direction,
                "baseline_rewards": baseline[task],
                "candidate_rewards": candidate[task],
            }
        )
    flips.sort(key=lambda f: (f["direction"] != "pass_to_fail", -abs(f["delta"]), f["task_index"]))
    if not binary:
        return {**summary, "mode": "continuous", "unchanged_count": len(common) - len(flips), "flips": flips}
    down = sum(f["direction"] == "pass_to_fail" for f in flips)
    return {
        **summary,
        "mode": "binary",
        "pass_to_fail_count": down,
        "fail_to_pass_count": len(flips) - down,
        "unchanged_count": len(common) - len(flips),
        "net": len(flips) - 2 * down,
        "flips": flips,
    }


def _one_agent(run: Run, name: str | None, where: str) -> str:
    """``name`` if the run has it; without a name, the run's only agent."""
    agents = sorted(run.agent_metrics)
    if name is None:
        if len(agents) != 1:
            raise ConfigError(f"{where}: the {run.role} run has agents {agents}; name one")
        return agents[0]
    if name not in run.agent_metrics:
        raise ConfigError(f"{where}: {name!r} is not an agent of the {run.role} run (it has {agents})")
    return name


def select_agents(
    settings: CompareSettings, baseline: Run, candidates: list[Run]
) -> tuple[list[tuple[str, list[str]]], dict[str, list[str]]]:
    """Which agent each side reads, most specific first: per-side names, then +agent_name, then
    every agent all runs have. Also the agents left out, by run."""
    per_side = settings.candidate_agent_names or []
    if per_side and len(per_side) != len(candidates):
        raise ConfigError("+candidate_agent_names: give one per candidate, in the same order")
    if settings.baseline_agent_name or per_side:
        base = _one_agent(
            baseline, settings.baseline_agent_name or settings.agent_name, "+baseline_agent_name"
        )
        chosen = [
            _one_agent(c, per_side[i] if per_side else settings.agent_name, "+candidate_agent_names")
            for i, c in enumerate(candidates)
        ]
        return [(base, chosen)], {}
    if settings.agent_name:
        for run in (baseline, *candidates):
            _one_agent(run, settings.agent_name, "+agent_name")
        return [(settings.agent_name, [settings.agent_name] * len(candidates))], {}
    shared = set(baseline.agent_metrics).intersection(*(c.agent_metrics for c in candidates))
    if not shared:
        raise ConfigError(
            f"the runs share no agent (baseline: {sorted(baseline.agent_metrics)}, "
            f"candidates: {[sorted(c.agent_metrics) for c in candidates]}); give +agent_name, or "
            "+baseline_agent_name and +candidate_agent_names"
        )
    skipped = {
        ("baseline" if run.role == "baseline" else f"candidate[{run.index}]"): extra
        for run in (baseline, *candidates)
        if (extra := sorted(set(run.agent_metrics) - shared))
    }
    return [(agent, [agent] * len(candidates)) for agent in sorted(shared)], skipped


def compare(settings: CompareSettings, command: str) -> dict[str, Any]:
    """The comparison report (NeMo Gym's ``ComparisonResult`` shape, as JSON-ready data)."""
    overrides = settings.candidate_aggregate_metrics_fpaths or []
    if overrides and len(overrides) != len(settings.candidate_rollouts_jsonl_fpaths):
        raise ConfigError("+candidate_aggregate_metrics_fpaths: give one per candidate, in the same order")
    baseline = load_run(
        settings.baseline_rollouts_jsonl_fpath, settings.baseline_aggregate_metrics_fpath, "baseline"
    )
    candidates = [
        load_run(path, overrides[i] if overrides else None, "candidate", i)
        for i, path in enumerate(settings.candidate_rollouts_jsonl_fpaths)
    ]
    selections, skipped = select_agents(settings, baseline, candidates)
    comparisons = []
    for base_agent, agents in selections:
        keys = set(baseline.key_metrics.get(base_agent, {}))
        comparisons.append(
            {
                "baseline_agent": base_agent,
                "candidate_agents": agents,
                "baseline_task_count": len(baseline.task_rewards.get(base_agent, {})),
                "candidate_task_counts": [
                    len(c.task_rewards.get(a, {})) for c, a in zip(candidates, agents, strict=True)
                ],
                "metrics": metric_rows(
                    baseline.agent_metrics[base_agent],
                    [c.agent_metrics[a] for c, a in zip(candidates, agents, strict=True)],
                    keys,
                ),
                "flips": [
                    flip_summary(baseline.task_rewards.get(base_agent, {}), c.task_rewards.get(a, {}), i)
                    for i, (c, a) in enumerate(zip(candidates, agents, strict=True))
                ],
            }
        )
    from nemo_gym import __version__

    return {
        "schema_version": "1",
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "nemo_gym_version": __version__,
        "command": command,
        "baseline": baseline.model_dump(),
        "candidates": [c.model_dump() for c in candidates],
        "comparisons": comparisons,
        "skipped_agents": skipped,
    }


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: a metric table and the flipped tasks per agent."""
    lines = [
        "# Eval comparison",
        "",
        f"Baseline: `{report['baseline']['rollouts_jsonl_fpath']}`",
        *[f"Candidate {c['index']}: `{c['rollouts_jsonl_fpath']}`" for c in report["candidates"]],
    ]
    for block in report["comparisons"]:
        lines += [
            "",
            f"## {block['baseline_agent']}",
            "",
            "| metric | baseline | "
            + " | ".join(f"candidate {i} | delta" for i in range(len(block["candidate_agents"])))
            + " |",
            "|---|---|" + "---|---|" * len(block["candidate_agents"]),
        ]
        for row in block["metrics"]:
            base = row["baseline"]["value"] if row["baseline"] else None
            cells = [_number(base)]
            for cell in row["candidates"]:
                cells += [_number(cell and cell["value"]), _number(cell and cell["delta"], signed=True)]
            name = f"**{row['metric']}**" if row["is_key_metric"] else row["metric"]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        for flips in block["flips"]:
            lines += ["", f"Task flips, candidate {flips['candidate_index']} ({flips['mode']}):"]
            if flips["mode"] == "binary":
                lines.append(
                    f"{flips['fail_to_pass_count']} fail->pass, {flips['pass_to_fail_count']} pass->fail, "
                    f"net {flips['net']:+d}, {flips['unchanged_count']} unchanged"
                )
            lines += [
                f"- task {f['task_index']}: {f['baseline_score']:.3g} -> {f['candidate_score']:.3g} ({f['direction']})"
                for f in flips["flips"][:50]
            ]
    lines += [
        "",
        f"Machine-readable output: `{JSON_REPORT_NAME}` (schema_version {report['schema_version']}).",
    ]
    return "\n".join(lines) + "\n"


def _number(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def _compare(settings: CompareSettings) -> int:
    command = shlex.join(["gym", "eval", "compare", *sys.argv[1:]])
    report = compare(settings, command)
    target = Path(settings.output_dirpath or Path(settings.candidate_rollouts_jsonl_fpaths[-1]).parent)
    target.mkdir(parents=True, exist_ok=True)
    if settings.report_format in ("md", "both"):
        (target / MARKDOWN_REPORT_NAME).write_text(render_markdown(report))
        print(f"wrote {target / MARKDOWN_REPORT_NAME}")
    if settings.report_format in ("json", "both"):
        (target / JSON_REPORT_NAME).write_text(json.dumps(report, indent=2))
        print(f"wrote {target / JSON_REPORT_NAME}")
    for block in report["comparisons"]:
        for flips in block["flips"]:
            if flips["mode"] == "binary":
                print(
                    f"{block['baseline_agent']} candidate {flips['candidate_index']}: "
                    f"{flips['fail_to_pass_count']} fail->pass, {flips['pass_to_fail_count']} pass->fail"
                )
    return 0


ng_compare_runs = settings_command(
    _compare,
    CompareSettings,
    "ng_compare_runs",
    "Compare a baseline eval run against candidate runs: every metric side by side with its delta, and "
    "the tasks that flipped; writes compare_report.md and compare_report.json.",
    examples=(
        "ng_compare_runs +baseline_rollouts_jsonl_fpath=results/base.jsonl "
        "+candidate_rollouts_jsonl_fpaths=results/new.jsonl",
    ),
)
