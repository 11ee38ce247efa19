"""What else a NeMo Gym folder brings with it: the sibling folders it imports or names, and the
bundled folders of this project it would use in their place.

A folder of the ``nemo-gym`` wheel may import a helper package (``wordle`` imports
``resources_servers.gymnasium``), subclass another environment (``polymath`` builds on
``resources_servers.math_with_judge.app``) or name one in its configs and tests. A pull brings
them all (:func:`folder_closure`). Where this project already has a folder of that name, the
pulled folder would import it instead of NeMo Gym's: :func:`clashes` says, name by name, what
the pulled code imports from it that the project's folder does not define.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from nemo_gym.tools.env_pull_internals import missing_internals
from nemo_gym.tools.env_pull_wheel import KINDS, module_source

SOURCE_RECORD = ".nemo_gym_source.json"
# The wheel's trees whose folders another folder may import or name: the three server kinds, the
# benchmarks (a benchmark's config.yaml, read by an environment's tests) and the environment
# servers (genrm_compare's tests import environment_servers.legacy_agent).
TREES = (*KINDS, "benchmarks", "environment_servers")
_FOLDER_REFERENCE = re.compile(rf"\b({'|'.join(TREES)})[./](\w+)")
# The same written as a path join: ``ROOT / "resources_servers" / "agentif"``.
_JOINED_REFERENCE = re.compile(rf"[\"']({'|'.join(TREES)})[\"']\s*/\s*[\"'](\w+)[\"']")
# A join onto a name alone (``Path(__file__).parents[2] / "anyswe_agent"``): a sibling server
# folder of the same kind when the wheel has one of that name.
_JOINED_NAME = re.compile(r"/\s*[\"'](\w+)[\"']")
_SCANNED = (".py", ".yaml", ".yml")


def _config_servers(text: str) -> set[tuple[str, str]]:
    """``(kind, implementation)`` of every server a config declares (``inst: {kind: {impl: {...}}}``)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return set()
    found = set()
    for block in data.values() if isinstance(data, dict) else []:
        for kind, impls in block.items() if isinstance(block, dict) else []:
            if kind in KINDS and isinstance(impls, dict):
                found |= {(kind, str(impl)) for impl in impls}
    return found


def referenced_folders(
    wheel_root: Path, kind: str, name: str, code_only: bool = False
) -> set[tuple[str, str]]:
    """The other wheel folders that ``kind/name``'s Python and YAML files import or name, and the
    servers its configs declare (``code_only``: what its Python files name)."""
    found: set[tuple[str, str]] = set()
    for path in (wheel_root / kind / name).rglob("*"):
        if path.suffix not in _SCANNED or not path.is_file() or ".venv" in path.parts:
            continue
        if code_only and path.suffix != ".py":
            continue
        text = path.read_text(errors="replace")
        refs = set(_FOLDER_REFERENCE.findall(text)) | set(_JOINED_REFERENCE.findall(text))
        if path.suffix == ".py":
            refs |= {
                (kind, n) for n in _JOINED_NAME.findall(text) if (wheel_root / kind / n / "app.py").is_file()
            }
        if path.suffix in (".yaml", ".yml"):
            refs |= _config_servers(text)
        found |= {ref for ref in refs if (wheel_root / ref[0] / ref[1]).is_dir()}
    # A folder never brings itself, nor a server inside it (a group's ``conversational_tool_use/simulation``).
    here = wheel_root / kind / name
    return {ref for ref in found if not (wheel_root / ref[0] / ref[1]).is_relative_to(here)}


