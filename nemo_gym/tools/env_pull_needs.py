"""What a NeMo Gym folder needs beyond this machine, read from its files: a GPU, the network,
private data, or a data-preparation step that must run before its server starts.

One rule for ``gym list environments --available``, ``gym env pull`` and
``scripts/nemo_gym_corpus.py``. It is static (regular expressions over the folder's files):
nothing is imported or run.
"""

from __future__ import annotations

import re
from pathlib import Path

# The classification rule. A folder "needs" something when any file in it (code, config,
# requirements) matches one of these patterns; the matching pattern is reported as the reason.
NEEDS_RULES: dict[str, list[tuple[str, str]]] = {
    "gpu": [
        (r"^\s*(import|from)\s+vllm\b", "imports vllm"),
        (r"torch\.cuda|\.cuda\(\)|device\s*=\s*[\"']cuda", "uses CUDA"),
        (r"^\s*(vllm|flashinfer-python|flash-attn|torch)\b", "requires a GPU stack"),
        (r"num_gpus|CUDA_VISIBLE_DEVICES", "asks for GPUs"),
    ],
    "network": [
        (
            r"[A-Z_]*(API_KEY|_TOKEN|SECRET)[A-Z_]*[\"']?\s*\]|getenv\([\"'][A-Z_]*(API_KEY|TOKEN)",
            "reads an API key",
        ),
        (r"(load_dataset|hf_hub_download|snapshot_download)\(", "downloads a dataset or model"),
        (r"tiktoken\.(get_encoding|encoding_for_model)\(", "downloads a tokenizer (tiktoken)"),
        (
            r"https?://(?!(127\.0\.0\.1|localhost|0\.0\.0\.0|example\.com))[a-z0-9.-]+\.[a-z]{2,}/[^\s\"']*(api|v1|search)",
            "calls a remote API",
        ),
        (r"^\s*(import|from)\s+(docker|e2b|daytona|opensandbox|modal)\b", "needs a container service"),
        (r"git\+https://|git clone", "clones a repository"),
    ],
    "private_data": [
        (
            r"gitlab_identifier|/lustre/|/mnt/|nvidia\.com/[^\s\"']*(dataset|data)",
            "reads an internal dataset",
        ),
        (r"\.(parquet|sqlite|db)[\"']", "reads a data file not shipped in the wheel"),
    ],
}
# A folder without requirements.txt declares its dependencies in pyproject.toml; of that file
# only a dependency taken from a git repository (a uv source) says something here.
PYPROJECT_RULES: dict[str, list[tuple[str, str]]] = {
    "network": [(r"git\+https://|^\s*[\w.-]+\s*=\s*\{\s*git\s*=", "clones a repository")],
}
# Only what runs when the server starts or its tests run is scanned: its Python modules, tests
# and requirements. Data-preparation scripts, configs (dataset lists for training) and data
# files are not: a folder whose training data lives elsewhere can still pass its own tests.
SCANNED_SUFFIXES = {".py", ".txt", ".toml"}
UNSCANNED_DIRS = {"data", "configs", "scripts", ".venv", "__pycache__"}
UNSCANNED_FILES = re.compile(
    r"^(prepare|create|generate|download|build|convert|make)[a-z0-9_]*\.py$|_prep[a-z_]*\.py$"
)


def classify_folder(folder: Path) -> dict[str, str]:
    """What a folder needs beyond this machine: ``{"gpu"|"network"|"private_data": reason}``.

    The rule: scan the folder's code, configs and requirements (its tests included) for the
    patterns in ``NEEDS_RULES``; the first match per category is the reason given.
    """
    needs: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.suffix not in SCANNED_SUFFIXES or not path.is_file() or UNSCANNED_DIRS & set(rel.parts[:-1]):
            continue
        if UNSCANNED_FILES.search(path.name) or (
            path.suffix in (".txt", ".toml") and path.name not in ("requirements.txt", "pyproject.toml")
        ):
            continue
        if path.stat().st_size > 2_000_000:
            continue
        text = path.read_text(errors="replace")
        for category, rules in (PYPROJECT_RULES if path.name == "pyproject.toml" else NEEDS_RULES).items():
            if category in needs:
                continue
            for pattern, reason in rules:
                if re.search(pattern, text, re.M):
                    needs[category] = f"{reason} ({rel})"
                    break
    return needs


# A data file named by the server's code: a string literal ending in one of these suffixes.
_DATA_LITERAL = re.compile(
    r"[\"']([\w./-]*?([\w.-]+\.(?:txt|jsonl?|csv|tsv|parquet|pkl|pickle|npy|npz|db|sqlite)))[\"']"
)
_NOT_DATA = {"requirements.txt", "example.jsonl", "example_rollouts.jsonl", "example_metrics.json"}


def _runtime_files(folder: Path) -> list[Path]:
    """The Python files that run when the server starts: not its tests nor its data scripts."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder)
        if UNSCANNED_DIRS & set(rel.parts[:-1]) or "tests" in rel.parts[:-1] or rel.name.startswith("test_"):
            continue
        if not UNSCANNED_FILES.search(path.name):
            out.append(path)
    return out


def _data_scripts(folder: Path) -> list[Path]:
    """The folder's data-preparation scripts (``generate_data.py``, ``prepare*.py``, ``scripts/*.py``)."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).parts[:-1]
        if "tests" not in parts and (UNSCANNED_FILES.search(path.name) or "scripts" in parts):
            out.append(path)
    return out


def data_step(folder: Path, display_root: Path | None = None) -> str | None:
    """The data-preparation step a folder's server needs before it starts, or None.

    The rule: a data file the server's own code names (a string literal such as ``"guesses.txt"``)
    that is not in the folder, and that one of the folder's data scripts names too, is written
    by that script; the step is running it (from the project root, as NeMo Gym's READMEs say).
    """
    shipped = {p.name for p in folder.rglob("*") if p.is_file()}
    missing: list[str] = []
    for path in _runtime_files(folder):
        for literal, base in _DATA_LITERAL.findall(path.read_text(errors="replace")):
            if base not in shipped and base not in _NOT_DATA and "{" not in literal and base not in missing:
                missing.append(base)
    if not missing:
        return None
    root = display_root or folder.parent.parent
    for script in _data_scripts(folder):
        text = script.read_text(errors="replace")
        written = [base for base in missing if base in text]
        if written:
            where = script.relative_to(root) if script.is_relative_to(root) else script
            return f"python {where} (it writes {', '.join(written)}: the server's code names it, the folder does not ship it)"
    return None


def folder_needs(folder: Path, display_root: Path | None = None) -> dict[str, str]:
    """:func:`classify_folder` plus ``"data_step"`` when :func:`data_step` finds one."""
    needs = classify_folder(folder)
    step = data_step(folder, display_root)
    if step:
        needs["data_step"] = step
    return needs


def needs_label(needs: dict[str, str]) -> str:
    """A short mark for a listing: ``runs here``, or what it needs (``needs GPU, data step``)."""
    if not needs:
        return "runs here"
    words = {"gpu": "GPU", "network": "network", "private_data": "private data", "data_step": "data step"}
    return "needs " + ", ".join(
        words.get(k, k) for k in ("gpu", "network", "private_data", "data_step") if k in needs
    )
