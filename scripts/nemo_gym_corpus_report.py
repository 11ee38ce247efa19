"""Turn a ``scripts/nemo_gym_corpus.py --json`` result into the table of docs/NEMO_GYM_ENVIRONMENTS.md.

Every folder gets a row; every folder that does not pass gets a reason, in one of these classes
(first match wins):

- ``needs GPU`` / ``needs network`` / ``needs private data``: the corpus script's static rule
  found it (``needs``), or the failure itself shows it (a refused connection to a remote host,
  a ``git clone``, a dataset download, CUDA);
- ``requirement not installable here``: pip could not install what its requirements.txt lists
  (a git URL, a package with no wheel for this Python, a GPU stack);
- ``unlisted dependency``: it imports a third-party module its requirements (``requirements.txt``,
  else ``pyproject.toml``) do not name;
- ``needs NeMo Gym's repository``: a test reads a file of NeMo Gym's git repository that the wheel
  does not ship (its ``fern/`` or ``docs/`` pages);
- ``gap``: it needs a ``nemo_gym`` name or behaviour this package lacks (the error names it);
- ``own test failure``: it imports and runs, and some of its tests fail for another reason
  (the first failure is shown);
- ``timed out``.

Usage: ``python scripts/nemo_gym_corpus_report.py corpus.json > table.md``
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

NETWORK_SIGNS = re.compile(
    r"127\.0\.0\.1:9\b|ProxyError|Name or service not known|Temporary failure in name resolution|"
    r"git clone|'git', 'clone'|connected to the Internet|LookupError|nltk|ConnectError|HF_HUB_OFFLINE|offline mode|LocalEntryNotFoundError|Network is unreachable|"
    r"ConnectionRefusedError|api key|API_KEY",
    re.I,
)
# A relative path under NeMo Gym's documentation trees: in its git repository, never in the wheel.
# (given relative, or under the tree root the folders were copied to).
REPOSITORY_FILE = re.compile(
    r"No such file or directory: '(?:/(?:(?!resources_servers/|responses_api_)[^'])*?/)?((?:fern|docs)/[^']+)'"
)
GPU_SIGNS = re.compile(r"CUDA|cuda|vllm|No module named 'torch'|nvidia", re.I)


def classify(folder: dict[str, Any]) -> tuple[str, str]:
    """``(class, reason)`` for a folder that does not pass (see the module docstring)."""
    error = folder["import_error"] if not folder["imports"] else folder["first_failure"]
    error = error or folder.get("import_error") or ""
    needs = folder.get("needs") or {}
    install = folder.get("install") or ""
    missing = re.search(r"No module named '([^']+)'", error)
    if "gpu" in needs or GPU_SIGNS.search(error):
        return "needs GPU", needs.get("gpu") or error
    if folder.get("pytest_exit") is None and not error.startswith("test"):
        return "timed out", error
    if "network" in needs and (NETWORK_SIGNS.search(error) or missing):
        return "needs network", needs["network"]
    if NETWORK_SIGNS.search(error):
        return "needs network", error
    if "private_data" in needs and ("No such file" in error or "FileNotFound" in error):
        return "needs private data", needs["private_data"]
    if install.startswith(("pip install failed", "skipped: GPU")):
        return "requirement not installable here", install
    if missing and not missing.group(1).startswith(("nemo_gym", "resources_servers", "responses_api")):
        module = missing.group(1).split(".")[0]
        listed = any(
            module.replace("_", "-").lower() in r.lower() for r in folder.get("requirements_missing", [])
        )
        if listed:
            return "requirement not installable here", f"{module} ({install})"
        return "unlisted dependency", f"imports {module}, which its requirements do not list"
    if repository_file := REPOSITORY_FILE.search(error):
        return (
            "needs NeMo Gym's repository",
            f"reads {repository_file.group(1)}, which the wheel does not ship",
        )
    if "nemo_gym" in error or "cannot import name" in error:
        return "gap", error
    if "nemo_gym" in error or not folder["imports"]:
        return "gap", error
    return "own test failure", error


def render(data: dict[str, Any]) -> str:
    """The markdown table and the per-class counts."""
    rows = ["| folder | imports | passed | failed | result |", "|---|---|---|---|---|"]
    counts: dict[str, int] = {}
    for folder in data["folders"]:
        if folder["passes"]:
            result = "passes"
        else:
            kind, reason = classify(folder)
            counts[kind] = counts.get(kind, 0) + 1
            # Paths of the machine that ran it (scratch tree, venvs) say nothing to a reader.
            reason = re.sub(
                r"/[^\s'\"(|]*?/(resources_servers|responses_api_\w+|nemo_gym|bin/python)\b", r"\1", reason
            )
            reason = reason.replace("|", "\\|").replace("\n", " ")[:160]
            result = f"**{kind}**: {reason}"
        rows.append(
            f"| {folder['folder']} | {'yes' if folder['imports'] else 'no'} | {folder['tests_passed']} | "
            f"{folder['tests_failed']} | {result} |"
        )
    summary = [f"`{data['summary']}`", ""] + [f"- {kind}: {n}" for kind, n in sorted(counts.items())]
    return "\n".join(summary + ["", *rows]) + "\n"


def main(argv: list[str]) -> int:
    """Print the table for the JSON file named in ``argv``."""
    if len(argv) != 1:
        sys.stderr.write(__doc__.rsplit("Usage: ", 1)[-1])
        return 2
    sys.stdout.write(render(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
