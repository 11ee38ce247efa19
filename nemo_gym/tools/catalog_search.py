"""``gym search`` and ``gym list resources-servers [NAME]``: find bundled components by text.

A component is a folder of ``resources_servers/``, ``responses_api_agents/``,
``responses_api_models/`` or ``benchmarks/``, described by its config's ``description`` (or its
README's first sentence) and its ``domain``. A query matches a component whose name, domain or
description contains it (case-insensitive), or whose name is close to it (a typo). ``NAME``
shows one component in full; ``+json=true`` prints machine-readable JSON, as NeMo Gym does.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.console.settings_command import settings_command
from nemo_gym.launch.config import ConfigError, project_root
from nemo_gym.tools.gym_cli import component_summary

KIND_FOLDERS = {
    "environments": "resources_servers",
    "resources-servers": "resources_servers",
    "agents": "responses_api_agents",
    "models": "responses_api_models",
    "benchmarks": "benchmarks",
}


@dataclass(frozen=True)
class Component:
    """One bundled component as listed."""

    name: str
    domain: str
    description: str
    path: str


def config_domain(folder: Path) -> str:
    """The ``domain`` field of the folder's own config (``configs/NAME.yaml`` or ``config.yaml``)."""
    for path in (folder / "configs" / f"{folder.name}.yaml", folder / "config.yaml"):
        if not path.is_file():
            continue
        try:
            text = path.read_text()
            data = yaml.safe_load(text)
        except (yaml.YAMLError, OSError):
            continue
        stack = [data]
        while stack:
            value = stack.pop()
            if isinstance(value, dict):
                if isinstance(value.get("domain"), str):
                    return str(value["domain"])
                stack.extend(value.values())
            elif isinstance(value, list):
                stack.extend(value)
    return ""


def components(kind: str) -> list[Component]:
    """The bundled components of ``kind`` (a key of :data:`KIND_FOLDERS`), by name."""
    base = project_root() / KIND_FOLDERS[kind]
    folders = sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    return [
        Component(p.name, config_domain(p), component_summary(p), str(p.relative_to(project_root())))
        for p in folders
    ]


def matches(query: str, component: Component) -> bool:
    """Whether ``query`` names ``component``: a substring of its name, domain or description, or
    close to its name."""
    needle = query.lower()
    text = " ".join((component.name, component.domain, component.description)).lower()
    if needle in text or needle.replace(" ", "_") in component.name.lower():
        return True
    return bool(difflib.get_close_matches(needle, [component.name.lower()], n=1, cutoff=0.75))


class CatalogSettings(BaseModel):
    """The arguments of ``gym search`` and ``gym list resources-servers``."""

    model_config = ConfigDict(extra="ignore")

    query: str | None = Field(
        default=None, description="Text to look for in names, domains and descriptions."
    )
    component_type: Literal["environments", "resources-servers", "agents", "models", "benchmarks"] = Field(
        default="environments",
        description="What to search: environments, resources-servers, agents, models, benchmarks.",
    )
    component_name: str | None = Field(default=None, description="Show this one component in full.")
    available: bool = Field(
        default=False,
        description="List what the nemo-gym wheel offers instead (NAME is then a version, e.g. 0.6.0).",
    )
    json_output: bool = Field(
        default=False,
        alias="json",
        description="Print JSON instead of a table.",
        json_schema_extra={"help_key": "json"},
    )


def _print_table(found: list[Component], title: str) -> None:
    print(title)
    width = max((len(c.name) for c in found), default=0)
    domain_width = max((len(c.domain) for c in found), default=0)
    for component in found:
        description = component.description
        description = description[:77] + "..." if len(description) > 80 else description
        print(f"  {component.name:<{width}}  {component.domain:<{domain_width}}  {description}".rstrip())


def run_catalog(settings: CatalogSettings) -> int:
    """List, search or inspect; exit code 1 when nothing matched or the name is unknown."""
    kind = settings.component_type
    found = components(kind)
    noun = kind.rstrip("s").replace("-", " ")
    if settings.component_name:
        by_name = {c.name: c for c in found}
        component = by_name.get(settings.component_name)
        if component is None:
            close = difflib.get_close_matches(settings.component_name, list(by_name), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"no {noun} named {settings.component_name!r}{hint}")
        if settings.json_output:
            print(json.dumps(asdict(component)))
        else:
            for key, value in asdict(component).items():
                print(f"{key + ':':<13}{value}")
            if KIND_FOLDERS[kind] == "resources_servers":
                print(
                    f"{'usage:':<13}gym env start --resources-server {component.name} --model-type scripted_model"
                )
        return 0
    if settings.query is not None:
        found = [c for c in found if matches(settings.query, c)]
    if settings.json_output:
        print(json.dumps([{"name": c.name, "domain": c.domain, "description": c.description} for c in found]))
        return 0 if found or settings.query is None else 1
    if not found:
        print(f"no {kind} match {settings.query!r}" if settings.query else f"no {kind} found")
        return 1
    title = (
        f"{kind.capitalize()} matching {settings.query!r} ({len(found)})"
        if settings.query
        else f"{kind.capitalize()} ({len(found)})"
    )
    _print_table(found, title)
    return 0


def _search(settings: CatalogSettings) -> int:
    if not settings.query:
        raise ConfigError("+query: required (gym search [TYPE] QUERY)")
    return run_catalog(settings)


def _list_resources_servers(settings: CatalogSettings) -> int:
    if settings.available:
        from nemo_gym.tools.gym_cli import list_available

        return list_available(
            "resources_servers", [settings.component_name] if settings.component_name else []
        )
    return run_catalog(settings.model_copy(update={"component_type": "resources-servers"}))


ng_search = settings_command(
    _search,
    CatalogSettings,
    "ng_search",
    "Search bundled components (environments unless +component_type says otherwise) by name, domain "
    "and description; a close misspelling of a name matches too.",
    examples=("ng_search +query=math", "gym search agents codex"),
)
ng_list_resources_servers = settings_command(
    _list_resources_servers,
    CatalogSettings,
    "ng_list_resources_servers",
    "List the bundled resources servers with their domain and description, or show one "
    "(+component_name=NAME; gym list resources-servers NAME).",
    examples=("ng_list_resources_servers +component_name=mcqa", "gym list resources-servers mcqa --json"),
)