def folder_closure(
    wheel_root: Path, kind: str, name: str, project: Path | None = None, replace: frozenset[str] = frozenset()
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """What pulling ``kind/name`` brings: ``(copied, kept)``.

    ``copied``: every wheel folder it imports or names, and what those import in their Python
    code (a benchmark: the benchmarks its config names), directly or through another copied one
    (itself excluded; the servers a companion's configs declare are not followed). ``kept``: the folders it needs that ``project`` already has (not copied, and not
    followed further: the project's own folder is what will be imported), unless named in
    ``replace`` (``kind/name``). Both sorted.
    """
    copied: set[tuple[str, str]] = set()
    kept: set[tuple[str, str]] = set()
    todo = [(kind, name)]
    while todo:
        current = todo.pop()
        refs = referenced_folders(wheel_root, *current, code_only=current != (kind, name))
        if current != (kind, name) and current[0] == "benchmarks":
            # A benchmark is its config: the benchmarks it names come too (hle_verified's judge
            # prompt is hle's), not the servers it declares.
            refs |= {r for r in referenced_folders(wheel_root, *current) if r[0] == "benchmarks"}
        for ref in refs:
            if ref in copied or ref in kept or ref == (kind, name):
                continue
            here = project is not None and (project / ref[0] / ref[1]).is_dir()
            if here and f"{ref[0]}/{ref[1]}" not in replace:
                kept.add(ref)
            else:
                copied.add(ref)
                todo.append(ref)
    order = lambda ref: (TREES.index(ref[0]), ref[1])  # noqa: E731
    return sorted(copied, key=order), sorted(kept, key=order)


def named_files(
    wheel_root: Path, pulled: list[Path], kept: list[tuple[str, str]], project: Path
) -> list[str]:
    """Files of the project's own folders (``kept``) that the ``pulled`` folders' Python and YAML
    name by their whole path (``responses_api_models/local_vllm_model/configs/x/y.yaml``, read by
    a config test) and that the project's folder lacks, where the wheel's folder of that name has
    them: the pull copies each in. Only data and configs, never a Python module: the project's
    folder stays the implementation that is imported. Sorted paths relative to the project."""
    if not kept:
        return []
    pattern = re.compile(rf"\b({'|'.join(re.escape(f'{k}/{n}') for k, n in kept)})/([\w.\-/]+)")
    found: set[str] = set()
    for folder in pulled:
        for path in folder.rglob("*"):
            if path.suffix not in _SCANNED or not path.is_file() or ".venv" in path.parts:
                continue
            for base, rest in pattern.findall(path.read_text(errors="replace")):
                relative = f"{base}/{rest.rstrip('./')}"
                source = wheel_root / relative
                if source.suffix != ".py" and source.is_file() and not (project / relative).exists():
                    found.add(relative)
    return sorted(found)


def is_pulled(folder: Path) -> bool:
    """Whether ``folder`` was brought in by ``gym env pull`` (it holds the source record)."""
    return (folder / SOURCE_RECORD).is_file()


@dataclass(frozen=True)
class Clash:
    """A project folder that a pulled one would import in place of NeMo Gym's folder of the same name."""

    kind: str
    name: str
    missing: dict[str, list[str]]
    """Module (``resources_servers.math_with_judge.app``) -> names the pulled code imports from
    it that the project's folder does not define (``[]``: the module itself is missing), or
    ``Class._member`` for a private member the pulled code uses of a class it imports."""

    def describe(self) -> str:
        """One sentence per module: what is imported and not there."""
        parts = []
        for module, names in self.missing.items():
            if names:
                parts.append(f"{', '.join(names)} from {module}")
            else:
                parts.append(f"the module {module}")
        return "; ".join(parts)


def _imports(folder: Path, prefix: str) -> dict[str, set[str]]:
    """Module -> names that the Python files under ``folder`` import from modules under ``prefix``."""
    out: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        if ".venv" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                if node.module == prefix or node.module.startswith(prefix + "."):
                    out.setdefault(node.module, set()).update(a.name for a in node.names if a.name != "*")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == prefix or alias.name.startswith(prefix + "."):
                        out.setdefault(alias.name, set())
    return out


def _module_file(project: Path, module: str) -> Path | None:
    base = project.joinpath(*module.split("."))
    return module_source(project, module) or (base if base.is_dir() else None)  # or a namespace package


def _top_level_names(path: Path) -> set[str] | None:
    """Names a module defines at top level (classes, functions, assignments, imports); None if unparsable."""
    if path.is_dir():
        return {p.stem for p in path.iterdir()}
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return None
    names: set[str] = {p.stem for p in path.parent.iterdir()} if path.name == "__init__.py" else set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def clashes(pulled: list[Path], project: Path, refs: list[tuple[str, str]]) -> list[Clash]:
    """The project's own folders among ``refs`` that the ``pulled`` folders' code cannot use.

    A folder of the project answers for NeMo Gym's folder of the same name when every module the
    pulled code imports from it exists and defines every name imported, and every class of it
    that the pulled code builds on has the private members that code uses of it
    (:func:`~nemo_gym.tools.env_pull_internals.missing_internals`). A folder that was itself
    pulled never clashes.
    """
    out = []
    for kind, name in refs:
        local = project / kind / name
        if not local.is_dir() or is_pulled(local):
            continue
        prefix = f"{kind}.{name}"
        wanted: dict[str, set[str]] = {}
        for folder in pulled:
            for module, names in _imports(folder, prefix).items():
                wanted.setdefault(module, set()).update(names)
        files = [p for folder in pulled for p in folder.rglob("*.py") if ".venv" not in p.parts]
        missing: dict[str, list[str]] = {}
        for module, names in sorted(wanted.items()):
            path = _module_file(project, module)
            defined = _top_level_names(path) if path is not None else None
            if path is None or defined is None:
                missing[module] = []
            elif names - defined:
                missing[module] = sorted(names - defined)
            else:
                # Every name is there; a class the pulled code builds on must also have the
                # internals it uses (env_pull_internals).
                internals = missing_internals(files, project, module, names)
                if internals:
                    missing[module] = internals
        if missing:
            out.append(Clash(kind, name, missing))
    return out


def project_users(project: Path, kind: str, name: str, skip: set[Path]) -> list[str]:
    """Files of the project outside ``kind/name`` (and ``skip``) that import or name it."""
    pattern = re.compile(rf"\b{kind}[./]{name}\b")
    users = []
    for top in ("nemo_gym", "tests", "scripts", *TREES):
        base = project / top
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            if path.suffix not in _SCANNED or not path.is_file() or ".venv" in path.parts:
                continue
            if path.is_relative_to(project / kind / name) or any(path.is_relative_to(s) for s in skip):
                continue
            if pattern.search(path.read_text(errors="replace")):
                users.append(str(path.relative_to(project)))
    return sorted(users)
