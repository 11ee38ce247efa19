"""NeMo Gym 0.7.0's ``gym`` entry point (``nemo_gym.cli.main:main``), over :mod:`nemo_gym.tools.gym_cli`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from nemo_gym.cli._names import resolve

GYM_MAIN = "nemo_gym.tools.gym_cli:main"


def main(argv: Sequence[str] | None = None) -> None:
    """The ``gym`` / ``ng`` console script: ``gym <group> <command> ...`` (``gym --help``)."""
    resolve(GYM_MAIN)(argv)


def dispatch(target: str, overrides: list[str]) -> None:
    """Run the command ``module:function`` with ``overrides`` as its command line, as NeMo Gym's
    router does (the function reads ``sys.argv``)."""
    sys.argv = [sys.argv[0], *overrides]
    resolve(target)()
