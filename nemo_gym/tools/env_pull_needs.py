"""What a NeMo Gym folder needs beyond this machine, read from its files: a GPU, the network,
private data, or a data-preparation step that must run before its server starts.

One rule for ``gym list environments --available``, ``gym env pull`` and
``scripts/nemo_gym_corpus.py``. It is static (regular expressions over the folder's files, its
example rows and the config that runs them): nothing is imported or run. Each reason names the
file and line that triggered it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nemo_gym.tools.env_example_run import AGENTS, RESOURCES, example_run, started_servers
from nemo_gym.tools.env_pull_wheel import module_source

# The classification rule. A folder "needs" something when any file in it (code, tests,
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
            r"[A-Z_]*(API_KEY|_TOKEN|SECRET)[A-Z_]*[\"']?\s*\]|getenv\([\"'][A-Z_]*(API_KEY|TOKEN)[\"']",
            "reads an API key",
        ),
        (r"(load_dataset|hf_hub_download|snapshot_download)\(", "downloads a dataset or model"),
        (r"tiktoken\.(get_encoding|encoding_for_model)\(", "downloads a tokenizer (tiktoken)"),
        (r"\bnltk\.download\(|\bspacy\.cli\.download\(", "downloads NLTK or spaCy data"),
        (r"^\s*from\s+evalplus\.data\s+import\s+get_", "loads EvalPlus's dataset (evalplus downloads it)"),
        (
            r"https?://(?!(127\.0\.0\.1|localhost|0\.0\.0\.0|example\.com|[a-z0-9.-]+\.(invalid|test|example)/))[a-z0-9.-]+\.[a-z]{2,}/[^\s\"']*(api|v1|search)",
            "calls a remote API",
        ),
        (
            r"https?://(raw\.githubusercontent\.com|github\.com/[^\s\"']+/(releases/download|archive|raw)/)",
            "downloads a file from GitHub",
        ),
        (r"^\s*(import|from)\s+(docker|e2b|daytona|opensandbox|modal)\b", "needs a container service"),
        (r"git\+https://|git clone|[\"']git[\"']\s*,\s*[\"']clone[\"']", "clones a repository"),
    ],
    "private_data": [
        (
            r"gitlab_identifier|/lustre/|/mnt/|nvidia\.com/[^\s\"']*(dataset|data)",
            "reads an internal dataset",
        ),
        (r"\.(parquet|sqlite|db)[\"']", "reads a data file not shipped in the wheel"),
    ],
}
# requirements.txt: the rules above, and a requirement installed from a URL (pip fetches it).
REQUIREMENTS_RULES: dict[str, list[tuple[str, str]]] = {
    "network": [(r"^\s*[^#\s][^#\n]*@\s*https?://|^\s*https?://", "installs a requirement from a URL")],
}
# A folder without requirements.txt declares its dependencies in pyproject.toml; of that file
# only a dependency taken from a git repository (a uv source) or a URL says something here.
PYPROJECT_RULES: dict[str, list[tuple[str, str]]] = {
    "network": [
        (r"git\+https://|^\s*[\w.-]+\s*=\s*\{\s*git\s*=", "clones a repository"),
        (r"@\s*https?://", "installs a requirement from a URL"),
    ],
}
# Only what runs when the server starts or its tests run is scanned: its Python modules, tests
# and requirements. Data-preparation scripts, configs (dataset lists for training) and data
# files are not: a folder whose training data lives elsewhere can still pass its own tests.
SCANNED_SUFFIXES = {".py", ".txt", ".toml"}
UNSCANNED_DIRS = {"data", "configs", "scripts", ".venv", "__pycache__"}
UNSCANNED_FILES = re.compile(
    r"^(prepare|create|generate|download|build|convert|make)[a-z0-9_]*\.py$|_prep[a-z_]*\.py$"
)
# A container image in a registry (``docker.io/org/name:tag``, ``org/name:tag``), in a row field
# whose name says image: the task runs in that image, which must be pulled.
_IMAGE_REF = re.compile(r"^(?:[\w.-]+(?::\d+)?/)+[\w.-]+:[\w.-]+$")


def _rules_for(name: str) -> list[dict[str, list[tuple[str, str]]]]:
    if name == "pyproject.toml":
        return [PYPROJECT_RULES]
    if name == "requirements.txt":
        return [NEEDS_RULES, REQUIREMENTS_RULES]
    return [NEEDS_RULES]


def _where(rel: Path | str, text: str, match: re.Match[str]) -> str:
    """``file:line: the line`` (shortened) for a match in ``text``."""
    line_no = text.count("\n", 0, match.start()) + 1
    line = text.splitlines()[line_no - 1].strip() if text.splitlines() else ""
    return f"{rel}:{line_no}: {line[:90]}"


def _first_match(pattern: str, text: str) -> re.Match[str] | None:
    """The first match of ``pattern`` not on a comment line (a URL cited in a comment is not a call)."""
    for match in re.finditer(pattern, text, re.M):
        line_start = text.rfind("\n", 0, match.start()) + 1
        if not text[line_start : match.start()].lstrip().startswith("#"):
            return match
    return None


def _scanned_files(folder: Path, runtime_only: bool = False) -> Iterator[tuple[Path, Path]]:
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.suffix not in SCANNED_SUFFIXES or not path.is_file() or UNSCANNED_DIRS & set(rel.parts[:-1]):
            continue
        if UNSCANNED_FILES.search(path.name) or (
            path.suffix in (".txt", ".toml") and path.name not in ("requirements.txt", "pyproject.toml")
        ):
            continue
        if runtime_only and (
            "tests" in rel.parts[:-1] or rel.name.startswith("test_") or rel.name == "conftest.py"
        ):
            continue
        if path.stat().st_size <= 2_000_000:
            yield path, rel


def classify_folder(folder: Path, runtime_only: bool = False, follow_imports: bool = True) -> dict[str, str]:
    """What a folder needs beyond this machine: ``{"gpu"|"network"|"private_data": reason}``.

    The rule: scan the folder's code, tests and requirements for the patterns in
    ``NEEDS_RULES`` (``REQUIREMENTS_RULES``, ``PYPROJECT_RULES``), and the runtime code of the
    server folders its own runtime code imports (:func:`imported_companion_needs`); look at its
    example rows for container images (:func:`example_row_needs`) and at the agent its example
    config runs them with (:func:`example_agent_needs`). The first match per category is the reason given, with
    the file and line. ``runtime_only``: only what runs when the server starts (not its tests).
    """
    needs: dict[str, str] = {}
    for path, rel in _scanned_files(folder, runtime_only):
        text = path.read_text(errors="replace")
        for rules in _rules_for(path.name):
            for category, patterns in rules.items():
                if category in needs:
                    continue
                for pattern, reason in patterns:
                    match = _first_match(pattern, text)
                    if match:
                        needs[category] = f"{reason} ({_where(rel, text, match)})"
                        break
    if not runtime_only:
        for category, reason in {**example_agent_needs(folder), **example_row_needs(folder)}.items():
            needs.setdefault(category, reason)
        keyed = config_api_key(folder)
        if keyed:
            needs.setdefault("network", keyed)
        unshipped = unshipped_data_file(folder)
        if unshipped:
            needs.setdefault("private_data", unshipped)
    for category, reason in (imported_companion_needs(folder) if follow_imports else {}).items():
        needs.setdefault(category, reason)
    return needs


# A runtime import of another server folder: ``from responses_api_models.local_vllm_model.app import``.
_COMPANION_IMPORT = re.compile(
    r"^[ \t]*(?:from|import)[ \t]+((?:resources_servers|responses_api_agents|responses_api_models)\.\w+(?:\.\w+)*)",
    re.M,
)


def _module_file(wheel: Path, module: str) -> Path | None:
    """The file of a server folder's module, unless it is one the rule does not scan (a
    data-preparation script such as ``prepare_data.py``, tests): what it does runs when called."""
    found = module_source(wheel, module)
    if found is None:
        return None
    parts = set(found.relative_to(wheel).parts[2:-1])
    return None if UNSCANNED_FILES.search(found.name) or (UNSCANNED_DIRS | {"tests"}) & parts else found


def _module_needs(wheel: Path, path: Path, seen: set[Path]) -> dict[str, str]:
    """A GPU or the network that the module ``path`` needs, by the rules above, or the server
    folders' modules it imports in turn."""
    text = path.read_text(errors="replace")
    rel = path.relative_to(wheel) if path.is_relative_to(wheel) else path
    needs: dict[str, str] = {}
    for category in ("gpu", "network"):
        for pattern, reason in NEEDS_RULES[category]:
            match = _first_match(pattern, text)
            if match:
                needs[category] = f"{reason} ({_where(rel, text, match)})"
                break
    for match in _COMPANION_IMPORT.finditer(text):
        module = _module_file(wheel, match.group(1))
        if module is None or module.resolve() in seen:
            continue
        seen.add(module.resolve())
        for category, reason in _module_needs(wheel, module, seen).items():
            needs.setdefault(
                category, f"imports {match.group(1)} ({_where(rel, text, match)}), which {reason}"
            )
    return needs


