"""Which config and agent run a resources server's example rows, read from its folder.

NeMo Gym validates a folder's ``data/example.jsonl`` with the agent whose ``datasets`` list it
as its ``example`` dataset; rows may also name their agent (``agent_ref.name``). A folder can
hold several configs (the server alone, the server with an example agent, a variant with a
sandboxed agent): :func:`example_run` picks the one NeMo Gym's own example run would use, so
``gym env pull``'s advice, ``gym list environments --available`` and the corpus script agree.
Nothing is imported or run: the configs are read as YAML.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AGENTS = "responses_api_agents"
RESOURCES = "resources_servers"


@dataclass(frozen=True)
class ExampleRun:
    """The config to start and the agent the example rows go to.

    ``agent``: the agent instance to route every row to (``+agent_name``), or None when the rows
    name a declared agent themselves (or no agent could be chosen). ``implementation``: that
    agent's folder under ``responses_api_agents/`` (None when unknown).
    """

    config: Path
    agent: str | None = None
    implementation: str | None = None


def _load(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(errors="replace"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def declared_agents(config: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """``{instance: (implementation, block)}`` for every agent a config declares."""
    out = {}
    for instance, block in config.items():
        impls = block.get(AGENTS) if isinstance(block, dict) else None
        if isinstance(impls, dict) and len(impls) == 1:
            impl, body = next(iter(impls.items()))
            out[str(instance)] = (str(impl), body if isinstance(body, dict) else {})
    return out


def started_servers(config: Path) -> list[str]:
    """The resources server implementations (folder names) a config file declares, in order."""
    out: list[str] = []
    for block in _load(config).values():
        impls = block.get(RESOURCES) if isinstance(block, dict) else None
        if isinstance(impls, dict):
            out += [str(impl) for impl in impls if str(impl) not in out]
    return out


# A resources server that scores rollouts of one prompt together (a group-relative reward) says
# how many it waits for: ``num_rollouts_per_prompt: 16`` (genrm_compare). Fewer never complete one.
_COHORT_KEY = re.compile(r"^num_\w*_per_(prompt|task|group)$")


def declared_cohort(config: Path) -> tuple[int, str] | None:
    """``(n, key)`` when a resources server the config declares verifies ``n`` > 1 rollouts of
    the same row together (its ``num_rollouts_per_prompt``-style key): a run must send that many
    repeats of each row, all in flight at once. None otherwise."""
    for block in _load(config).values():
        impls = block.get(RESOURCES) if isinstance(block, dict) else None
        for body in impls.values() if isinstance(impls, dict) else []:
            for key, value in body.items() if isinstance(body, dict) else []:
                if (
                    _COHORT_KEY.match(str(key))
                    and isinstance(value, int)
                    and not isinstance(value, bool)
                    and value > 1
                ):
                    return value, str(key)
    return None


def _declares_server(config: dict[str, Any], name: str) -> bool:
    return any(
        isinstance(block, dict)
        and isinstance(block.get("resources_servers"), dict)
        and name in block["resources_servers"]
        for block in config.values()
    )


def _example_dataset(body: dict[str, Any], folder_name: str) -> bool:
    """Whether an agent lists ``resources_servers/<folder_name>/data/example.jsonl`` as its example data."""
    for entry in body.get("datasets") or []:
        path = str(entry.get("jsonl_fpath", "")) if isinstance(entry, dict) else ""
        if entry.get("type") == "example" and path.endswith(f"{folder_name}/data/example.jsonl"):
            return True
    return False


def row_agent(rows: Path) -> str:
    """The ``agent_ref.name`` of the first example row ("" when none)."""
    try:
        first = json.loads(rows.read_text(errors="replace").splitlines()[0])
        return str((first.get("agent_ref") or {}).get("name") or "")
    except (OSError, IndexError, ValueError, AttributeError):
        return ""


def example_run(folder: Path) -> ExampleRun | None:
    """The config and agent that run ``folder``'s example rows, or None when no config declares
    the server.

    The rule, first match wins: the config declaring the agent the rows name; the one agent
    (across the folder's configs) whose ``example`` dataset is this folder's
    ``data/example.jsonl``; the one agent ``configs/NAME.yaml`` declares; the one agent any
    config declares. Failing all four, ``configs/NAME.yaml`` (or the first config declaring
    the server) with no agent chosen: the rows' own ``agent_ref`` decides.
    """
    configs = {path: _load(path) for path in sorted((folder / "configs").glob("*.yaml"))}
    agents = {path: declared_agents(data) for path, data in configs.items()}
    named = row_agent(folder / "data" / "example.jsonl")
    for path, declared in agents.items():
        if named and named in declared:
            return ExampleRun(path, None, declared[named][0])
    own = folder / "configs" / f"{folder.name}.yaml"
    choices = [
        [
            (p, i, impl)
            for p, d in agents.items()
            for i, (impl, body) in d.items()
            if _example_dataset(body, folder.name)
        ],
        [(own, i, impl) for i, (impl, _) in agents.get(own, {}).items()],
        [(p, i, impl) for p, d in agents.items() for i, (impl, _) in d.items()],
    ]
    for found in choices:
        if len({instance for _, instance, _ in found}) == 1:
            path, instance, impl = found[0]
            return ExampleRun(path, instance, impl)
    if own in configs:
        return ExampleRun(own)
    for path, data in configs.items():
        if _declares_server(data, folder.name):
            return ExampleRun(path)
    return None
