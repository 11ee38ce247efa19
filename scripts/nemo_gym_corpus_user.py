"""The corpus through the user's own path: ``nemo_gym_corpus.py --user-path``.

Per folder of a ``nemo-gym`` release: a fresh project (a copy of this repository's bundled
folders, lint and test settings: what a clone holds besides ``nemo_gym/``), ``gym env pull
NAME==VERSION`` into it, ``gym env test`` on what was pulled, and, for a resources server with
example data, ``gym eval run`` of two example rows on the scripted model. Everything runs in
subprocesses with the same ``gym`` a user types, under one virtual environment per release
layered on this one (what the pulls install goes there). Results are appended to a JSON-lines
file as each folder finishes, so a long run that is cut still reports what it did.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from nemo_gym.launch.config import project_root
from nemo_gym.tools.env_example_run import declared_cohort, example_run
from nemo_gym.tools.env_pull_needs import classify_folder, folder_needs
from nemo_gym.tools.failure_reason import failure_reason

SCRIPTED = "responses_api_models/scripted_model/configs/scripted_model.yaml"
# What a clone of this repository holds besides nemo_gym/ that a pull and a test run read.
PROJECT_TREES = ("resources_servers", "responses_api_agents", "responses_api_models", "benchmarks")
PROJECT_FILES = ("conftest.py", "pyproject.toml")


@dataclasses.dataclass
class UserPathResult:
    """One folder through pull, test and (resources servers with example data) eval run."""

    kind: str
    name: str
    needs: dict[str, str] = dataclasses.field(default_factory=dict)
    pulled: bool = False
    pull_note: str = ""
    tested: bool = False
    test_note: str = ""
    ran: bool | None = None
    run_note: str = ""
    seconds: float = 0.0

    @property
    def folder(self) -> str:
        """``kind/name``."""
        return f"{self.kind}/{self.name}"

    @property
    def eligible(self) -> bool:
        """A resources server needing no GPU, network or private data; an agent or model adapter
        whose pull (requirements included) succeeded and that needs no GPU (the pull leaves GPU
        stacks such as vLLM uninstalled)."""
        if self.kind == "resources_servers":
            return not ({"gpu", "network", "private_data"} & set(self.needs))
        return self.pulled and "gpu" not in self.needs

    @property
    def passes(self) -> bool:
        """Pulled, its tests passed, and its eval run (when it has one) finished."""
        return self.pulled and self.tested and self.ran is not False

    @property
    def reason(self) -> str:
        """Why it failed (the first step that did), or ``""``."""
        if not self.pulled:
            return f"pull: {self.pull_note}"
        if not self.tested:
            return f"test: {self.test_note}"
        if self.ran is False:
            return f"run: {self.run_note}"
        return ""


def fresh_project(dest: Path) -> Path:
    """A copy of what a user's clone holds: ``nemo_gym/`` too, so that NeMo Gym's ``PARENT_DIR``
    (the folder holding ``nemo_gym``, where its folders' tests look for their companions) is the
    project, as in a clone."""
    dest.mkdir(parents=True)
    for tree in ("nemo_gym", *PROJECT_TREES):
        shutil.copytree(project_root() / tree, dest / tree, ignore=shutil.ignore_patterns("__pycache__"))
    for name in PROJECT_FILES:
        shutil.copy2(project_root() / name, dest / name)
    return dest


def run_user_path(
    kind: str,
    name: str,
    version: str,
    wheel_root: Path,
    scratch: Path,
    python: Path,
    run_bounded: Any,
    timeout: float,
    install_timeout: float,
) -> UserPathResult:
    """Pull, test and run one folder in a fresh project under ``scratch``."""
    started = time.monotonic()
    result = UserPathResult(kind=kind, name=name, needs=folder_needs(wheel_root / kind / name, wheel_root))
    project = fresh_project(scratch / f"{kind}__{name}")
    # The project's own nemo_gym is the one imported, as in a clone; nothing else points at it.
    env = dict(os.environ, PYTHONPATH=str(project), PYTHONDONTWRITEBYTECODE="1")
    env.pop("NEMO_GYM_EXTRA_ROOTS", None)
    gym = [str(python), "-c", "from nemo_gym.tools.gym_cli import main; main()"]
    code, out = run_bounded(
        [*gym, "env", "pull", f"{name}=={version}", f"+kind={kind}", f"+project_dir={project}",
         "+replace_bundled=true", "+force=true"],
        project, env, install_timeout,
    )  # fmt: skip
    result.pulled = code == 0
    result.pull_note = failure_reason(out) if code != 0 else _pull_summary(out)
    served = [ln.strip() for ln in out.splitlines() if ": on the index as " in ln]
    if code != 0 and served:  # a requirement from a git clone that the index would serve
        result.pull_note = f"{result.pull_note[:150]} [{'; '.join(served)}]"
    if result.pulled:
        folder = project / kind / name
        # A group of servers (one per stage, sharing a requirements.txt) passes when each does.
        group = (
            [] if (folder / "app.py").is_file() else sorted(p.parent.name for p in folder.glob("*/app.py"))
        )
        result.tested = True
        for target in [f"{kind}/{name}/{g}" for g in group] or [f"{kind}/{name}"]:
            code, out = run_bounded([*gym, "env", "test", target], project, env, timeout)
            if code != 0 and result.tested:
                result.tested = False
                checked = target.rsplit("/", 1)[-1]  # the name ng_test's own lines carry
                result.test_note = (f"{target}: " if group else "") + failure_reason(out, checked)
        run = example_run(folder) if kind == "resources_servers" else None
        rows = folder / "data" / "example.jsonl"
        if result.tested and run is not None and rows.is_file():
            if "data_step" in result.needs:
                result.run_note = f"not run: needs a data step ({result.needs['data_step']})"
            else:
                output = scratch / f"{kind}__{name}.rollouts.jsonl"
                run_config = scripted_config(run.config, project / f"{name}.corpus_scripted.yaml")
                policy = policy_script(folder, rows, project / f"{name}.corpus_policy.yaml")
                rows = routed_rows(rows, run.agent, scratch / f"{kind}__{name}.rows.jsonl", limit=2)
                code, out = run_bounded(
                    [*gym, "eval", "run", f"+config_paths=[{run_config},{SCRIPTED},{policy}]",
                     f"+input_jsonl_fpath={rows}", f"+output_jsonl_fpath={output}", "+limit=2",
                     *cohort_overrides(run.config, rows=2), "head_server.port=0"],
                    project, env, timeout,
                )  # fmt: skip
                result.ran = code == 0
                result.run_note = _run_failure(output, out) if code != 0 else ""
    result.seconds = time.monotonic() - started
    shutil.rmtree(project, ignore_errors=True)
    return result


def cohort_overrides(config: Path, rows: int) -> list[str]:
    """For a config whose resources server scores n rollouts of a row together (its
    ``num_rollouts_per_prompt``: :func:`~nemo_gym.tools.env_example_run.declared_cohort`), the
    overrides a user's run needs: n repeats of each row, all ``rows * n`` in flight at once
    (a verify waits for its whole cohort). Nothing for any other config."""
    cohort = declared_cohort(config)
    if cohort is None:
        return []
    return [f"+num_repeats={cohort[0]}", f"+num_samples_in_parallel={rows * cohort[0]}"]


def routed_rows(rows: Path, agent: str | None, dest: Path, limit: int) -> Path:
    """The first ``limit`` example rows, routed to ``agent`` (its ``agent_ref``) when one was
    chosen: what NeMo Gym's ``+agent_name`` does from 0.6.0 on (it overrides a row's
    ``agent_ref``; rows naming an agent their config does not declare exist in the wheels)."""
    if agent is None:
        return rows
    out = []
    for line in rows.read_text().splitlines():
        if line.strip() and len(out) < limit:
            row = json.loads(line)
            row["agent_ref"] = {**(row.get("agent_ref") or {}), "name": agent}
            out.append(json.dumps(row))
    dest.write_text("\n".join(out) + "\n")
    return dest


# The scripted model's default script calls the first tool the request offers. Rows that offer
# none get the assistant's answers recorded in the folder's data/example_rollouts.jsonl (a
# game's moves, an answer in the format the task asks for), turn by turn, else a plain answer.
PLAIN_ANSWER = "The answer is 4."


def recorded_answers(folder: Path, limit: int = 20) -> list[str]:
    """The assistant's text answers of the first recorded example rollout, in order."""
    try:
        first = json.loads((folder / "data" / "example_rollouts.jsonl").read_text().splitlines()[0])
    except (OSError, IndexError, ValueError):
        return []
    answers = []
    for item in (first.get("response") or {}).get("output") or [] if isinstance(first, dict) else []:
        if isinstance(item, dict) and item.get("type") == "message" and item.get("role") == "assistant":
            parts = item.get("content") if isinstance(item.get("content"), list) else []
            text = "".join(
                p.get("text") or "" for p in parts if isinstance(p, dict) and p.get("type") == "output_text"
            )
            if text:
                answers.append(text)
    return answers[:limit]


