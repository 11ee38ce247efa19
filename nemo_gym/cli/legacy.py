"""NeMo Gym 0.7.0's legacy command names (``nemo_gym.cli.legacy:main``): ``ng_X`` and ``nemo_gym_X``
run the ``gym`` command they stand for, picked by the name the script was started as.

:data:`LEGACY` maps each name (prefix dropped) to its ``gym`` words; the user's arguments follow
them unchanged, so ``ng_validate +config_paths=[...]`` is ``gym env validate +config_paths=[...]``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from nemo_gym.cli._names import resolve
from nemo_gym.console.command import console_command
from nemo_gym.console.command_help import CommandHelp

LEGACY: dict[str, list[str]] = {
    "run": ["env", "start"],
    "test": ["env", "test"],
    "test_all": ["env", "test"],
    "dev_test": ["dev", "test"],
    "init_resources_server": ["env", "init"],
    "list_benchmarks": ["list", "benchmarks"],
    "prepare_benchmark": ["eval", "prepare"],
    "collect_rollouts": ["eval", "run", "--no-serve"],
    "e2e_collect_rollouts": ["eval", "run"],
    "aggregate_rollouts": ["eval", "aggregate"],
    "materialize_prompts": ["dataset", "render"],
    "reward_profile": ["eval", "profile"],
    "upload_dataset_to_gitlab": ["dataset", "upload"],
    "download_dataset_from_gitlab": ["dataset", "download"],
    "prepare_data": ["dataset", "collate"],
    "upload_dataset_to_hf": ["dataset", "upload"],
    "download_dataset_from_hf": ["dataset", "download"],
    "gitlab_to_hf_dataset": ["dataset", "migrate"],
    "delete_dataset_from_gitlab": ["dataset", "rm"],
    "dump_config": ["env", "resolve"],
    "validate": ["env", "validate"],
    "help": ["--help"],
    "status": ["env", "status"],
    "pip_list": ["env", "packages"],
    "version": ["--version"],
}
REINSTALL_ADVICE = (
    "nemo_gym installs once for every server (pip install -e '.[dev]' in the project); "
    "there are no per-server environments to reinstall"
)


def _help(argv: list[str]) -> int:
    resolve("nemo_gym.tools.gym_cli:main")(["--help"])
    return 0


def _reinstall(argv: list[str]) -> int:
    print(f"ng_reinstall: {REINSTALL_ADVICE}")
    return 0


def _test_all(argv: list[str]) -> int:
    resolve("nemo_gym.tools.authoring:ng_test")(
        [arg for arg in argv if not arg.startswith(("+entrypoint=", "entrypoint="))]
    )
    return 0


ng_help = console_command(
    _help,
    "ng_help",
    CommandHelp(
        "ng_help",
        "List the gym command groups and their commands (gym --help).",
        examples=("ng_help",),
        config_options=False,
    ),
)
ng_reinstall = console_command(
    _reinstall,
    "ng_reinstall",
    CommandHelp(
        "ng_reinstall",
        f"NeMo Gym's per-server reinstall; here {REINSTALL_ADVICE}.",
        examples=("ng_reinstall",),
        config_options=False,
    ),
)
ng_test_all = console_command(
    _test_all,
    "ng_test_all",
    CommandHelp(
        "ng_test_all",
        "Check every bundled environment (ng_test without +entrypoint) and print a table.",
        examples=("ng_test_all +timeout_s=300",),
        config_options=False,
    ),
)


def legacy_key(script: str) -> str:
    """``ng_run`` / ``nemo_gym_run`` -> ``run``."""
    return os.path.basename(script).removeprefix("nemo_gym_").removeprefix("ng_")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``gym`` command the script's own name stands for."""
    args = list(sys.argv[1:] if argv is None else argv)
    alias = os.path.basename(sys.argv[0])
    key = legacy_key(alias)
    if key == "reinstall":
        ng_reinstall(args)
    words = LEGACY.get(key)
    if words is None:
        sys.stderr.write(f"{alias}: no gym command of that name; gym --help lists them\n")
        sys.exit(2)
    resolve("nemo_gym.tools.gym_cli:main")([*words, *args])