def imported_companion_needs(folder: Path) -> dict[str, str]:
    """A GPU or the network that the modules of other server folders this folder's runtime code
    imports need (by the same rules, over those modules and what they import in turn): 0.7.0's
    ``genrm_model`` builds on ``local_vllm_model.app``, which imports vllm. Only the imported
    modules count, not their whole folders (an agent importing an environment's ``schemas``
    does not run its server). Each reason names the importing line."""
    wheel = folder.parent.parent
    seen = {p.resolve() for p in _runtime_files(folder)}
    needs: dict[str, str] = {}
    for path in _runtime_files(folder):
        text = path.read_text(errors="replace")
        for match in _COMPANION_IMPORT.finditer(text):
            module = _module_file(wheel, match.group(1))
            if module is None or module.resolve() in seen:
                continue
            seen.add(module.resolve())
            where = _where(path.relative_to(folder), text, match)
            for category, reason in _module_needs(wheel, module, seen).items():
                needs.setdefault(category, f"imports {match.group(1)} ({where}), which {reason}")
    return needs


_REQUIRED_KEY = re.compile(r"^\s*(\w*(api_key|token|secret)\w*)\s*:\s*\$\{\w+\}\s*$", re.I | re.M)


def config_api_key(folder: Path) -> str | None:
    """A config of the folder giving its own server an API key that must be set
    (``tavily_api_key: ${tavily_api_key}``, no default): the server calls that service."""
    for config in sorted((folder / "configs").glob("*.yaml")):
        text = config.read_text(errors="replace")
        match = _REQUIRED_KEY.search(text)
        if match and _in_own_server_block(text, match.start(), folder.name):
            return f"its server is given an API key ({_where(config.relative_to(folder), text, match)})"
    return None


