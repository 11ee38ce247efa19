"""Fetching a dataset named by its Hugging Face source (``ng_prepare_data +should_download=true``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from nemo_gym.launch.datasets import HuggingFaceSource


class DownloadError(RuntimeError):
    """A dataset could not be fetched; the message says from where and why."""


def download_from_huggingface(
    source: HuggingFaceSource, split: str, destination: Path, token: str | None = None
) -> Path:
    """Fetch one JSONL file of a Hugging Face dataset repo into ``destination``.

    Uses the local Hugging Face cache (``HF_HUB_CACHE``); with ``HF_HUB_OFFLINE=1`` only the
    cache is consulted.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    filename = source.artifact_fpath or f"{source.split or split}.jsonl"
    where = f"{source.repo_id}/{filename}" + (f"@{source.revision}" if source.revision else "")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        cached = hf_hub_download(
            repo_id=source.repo_id,
            filename=filename,
            repo_type="dataset",
            revision=source.revision,
            token=token,
            local_files_only=offline,
        )
    except LocalEntryNotFoundError as exc:
        raise DownloadError(
            f"cannot download {source.repo_id} (offline?): {filename} is not in the local Hugging Face cache "
            f"and the hub could not be reached ({type(exc).__name__})"
        ) from exc
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise DownloadError(f"cannot download {where}: no such dataset repo or no access to it") from exc
    except (EntryNotFoundError, RevisionNotFoundError) as exc:
        raise DownloadError(f"cannot download {where}: the repo has no such file or revision") from exc
    except OSError as exc:  # connection failures surface as OSError subclasses
        raise DownloadError(f"cannot download {source.repo_id} (offline?): {exc}") from exc
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, destination)
    return destination