def policy_script(folder: Path, rows: Path, dest: Path) -> Path:
    """A config giving the scripted policy its script for ``rows`` (see above), written to ``dest``."""
    import yaml

    try:
        first = json.loads(rows.read_text().splitlines()[0])
    except (IndexError, ValueError):
        first = {}
    if (first.get("responses_create_params") or {}).get("tools"):
        turns: list[dict[str, Any]] = [
            {"call_tool": "first"},
            {"text": "Here is what I found: {tool_output}"},
        ]
    else:
        # Braces doubled: a script's text is a template.
        texts = recorded_answers(folder) or [PLAIN_ANSWER]
        turns = [{"text": t.replace("{", "{{").replace("}", "}}")} for t in texts]
    script = {"policy_model": {"responses_api_models": {"scripted_model": {"scripts": [{"turns": turns}]}}}}
    dest.write_text(yaml.safe_dump(script, sort_keys=False))
    return dest


def scripted_config(config: Path, dest: Path) -> Path:
    """``config`` with every model server besides ``policy_model`` (a judge, declared or only
    referred to) served by the scripted model: the run needs no endpoint or key. Written to ``dest``."""
    import yaml

    data = yaml.safe_load(config.read_text()) or {}
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "responses_api_models" and isinstance(node.get("name"), str):
                found.add(node["name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(data)
    declared = {k for k, v in data.items() if isinstance(v, dict) and "responses_api_models" in v}
    for name in sorted((found | declared) - {"policy_model"}):
        # A judge is asked without tools: it answers in one plain turn.
        judge = {"entrypoint": "app.py", "scripts": [{"turns": [{"text": "Yes"}]}]}
        data[name] = {"responses_api_models": {"scripted_model": judge}}
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def _run_failure(output: Path, out: str) -> str:
    """Why an eval run failed: the first failed rollout's error, else the command's error line."""
    failures = output.with_name(output.stem + "_failures.jsonl")
    if failures.is_file():
        for line in failures.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("_ng_error"):
                return f"{row.get('_ng_failure_class', 'failed')}: {row['_ng_error']}"[:300]
    return failure_reason(out)


def _pull_summary(out: str) -> str:
    notes = [
        ln
        for ln in out.splitlines()
        if ln.startswith(("also pulled", "replaced", "pinned", "release pins", "installed", "not installed"))
    ]
    return "; ".join(notes)[:300]


def user_path_table(results: list[UserPathResult]) -> str:
    """A Markdown table: folder, needs, pulled, tests, eval run, reason."""
    lines = ["| folder | needs | pull | tests | eval run | reason |", "|---|---|---|---|---|---|"]
    for r in results:
        ran = "-" if r.ran is None else ("ok" if r.ran else "FAIL")
        needs = ", ".join(sorted(r.needs)) or "-"
        reason = (r.reason or (r.run_note if r.ran is None and r.run_note else "")).replace("|", "\\|")
        lines.append(
            f"| {r.folder} | {needs} | {'ok' if r.pulled else 'FAIL'} | "
            f"{'ok' if r.tested else ('FAIL' if r.pulled else '-')} | {ran} | {reason} |"
        )
    return "\n".join(lines)


def user_path_summary(results: list[UserPathResult], version: str) -> str:
    """Per kind: eligible folders that pass (and the share)."""
    parts = []
    for kind in ("resources_servers", "responses_api_agents", "responses_api_models"):
        mine = [r for r in results if r.kind == kind]
        if not mine:
            continue
        eligible = [r for r in mine if r.eligible]
        passing = [r for r in eligible if r.passes]
        share = f"{100 * len(passing) / len(eligible):.1f}%" if eligible else "-"
        parts.append(f"{kind}: {len(passing)}/{len(eligible)} eligible pass ({share}; {len(mine)} run)")
    return f"nemo-gym {version} through the user's path: " + "; ".join(parts)


def append_jsonl(path: Path, result: UserPathResult) -> None:
    """One result as a JSON line (the run can be cut and still be reported)."""
    with path.open("a") as f:
        f.write(
            json.dumps(dict(dataclasses.asdict(result), passes=result.passes, eligible=result.eligible))
            + "\n"
        )


def read_jsonl(path: Path) -> list[UserPathResult]:
    """Results written by :func:`append_jsonl`."""
    fields = {f.name for f in dataclasses.fields(UserPathResult)}
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out.append(UserPathResult(**{k: v for k, v in row.items() if k in fields}))
    return out


def layered_python(venv: Path) -> Path:
    """A venv layered on this one (a .pth file naming this interpreter's site-packages), once."""
    import subprocess

    python = venv / "bin" / "python"
    if python.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "_nemo_gym_corpus_layers.pth").write_text("\n".join(ours) + "\n")
    return python


__all__ = ["classify_folder", "UserPathResult", "run_user_path", "user_path_table", "user_path_summary"]
