"""A command whose arguments are one settings model: ``+field=value`` in, help generated from it.

:func:`settings_command` turns ``run(settings) -> exit code`` and a pydantic model into a console
script: the command line is parsed as overrides (``+key=value``; no config files, no ``env.yaml``),
validated into the model (an error names each ``+field`` and what is wrong with it), and
``--help`` lists the model's described fields with their defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from nemo_gym.console.command import console_command
from nemo_gym.console.command_help import CommandHelp, settings_options
from nemo_gym.launch.config import ConfigError, load_config

Settings = TypeVar("Settings", bound=BaseModel)


def parse_settings(model: type[Settings], argv: Sequence[str], *, compose: bool = False) -> Settings:
    """``argv``'s overrides validated into ``model``; keys that are not fields are ignored.

    ``compose=True`` reads the config the way ``ng_run`` does (``+config_paths``, ``env.yaml``),
    for commands that look at a stack's config; server refs are not checked.
    """
    config = load_config(list(argv), read_env_yaml=compose, validate_refs=False)
    try:
        return model.model_validate(config)
    except ValidationError as exc:
        raise ConfigError("; ".join(describe_error(err) for err in exc.errors()[:5])) from None


def describe_error(err: Any) -> str:
    """One pydantic error as ``+field: what is wrong``."""
    where = ".".join(str(part) for part in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "missing":
        message = "required (give it as +" + where + "=...)"
    return f"+{where}: {message}" if where else message


def settings_command(
    run: Callable[[Settings], int],
    model: type[Settings],
    name: str,
    summary: str,
    examples: tuple[str, ...] = (),
    details: str = "",
    compose: bool = False,
) -> Callable[[Sequence[str] | None], None]:
    """Console script ``name``: ``run`` on the settings parsed from the command line."""

    def body(argv: list[str]) -> int:
        return run(parse_settings(model, argv, compose=compose))

    body.__doc__ = summary
    help = CommandHelp(
        name,
        summary,
        options=settings_options(model),
        examples=examples,
        details=details,
        config_options=compose,
    )
    return console_command(body, name, help)
