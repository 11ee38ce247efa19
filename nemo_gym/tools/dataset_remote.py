"""NeMo Gym's dataset registry commands (``gym dataset upload/download/rm/migrate``), answered here.

NeMo Gym 0.7.0 moves datasets to and from Hugging Face and its internal GitLab registry. This
project keeps datasets as files next to their configs and fetches a config's missing Hugging
Face datasets with ``ng_prepare_data +should_download=true``; it has no registry client. The
commands exist so that scripts calling them get their help and a clear answer naming what to
use instead, never "command not found".
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from nemo_gym.console.command import console_command
from nemo_gym.console.command_help import CommandHelp

INSTEAD = (
    "This project has no dataset registry client. Fetch a config's Hugging Face datasets with "
    "ng_prepare_data +mode=train_preparation +should_download=true (gym dataset collate --download); "
    "move files to or from the Hub with huggingface-cli upload / download."
)

REMOTE_COMMANDS = {
    "ng_upload_dataset_to_hf": "Upload a prepared JSONL dataset to Hugging Face (gym dataset upload).",
    "ng_download_dataset_from_hf": "Download a dataset from Hugging Face (gym dataset download).",
    "ng_upload_dataset_to_gitlab": "Upload a dataset to NeMo Gym's GitLab registry (gym dataset upload --storage gitlab).",
    "ng_download_dataset_from_gitlab": "Download a dataset from NeMo Gym's GitLab registry.",
    "ng_delete_dataset_from_gitlab": "Delete a dataset from NeMo Gym's GitLab registry (gym dataset rm).",
    "ng_gitlab_to_hf_dataset": "Move a dataset from GitLab to Hugging Face (gym dataset migrate).",
}


def remote_command(name: str) -> Callable[[Sequence[str] | None], None]:
    """Console script ``name``: its help, and exit code 2 with what to use instead."""
    summary = REMOTE_COMMANDS[name]

    def body(argv: list[str]) -> int:
        sys.stderr.write(f"{name}: not available here. {INSTEAD}\n")
        return 2

    example = f"{name} +input_jsonl_fpath=data/train.jsonl +dataset_name=my_dataset"
    help = CommandHelp(name, summary, details=INSTEAD, examples=(example,), config_options=False)
    return console_command(body, name, help)


ng_upload_dataset_to_hf = remote_command("ng_upload_dataset_to_hf")
ng_download_dataset_from_hf = remote_command("ng_download_dataset_from_hf")
ng_upload_dataset_to_gitlab = remote_command("ng_upload_dataset_to_gitlab")
ng_download_dataset_from_gitlab = remote_command("ng_download_dataset_from_gitlab")
ng_delete_dataset_from_gitlab = remote_command("ng_delete_dataset_from_gitlab")
ng_gitlab_to_hf_dataset = remote_command("ng_gitlab_to_hf_dataset")
