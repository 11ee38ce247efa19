"""Compatibility: NeMo Gym's prompt templates (``nemo_gym.prompt``): a YAML file with a ``user`` template and an
optional ``system`` one, filled from a data row's top-level fields with ``str.format`` syntax.

The collector's ``+prompt_config`` reads the same files (:class:`nemo_gym.collection.collection_io.PromptConfig`);
this module is the shape environments import. A row that already has
``responses_create_params.input`` cannot also take a prompt template.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import yaml
from pydantic import BaseModel

from nemo_gym import _resolve_under_cwd_or_install

__all__ = [
    "PromptConfig",
    "apply_prompt_to_row",
    "fill_prompt",
    "load_prompt_config",
    "validate_prompt_compatibility",
]


class PromptConfig(BaseModel):
    """A prompt file: ``user`` (required) and ``system`` (optional) templates."""

    user: str
    system: str | None = None


@lru_cache(maxsize=64)
def load_prompt_config(path: str) -> PromptConfig:
    """Read and validate a prompt YAML (a relative path is looked up in the working directory,
    then the project root). Cached per path."""
    with open(_resolve_under_cwd_or_install(path)) as f:
        return PromptConfig.model_validate(yaml.safe_load(f))


def fill_prompt(prompt_config: PromptConfig, row: dict[str, Any]) -> list[dict[str, str]]:
    """The ``input`` messages for ``row``: the system message (if any), then the user message.

    Raises ``KeyError`` naming the missing field and the fields the row has. Literal braces in a
    template are written ``{{`` and ``}}``.
    """
    messages = []
    for role, template in (("system", prompt_config.system), ("user", prompt_config.user)):
        if template is None:
            continue
        try:
            messages.append({"role": role, "content": template.format_map(row)})
        except KeyError as exc:
            raise KeyError(
                f"prompt template needs field {exc.args[0]!r}; the row has only {sorted(row)}"
            ) from None
    return messages


def validate_prompt_compatibility(rows: list[dict[str, Any]], prompt_config: PromptConfig) -> None:
    """Raise ``ValueError`` listing every row (by index) that already has ``responses_create_params.input``."""
    clashing = [i for i, row in enumerate(rows) if (row.get("responses_create_params") or {}).get("input")]
    if clashing:
        raise ValueError(
            "rows with responses_create_params.input cannot also take a prompt_config "
            f"(use one or the other); rows: {clashing}"
        )


def apply_prompt_to_row(row: dict[str, Any], prompt_config: PromptConfig) -> dict[str, Any]:
    """A copy of ``row`` whose ``responses_create_params.input`` is the filled prompt; the other
    ``responses_create_params`` fields (tools, temperature, ...) are kept."""
    params = row.get("responses_create_params")
    params = dict(params) if isinstance(params, dict) else {}
    params["input"] = fill_prompt(prompt_config, row)
    return {**row, "responses_create_params": params}
