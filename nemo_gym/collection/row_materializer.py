"""Turning input rows into rollout rows: agent, prompt template, parameter overrides, repeats, seeds."""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from nemo_gym.collection.row_keys import (
    AGENT_KIND,
    AGENT_REF_KEY,
    ATTEMPT_INDEX_KEY,
    ROLLOUT_ID_KEY,
    ROLLOUT_INDEX_KEY,
    SKILLS_REF_KEY,
    TASK_INDEX_KEY,
    agent_name_of,
    task_source_of,
)
from nemo_gym.launch.config import ConfigError, deep_merge


@dataclass(frozen=True)
class PromptConfig:
    """``system`` and ``user`` templates (``str.format`` over the row's fields) for the input."""

    system: str | None
    user: str
    path: str

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PromptConfig:
        """Read a prompt YAML with a ``user`` template and an optional ``system`` template."""
        source = Path(path)
        if not source.is_file():
            raise ConfigError(f"+prompt_config: file {str(path)!r} does not exist")
        try:
            data = yaml.safe_load(source.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"+prompt_config {str(path)!r} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"+prompt_config {str(path)!r} must be a mapping with 'user' (and 'system')")
        unknown = sorted(set(data) - {"system", "user"})
        if unknown:
            raise ConfigError(f"+prompt_config {str(path)!r}: unknown keys {unknown}; allowed: system, user")
        if not isinstance(data.get("user"), str):
            raise ConfigError(f"+prompt_config {str(path)!r}: 'user' must be a template string")
        if data.get("system") is not None and not isinstance(data["system"], str):
            raise ConfigError(f"+prompt_config {str(path)!r}: 'system' must be a template string")
        for name in ("system", "user"):
            if isinstance(data.get(name), str):
                try:
                    list(string.Formatter().parse(data[name]))
                except ValueError as exc:
                    raise ConfigError(f"+prompt_config {str(path)!r}: bad '{name}' template: {exc}") from exc
        return cls(system=data.get("system"), user=data["user"], path=str(path))

    def input_items(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        """The ``input`` messages for a row; raises ``ValueError`` naming a missing field."""
        items = []
        for role, template in (("system", self.system), ("user", self.user)):
            if template is None:
                continue
            try:
                text = template.format_map(row)
            except KeyError as exc:
                raise ValueError(
                    f"prompt_config {role} template needs field {exc.args[0]!r}, which the row lacks"
                ) from exc
            except (IndexError, AttributeError, ValueError) as exc:
                raise ValueError(
                    f"prompt_config {role} template cannot be filled from the row: {exc}"
                ) from exc
            items.append({"role": role, "content": text})
        return items


# The agent_map key that routes every row without an entry of its own (what +agent_name sets).
DEFAULT_ROUTE = "_default"


@dataclass(frozen=True)
class RowMaterializer:
    """Prepares input rows: agent, prompt, ``responses_create_params`` overrides, repeats, seeds.

    The agent of a row: ``agent_map[its agent_ref.name or task_source]``, else
    ``agent_map._default`` (``agent_name`` is shorthand for it), else its own ``agent_ref.name``.
    Each ``(row's agent, mapped agent)`` pair that replaced a row's own agent is kept in
    ``overridden``, for one warning per run. ``fan_out`` (keyed by the row's own
    ``agent_ref.name``, else its ``task_source``) runs a matching row once per listed agent
    instead, each copy with its own rollout indices, ``num_repeats`` applying per agent.
    """

    agent_name: str | None = None
    agent_map: Mapping[str, str] = field(default_factory=dict)
    fan_out: Mapping[str, Sequence[str]] = field(default_factory=dict)
    num_repeats: int | Mapping[str, int] = 1
    add_seed: bool = False
    responses_create_params: Mapping[str, Any] = field(default_factory=dict)
    prompt: PromptConfig | None = None
    # The run's skills (+skills.path), stamped on every row for the agent (NeMo Gym's skills_ref).
    skills_ref: Mapping[str, Any] | None = None
    overridden: set[tuple[str, str]] = field(default_factory=set, compare=False)

    def routes(self) -> dict[str, str]:
        """``agent_map`` with ``agent_name`` folded in as its ``_default``."""
        routes = dict(self.agent_map)
        if self.agent_name is not None:
            routes.setdefault(DEFAULT_ROUTE, self.agent_name)
        return routes

    def route(self, row: Mapping[str, Any]) -> str | None:
        """The agent ``row`` goes to (see the class docstring), or None when nothing names one."""
        own = agent_name_of(row)
        routes = self.routes()
        keys = [key for key in (own, task_source_of(row)) if key is not None and key != DEFAULT_ROUTE]
        mapped = next((routes[key] for key in keys if key in routes), routes.get(DEFAULT_ROUTE))
        if mapped is None:
            return own
        if own is not None and own != mapped:
            self.overridden.add((own, mapped))
        return mapped

    def override_notice(self) -> str | None:
        """The one warning for the rows whose own agent_ref was replaced, or None when none was."""
        if not self.overridden:
            return None
        pairs = ", ".join(f"{own} -> {mapped}" for own, mapped in sorted(self.overridden))
        return (
            f"+agent_name/+agent_map re-routed rows whose agent_ref named another agent ({pairs}); "
            "since NeMo Gym 0.6.0 +agent_name routes every row, not only rows without agent_ref"
        )

    def named_agents(self) -> dict[str, str]:
        """Each agent the command line names, with the argument naming it (for error messages)."""
        named: dict[str, str] = {}
        for key, agents in sorted(self.fan_out.items()):
            for agent in agents:
                named.setdefault(agent, f"+fan_out.{key}")
        for key, agent in sorted(self.routes().items()):
            from_name = (
                key == DEFAULT_ROUTE and agent == self.agent_name and DEFAULT_ROUTE not in self.agent_map
            )
            named[agent] = "+agent_name" if from_name else f"+agent_map.{key}"
        return named

    def plan(self, row: Mapping[str, Any]) -> list[tuple[str | None, int]]:
        """``(agent, rollouts)`` for each agent ``row`` runs on: its ``fan_out`` entry's agents, else
        the one it routes to (None when nothing names one)."""
        basis = agent_name_of(row) or task_source_of(row)
        fanned = self.fan_out.get(basis) if basis is not None else None
        agents = list(fanned) if fanned else [self.route(row)]
        return [(agent, self.repeats_for(agent, basis) if agent else 0) for agent in agents]

    def repeats_for(self, agent: str, basis: str | None = None) -> int:
        """Rollouts per task for ``agent``: a map's entry for it, else for the row's own routing key
        ``basis`` (its agent_ref.name or task_source before any re-route), else ``_default``, else 1."""
        if isinstance(self.num_repeats, Mapping):
            for key in (agent, basis, DEFAULT_ROUTE):
                if key is not None and key in self.num_repeats:
                    return int(self.num_repeats[key])
            return 1
        return int(self.num_repeats)

    def prepare(self, row: Any) -> dict[str, Any]:
        """The row to repeat, or ``ValueError`` saying what is wrong with it."""
        if not isinstance(row, dict):
            raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
        agent = self.plan(row)[0][0]
        if agent is None:
            raise ValueError(
                "row has no agent_ref.name and no +agent_name (or +agent_map._default) was given"
            )
        params = row.get("responses_create_params")
        if params is None and self.prompt is None:
            raise ValueError("row has no responses_create_params (required unless +prompt_config is given)")
        if params is not None and not isinstance(params, dict):
            raise ValueError(f"responses_create_params must be an object, got {type(params).__name__}")
        prepared = dict(row)
        params = dict(params or {})
        if self.prompt is not None:
            if params.get("input") is not None:
                raise ValueError(
                    "row already has responses_create_params.input, and +prompt_config would replace it; "
                    "drop one of the two"
                )
            params["input"] = self.prompt.input_items(row)
        if self.responses_create_params:
            params = deep_merge(params, self.responses_create_params)
        prepared["responses_create_params"] = params
        ref = row.get(AGENT_REF_KEY)
        prepared[AGENT_REF_KEY] = {
            **(ref if isinstance(ref, Mapping) else {}),
            "type": AGENT_KIND,
            "name": agent,
        }
        for key in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, ATTEMPT_INDEX_KEY):
            prepared.pop(key, None)  # the collector assigns these
        if self.skills_ref is not None:
            prepared[SKILLS_REF_KEY] = dict(self.skills_ref)
        return prepared

    def expand(
        self,
        prepared: dict[str, Any],
        task_index: int,
        first_rollout: int,
        plan: list[tuple[str | None, int]] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The rollout rows of one prepared row: indices first, then the row's fields.

        ``plan`` (from :meth:`plan`, default: the prepared row's agent and its repeats) gives
        consecutive rollout indices to each agent in turn; a copy for another agent carries that
        agent's name in ``agent_ref``. A row's own ``_ng_rollout_id`` names one rollout: with
        several each gets it plus ``-r<rollout index>``, so no two rollouts share an id (and their
        captured calls).
        """
        own = prepared[AGENT_REF_KEY]["name"]
        if plan is None:
            plan = [(own, self.repeats_for(own))]
        total = sum(count for _, count in plan)
        given = prepared.get(ROLLOUT_ID_KEY)
        rollout = first_rollout
        for agent, count in plan:
            copy = prepared
            if agent is not None and agent != own:
                copy = {**prepared, AGENT_REF_KEY: {**prepared[AGENT_REF_KEY], "name": agent}}
            for _ in range(count):
                row = {TASK_INDEX_KEY: task_index, ROLLOUT_INDEX_KEY: rollout, **copy}
                if isinstance(given, str) and given and (total > 1 or first_rollout > 0):
                    row[ROLLOUT_ID_KEY] = f"{given}-r{rollout}"
                if self.add_seed:
                    row["responses_create_params"] = with_seed(row["responses_create_params"], rollout)
                yield row
                rollout += 1


def with_seed(params: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """``params`` with ``metadata.extra_body`` (a JSON string, as Responses metadata values are)
    carrying ``{"seed": seed}``, merged into an ``extra_body`` already there."""
    metadata = dict(params.get("metadata") or {})
    extra: Any = {}
    if isinstance(metadata.get("extra_body"), str):
        try:
            extra = orjson.loads(metadata["extra_body"])
        except orjson.JSONDecodeError:
            extra = {}
    if not isinstance(extra, dict):
        extra = {}
    metadata["extra_body"] = json.dumps({**extra, "seed": seed})  # NeMo Gym's spelling, byte for byte
    return {**params, "metadata": metadata}
