"""``gym env packages`` (``ng_pip_list``): the Python packages a resources server runs with.

NeMo Gym gives each server a virtual environment of its own and lists it with ``uv pip list``.
Here every server runs in the project's one environment, so the command lists that
environment's packages; with ``+entrypoint`` it lists what the server needs: its own
requirements (``requirements.txt`` or ``pyproject.toml``) and the distributions its code
imports, with the version installed of each (``not installed`` or ``unmet`` when the
environment falls short).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.console.settings_command import settings_command
from nemo_gym.tools.authoring import find_server_folder
from nemo_gym.tools.env_pull_requirements import folder_requirements, unmet_requirements


class PackagesSettings(BaseModel):
    """The arguments of ``gym env packages`` (NeMo Gym's ``PipListConfig``)."""

    model_config = ConfigDict(extra="ignore")

    entrypoint: str | None = Field(
        default=None,
        description="A resources server folder: list its requirements (gym: --resources-server NAME).",
        json_schema_extra={"metavar": "resources_servers/NAME", "help_default": "the whole environment"},
    )
    format: Literal["columns", "freeze", "json"] | None = Field(
        default=None,
        description="Output format: columns, freeze or json.",
        json_schema_extra={"help_default": "columns"},
    )
    outdated: bool = Field(default=False, description="List only outdated packages (asks the package index).")


FIRST_PARTY = frozenset(
    {"nemo_gym", "resources_servers", "responses_api_agents", "responses_api_models", "app"}
)


def imported_distributions(folder: Path) -> list[str]:
    """The installed distributions (or, for a module nothing provides, the module name) that the
    folder's Python files import, outside the standard library and this project."""
    modules: set[str] = set()
    local = {p.stem for p in folder.rglob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
    for path in sorted(folder.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    providers = metadata.packages_distributions()
    found: set[str] = set()
    for module in modules - set(sys.stdlib_module_names) - FIRST_PARTY - local - {"__future__"}:
        found.update(providers.get(module, [module]))
    return sorted(found, key=str.lower)


def requirement_rows(folder: Path) -> list[dict[str, str]]:
    """``{name, requirement, version}`` for each requirement of ``folder`` and each distribution its
    code imports; version is the installed one, ``not installed``, or ``unmet: X`` when the
    installed X does not satisfy the line."""
    from packaging.requirements import InvalidRequirement, Requirement

    reqs = folder_requirements(folder)
    named = set()
    for req in reqs:
        try:
            named.add(Requirement(req).name.lower())
        except InvalidRequirement:
            pass
    reqs += [dist for dist in imported_distributions(folder) if dist.lower() not in named]
    unmet = set(unmet_requirements(reqs))
    rows = []
    for req in reqs:
        try:
            name = Requirement(req).name
        except InvalidRequirement:
            rows.append({"name": req, "requirement": req, "version": "local or unparsable"})
            continue
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "not installed"
        else:
            version = f"unmet: {version}" if req in unmet else version
        rows.append({"name": name, "requirement": req, "version": version})
    return rows


def _packages(settings: PackagesSettings) -> int:
    if settings.entrypoint is None:
        command = [sys.executable, "-m", "pip", "list", f"--format={settings.format or 'columns'}"]
        if settings.outdated:
            command.append("--outdated")
        return subprocess.call(command)
    folder = find_server_folder(settings.entrypoint)
    rows = requirement_rows(folder)
    if settings.outdated:
        rows = [row for row in rows if row["version"].startswith(("unmet", "not installed"))]
    if settings.format == "json":
        print(json.dumps([{"name": r["name"], "version": r["version"]} for r in rows]))
    elif settings.format == "freeze":
        print("\n".join(f"{r['name']}=={r['version']}" for r in rows if r["version"][0].isdigit()))
    else:
        print(f"  Package list for: {settings.entrypoint} (the project's environment: {sys.prefix})")
        if not rows:
            print(f"  {folder.name} needs nothing beyond nemo_gym and the standard library")
        width = max((len(r["requirement"]) for r in rows), default=0)
        for row in rows:
            print(f"{row['requirement']:<{width}}  {row['version']}")
    return 1 if any(r["version"] == "not installed" for r in rows) else 0


ng_pip_list = settings_command(
    _packages,
    PackagesSettings,
    "ng_pip_list",
    "List the Python packages of the environment the servers run in; with +entrypoint, a resources "
    "server's own requirements and the version installed of each.",
    examples=("ng_pip_list +entrypoint=resources_servers/math_with_judge", "ng_pip_list +format=json"),
)