def _in_own_server_block(text: str, position: int, name: str) -> bool:
    """Whether ``position`` lies in the ``resources_servers: NAME:`` block of a config."""
    head = text[:position]
    block = head.rfind(f"\n    {name}:")
    kind = head.rfind("\n  resources_servers:")
    other = max(head.rfind("\n  responses_api_models:"), head.rfind("\n  responses_api_agents:"))
    return block > kind > other


def unshipped_data_file(folder: Path) -> str | None:
    """A file under the folder's own ``data/`` that its server's code names (``"data/tests.jsonl"``)
    and that neither the folder ships nor any of its data scripts writes: data kept elsewhere."""
    scripts = "".join(p.read_text(errors="replace") for p in _data_scripts(folder))
    for path in _runtime_files(folder):
        text = path.read_text(errors="replace")
        for match in _DATA_LITERAL.finditer(text):
            literal, base = match.group(1), match.group(2)
            if literal.startswith("data/") and "{" not in literal and not (folder / literal).exists():
                if base not in scripts:
                    where = _where(path.relative_to(folder), text, match)
                    return f"reads {literal}, which the folder does not ship and no script of it writes ({where})"
    return None


def _strings(node: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """``(field name, value)`` of every string in a row, nested ones included."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, str(k))
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, key)
    elif isinstance(node, str):
        yield key, node


def _example_rows(folder: Path, limit: int = 50) -> Iterator[tuple[int, dict[str, Any]]]:
    rows = folder / "data" / "example.jsonl"
    if not rows.is_file():
        return
    for line_no, line in enumerate(rows.read_text(errors="replace").splitlines()[:limit], 1):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            yield line_no, row


def example_row_needs(folder: Path) -> dict[str, str]:
    """``{"network": reason}`` when the example rows run each task in a container image from a
    registry (a field named ``*image*`` holding ``registry/org/name:tag``), else ``{}``."""
    for line_no, row in _example_rows(folder):
        for key, value in _strings(row):
            if "image" in key.lower() and len(value) < 300 and _IMAGE_REF.match(value):
                return {
                    "network": f"runs each task in a container image from a registry "
                    f"(data/example.jsonl:{line_no}: {key} = {value[:90]})"
                }
    return {}


def example_agent_needs(folder: Path) -> dict[str, str]:
    """What the servers that run the example rows with it
    (:func:`~nemo_gym.tools.env_example_run.example_run`) need when they start (their runtime code
    and requirements, not their tests): a GPU or the network. Those are the agent and every other
    resources server the example config starts (``rdkit_chemistry``'s rows go through
    ``ns_tools``, whose requirement is cloned from git)."""
    run = example_run(folder)
    if run is None:
        return {}
    config = run.config.relative_to(folder) if run.config.is_relative_to(folder) else run.config
    wheel = folder.parent.parent
    others = [
        (RESOURCES, impl, f"its example config ({config}) also starts resources server {impl}, which")
        for impl in started_servers(run.config)
        if impl != folder.name
    ]
    if run.implementation is not None:
        others.insert(0, (AGENTS, run.implementation, f"its example agent {run.implementation} ({config})"))
    needs: dict[str, str] = {}
    for kind, impl, who in others:
        companion = wheel / kind / impl
        if not companion.is_dir() or companion == folder:
            continue
        for category, reason in classify_folder(companion, runtime_only=True).items():
            if category in ("gpu", "network"):
                needs.setdefault(category, f"{who} {reason}")
    return needs


# A data file named by the server's code: a string literal ending in one of these suffixes.
_DATA_LITERAL = re.compile(
    r"[\"']([\w./-]*?([\w.-]+\.(?:txt|jsonl?|csv|tsv|parquet|pkl|pickle|npy|npz|db|sqlite|h5|hdf5)))[\"']"
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
    A missing file the README fetches on a download line (``hf download REPO db.json``) is
    fetched by that command. Likewise a path an example row names (``test_media/documents/ID/manifest.json``) that the
    folder does not ship (or ships as an empty directory), under a directory a data script names
    (the folder's own, or ``benchmarks/NAME/prepare.py``): the rows' media are fetched by it.
    """
    root = display_root or folder.parent.parent
    shipped = {p.name for p in folder.rglob("*") if p.is_file()}
    missing: list[str] = []
    for path in _runtime_files(folder):
        for literal, base in _DATA_LITERAL.findall(path.read_text(errors="replace")):
            if base not in shipped and base not in _NOT_DATA and "{" not in literal and base not in missing:
                missing.append(base)
    scripts = _data_scripts(folder)
    for script in scripts if missing else []:
        text = script.read_text(errors="replace")
        written = [base for base in missing if base in text]
        if written:
            where = script.relative_to(root) if script.is_relative_to(root) else script
            return f"python {where} (it writes {', '.join(written)}: the server's code names it, the folder does not ship it)"
    rows_missing = _missing_row_paths(folder)
    benchmark = folder.parent.parent / "benchmarks" / folder.name / "prepare.py"
    for script in [*scripts, *([benchmark] if benchmark.is_file() else [])] if rows_missing else []:
        text = script.read_text(errors="replace")
        named = [p for p in rows_missing if re.search(rf"[\"']{re.escape(p.split('/')[0])}[\"'/]", text)]
        if named:
            where = script.relative_to(root) if script.is_relative_to(root) else script
            return (
                f"python {where} (example rows name {named[0]}, which the folder does not ship: "
                f"the script writes {named[0].split('/')[0]}/)"
            )
    return _readme_step(folder, missing, root)


# A README line that downloads something: ``hf download REPO FILE``, ``wget URL``, ``curl -O URL``.
_DOWNLOAD_COMMAND = re.compile(r"\b(hf|huggingface-cli)\s+download\b|^\s*(wget|curl)\s")


def _readme_step(folder: Path, missing: list[str], root: Path) -> str | None:
    """A README (the folder's, then ``benchmarks/NAME/README.md``) line naming a missing data
    file: a download command (``hf download REPO db.json``) is the step itself; a line that (with
    the next) says to download, stage or fetch it says where the step is written down."""
    readmes = [folder / "README.md", folder.parent.parent / "benchmarks" / folder.name / "README.md"]
    found: list[tuple[Path, int, str, list[str]]] = []
    for readme in readmes if missing else []:
        lines = readme.read_text(errors="replace").splitlines() if readme.is_file() else []
        for line_no, line in enumerate(lines, 1):
            named = [base for base in missing if base in line]
            nearby = " ".join(lines[line_no - 1 : line_no + 1])
            if named and (_DOWNLOAD_COMMAND.search(line) or _FETCH_WORD.search(nearby)):
                found.append((readme, line_no, line.strip().rstrip("\\").strip(), named))
    for readme, line_no, line, named in sorted(found, key=lambda f: not _DOWNLOAD_COMMAND.search(f[2])):
        where = readme.relative_to(root) if readme.is_relative_to(root) else readme
        if _DOWNLOAD_COMMAND.search(line):
            return f"{line[:120]} ({where}:{line_no}: it fetches {', '.join(named)}: the server's code names it, the folder does not ship it)"
        return f"fetch {', '.join(named)} as {where}:{line_no} says ({line[:120]}): the server's code names it, the folder does not ship it"
    return None


# Prose that says a file must be fetched by hand (on the line naming it, or the next).
_FETCH_WORD = re.compile(r"\b(download\w*|stag(e|ed|ing)|fetch\w*)\b", re.I)
_ROW_PATH = re.compile(r"^[\w.-]+(/[\w.-]+)+$")


def _missing_row_paths(folder: Path) -> list[str]:
    """Relative paths the example rows name that neither the folder nor its ``data/`` holds
    (an empty directory counts as missing)."""

    def present(path: Path) -> bool:
        return path.is_file() or (path.is_dir() and any(path.iterdir()))

    out: list[str] = []
    for _, row in _example_rows(folder):
        for _, value in _strings(row):
            if len(value) < 300 and _ROW_PATH.match(value) and value not in out:
                if not (present(folder / value) or present(folder / "data" / value)):
                    out.append(value)
    return out


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
