"""Wrap a command body ``(argv) -> exit code`` as a console script: ``--help``, config errors, exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from nemo_gym.collection.disk_errors import DISK_FULL_ERRNOS, DiskFullError
from nemo_gym.console.command_help import CommandHelp, help_text, wants_help
from nemo_gym.launch.config import ConfigError


def console_command(
    body: Callable[[list[str]], int], name: str | None = None, help: CommandHelp | None = None
) -> Callable[[Sequence[str] | None], None]:
    """Wrap ``body(argv) -> exit code`` as console script ``name``.

    ``--help``, ``-h`` or ``help`` print the command's help (``help``, usually built from the
    command's settings with :func:`~nemo_gym.console.command_help.settings_options`; else its entry
    in :mod:`nemo_gym.console.command_help`; else ``body``'s docstring) and exit 0. Config errors
    print cleanly, exit 2.
    """

    def entry(argv: Sequence[str] | None = None) -> None:
        args = list(sys.argv[1:] if argv is None else argv)
        if wants_help(args):
            prog = name or os.path.basename(sys.argv[0]) or None
            sys.stdout.write(help.render(prog) if help else help_text(name, body.__doc__, prog))
            sys.exit(0)
        try:
            code = body(args)
        except ConfigError as exc:
            sys.stderr.write(f"config error: {exc}\n")
            if name:
                sys.stderr.write(f"(run '{name} --help' for its options)\n")
            code = 2
        except KeyboardInterrupt:
            code = 130
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            # A full disk is the machine's state, not a bug: one line naming the file, no traceback.
            message = exc.strerror if isinstance(exc, DiskFullError) else str(exc)
            sys.stderr.write(f"{name or 'nemo_gym'}: {message}\n")
            code = 1
        sys.exit(code)

    entry.command_name = name  # type: ignore[attr-defined]
    entry.command_help = help  # type: ignore[attr-defined]
    return entry
