"""``gym dataset render`` (``ng_materialize_prompts``): apply a prompt template to raw rows.

Each row of ``+input_jsonl_fpath`` (no ``responses_create_params.input`` of its own) gets the
prompt file's ``system``/``user`` templates filled from its fields as
``responses_create_params.input``, and ``prompt_config_used`` naming the prompt file, as NeMo
Gym 0.7.0 writes it. A row that already has an input, or lacks a field the template names,
stops the command with the file and line; nothing is written then.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym import _resolve_under_cwd_or_install
from nemo_gym.collection.collection_io import iter_jsonl
from nemo_gym.console.settings_command import settings_command
from nemo_gym.launch.config import ConfigError
from nemo_gym.prompt import PromptConfig, apply_prompt_to_row

PROMPT_USED_KEY = "prompt_config_used"


class RenderSettings(BaseModel):
    """The arguments of ``gym dataset render`` (NeMo Gym's ``MaterializePromptsConfig``)."""

    model_config = ConfigDict(extra="ignore")

    input_jsonl_fpath: str = Field(description="Raw JSONL rows (without responses_create_params.input).")
    prompt_config: str = Field(description="Prompt YAML file to apply (user and optional system template).")
    output_jsonl_fpath: str = Field(description="Where to write the rows with their prompts filled in.")


def load_prompt_file(path: str) -> tuple[Path, PromptConfig]:
    """The resolved prompt file and its templates; a missing or malformed file is a ConfigError."""
    resolved = Path(_resolve_under_cwd_or_install(path))
    if not resolved.is_file():
        raise ConfigError(
            f"+prompt_config: no prompt file {path} (looked in the working directory and project)"
        )
    try:
        return resolved, PromptConfig.model_validate(yaml.safe_load(resolved.read_text()))
    except (yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(f"{resolved}: not a prompt file (needs a 'user' template string): {exc}") from None


def render_rows(settings: RenderSettings) -> int:
    """Write the rendered rows; the number written."""
    prompt_path, prompt = load_prompt_file(settings.prompt_config)
    source = Path(settings.input_jsonl_fpath)
    if not source.is_file():
        raise ConfigError(f"+input_jsonl_fpath: no such file {source}")
    rendered: list[bytes] = []
    for line, row in iter_jsonl(source):
        params = row.get("responses_create_params")
        if isinstance(params, dict) and params.get("input"):
            raise ConfigError(
                f"{source}:{line}: the row already has responses_create_params.input; "
                "a prompt config renders raw rows only (drop one or the other)"
            )
        try:
            out = apply_prompt_to_row(row, prompt)
        except KeyError as exc:
            raise ConfigError(f"{source}:{line}: {exc.args[0]} ({prompt_path})") from None
        out[PROMPT_USED_KEY] = str(prompt_path)
        rendered.append(orjson.dumps(out))
    target = Path(settings.output_jsonl_fpath)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"".join(line + b"\n" for line in rendered))
    return len(rendered)


def _render(settings: RenderSettings) -> int:
    count = render_rows(settings)
    print(f"rendered {count} rows with {settings.prompt_config} -> {settings.output_jsonl_fpath}")
    return 0


ng_materialize_prompts = settings_command(
    _render,
    RenderSettings,
    "ng_materialize_prompts",
    "Apply a prompt template to raw JSONL rows: each row's responses_create_params.input becomes the "
    "filled system/user messages (a dataset preview; ng_collect_rollouts +prompt_config does the same "
    "on the fly).",
    examples=(
        "ng_materialize_prompts +input_jsonl_fpath=benchmarks/math_arithmetic/data/math_arithmetic.jsonl "
        "+prompt_config=benchmarks/math_arithmetic/prompt.yaml +output_jsonl_fpath=results/rendered.jsonl",
    ),
)
