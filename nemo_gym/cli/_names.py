"""Names of a ``nemo_gym.cli`` submodule that live elsewhere, resolved when first used.

NeMo Gym 0.7.0 split its command line into ``nemo_gym.cli.env``, ``nemo_gym.cli.eval``, ... and
console scripts point there (``nemo_gym.cli.main:main``). Here the commands live beside their
subsystem (most in ``nemo_gym.tools``); each submodule maps its 0.7.0 names to them. Importing by
name, on first access, keeps ``import nemo_gym.cli.env`` cheap and the layering intact: the public
path names an application command without importing it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def resolve(target: str) -> Any:
    """The object ``module:attribute`` names."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def names_from(
    module_name: str, targets: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` serving ``targets`` (name -> ``module:attribute``)."""

    def __getattr__(name: str) -> Any:
        target = targets.get(name)
        if target is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return resolve(target)

    def __dir__() -> list[str]:
        return sorted(targets)

    return __getattr__, __dir__
