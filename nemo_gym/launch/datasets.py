"""The entries of a server's ``datasets`` list (NeMo Gym's ``DatasetConfig``): where a dataset's
JSONL file is, what it is for (``train``, ``validation``, ``benchmark``, ``example``), and where to
fetch or how to prepare it. ``ng_prepare_data`` reads them; ``nemo_gym.config_types`` exports them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class HuggingFaceSource(BaseModel):
    """Where to fetch a missing dataset: one JSONL file of a Hugging Face dataset repository.

    ``artifact_fpath`` is the file inside the repository; without it, ``<split>.jsonl`` (split
    defaults to the dataset's type) is fetched.
    """

    model_config = ConfigDict(extra="forbid")

    type: Literal["huggingface"] = "huggingface"
    repo_id: str
    artifact_fpath: str | None = None
    split: str | None = None
    revision: str | None = None


class DatasetConfig(BaseModel):
    """One entry of an agent's ``datasets`` list."""

    model_config = ConfigDict(extra="allow")

    name: str
    type: Literal["train", "validation", "benchmark", "example"]
    jsonl_fpath: str
    num_repeats: int = Field(default=1, ge=1)
    gitlab_identifier: Any = None
    # NeMo Gym's name for a Hugging Face origin ({repo_id, artifact_fpath}); same as a huggingface source.
    huggingface_identifier: dict[str, Any] | None = None
    license: str | None = None
    source: HuggingFaceSource | None = None
    prompt_config: str | None = None
    # NeMo Gym's fields for a dataset made by a script (``ng_prepare_benchmark``) and for the
    # taskset its rows are materialized into (``nemo_gym.task_materialization``).
    prepare_script: Path | None = None
    prepare_dependencies: list[str] = Field(default_factory=list)
    taskset: str | None = Field(default=None, min_length=1)

    def download_source(self) -> HuggingFaceSource | None:
        """The place to fetch this dataset from when its file is missing, if any."""
        if self.source is not None:
            return self.source
        if self.huggingface_identifier:
            return HuggingFaceSource.model_validate(self.huggingface_identifier)
        return None
