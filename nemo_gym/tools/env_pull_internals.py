"""The private members a pulled folder uses of a class it imports from a bundled folder.

A bundled folder that carries a NeMo Gym name defines NeMo Gym's class names (``SimpleModelServer``,
``VLLMModel``), so a pulled folder that imports them finds them. A folder that *builds on* such a
class also reaches into its internals: 0.7.0's ``litellm_model`` reads ``self._client`` and
``self._semaphore`` of NeMo Gym's ``openai_model``, ``local_vllm_model_proxy`` calls
``self._post_init()`` of NeMo Gym's ``vllm_model`` to rebuild its clients, and
``vllm_model_with_compaction`` extends ``VLLMModel._TOKENIZE_CHAT_FIELDS``. This project's classes
of those names are other implementations, without those internals: the pulled folder would fail at
its first use of one.

:func:`missing_internals` reads both sides without importing either: the private names (one
leading underscore) the pulled code uses on an imported class (``Name._x``) or, in a class built on
it, on ``self``, ``cls`` or ``super()`` without defining them itself, against what the project's
class defines (its body, ``self._x = ...`` in its methods, and the same for its bases in the project
or in this package, read the same way). Public names are left out: they are the documented API,
which the bundled folder answers for by its own tests.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Container
from pathlib import Path

from nemo_gym.tools.env_pull_wheel import module_source

_OWN = ("self", "cls")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError):
        return None


def _attribute_on(
    node: ast.AST, ctx: type[ast.expr_context], owners: Container[str]
) -> tuple[str, str] | None:
    """``(NAME, x)`` of a ``NAME.x`` read (``ctx`` ``ast.Load``) or stored (``ast.Store``) whose
    ``NAME`` is one of ``owners``; None for any other node."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ctx)
        and isinstance(node.value, ast.Name)
        and node.value.id in owners
    ):
        return node.value.id, node.attr
    return None


def _is_super_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _base_names(node: ast.ClassDef) -> set[str]:
    out = set()
    for base in node.bases:
        if isinstance(base, ast.Name):
            out.add(base.id)
        elif isinstance(base, ast.Attribute):
            out.add(base.attr)
    return out


def _class_defines(node: ast.ClassDef) -> set[str]:
    """Names a class body defines, and attributes its methods store on ``self`` / ``cls``."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.Assign | ast.AnnAssign):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    names.update(found[1] for sub in ast.walk(node) if (found := _attribute_on(sub, ast.Store, _OWN)))
    return names


def _own_uses(node: ast.ClassDef) -> set[str]:
    """Private names a class reads on ``self`` / ``cls`` / ``super()``."""
    used = set()
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Attribute) or not isinstance(sub.ctx, ast.Load) or not _private(sub.attr):
            continue
        if _attribute_on(sub, ast.Load, _OWN) or _is_super_call(sub.value):
            used.add(sub.attr)
    return used


def used_internals(files: list[Path], module: str, names: set[str]) -> dict[str, set[str]]:
    """Class name (of ``names``, imported from ``module``) -> the private names ``files`` use of it."""
    out: dict[str, set[str]] = {}
    for path in files:
        tree = _parse(path)
        if tree is None:
            continue
        local: dict[str, str] = {}  # name in this file -> name in ``module``
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == module and not node.level:
                local.update({(a.asname or a.name): a.name for a in node.names if a.name in names})
        if not local:
            continue
        for node in ast.walk(tree):
            on_import = _attribute_on(node, ast.Load, local)
            if on_import is not None and _private(on_import[1]):
                out.setdefault(local[on_import[0]], set()).add(on_import[1])
            elif isinstance(node, ast.ClassDef):
                bases = [local[b] for b in _base_names(node) if b in local]
                if bases:
                    used = _own_uses(node) - _class_defines(node)
                    if used:
                        out.setdefault(bases[0], set()).update(used)
    return out


def _module_path(project: Path, module: str) -> Path | None:
    """The file of ``module``: under ``project``, else (this package's own modules) where it is installed."""
    found = module_source(project, module)
    if found is not None:
        return found
    if module.split(".")[0] == "nemo_gym":
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            return Path(spec.origin)
    return None


def class_members(
    project: Path, module: str, name: str, seen: set[tuple[str, str]] | None = None
) -> set[str] | None:
    """What class ``name`` of ``module`` defines, through its bases found in the project or in this
    package; None when the class is not found (then nothing is claimed missing)."""
    seen = set() if seen is None else seen
    if (module, name) in seen:
        return set()
    seen.add((module, name))
    path = _module_path(project, module)
    tree = _parse(path) if path is not None else None
    if tree is None:
        return None
    imported: dict[str, tuple[str, str]] = {}
    classes: dict[str, ast.ClassDef] = {}
    aliases: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.update({(a.asname or a.name): (node.module, a.name) for a in node.names})
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = node
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
            aliases.update({t.id: node.value.id for t in node.targets if isinstance(t, ast.Name)})
    name = aliases.get(name, name)
    if name in imported:
        return class_members(project, *imported[name], seen)
    found = classes.get(name)
    if found is None:
        return None
    members = _class_defines(found)
    for base in _base_names(found):
        if base in classes:
            members |= class_members(project, module, base, seen) or set()
        elif base in imported:
            members |= class_members(project, *imported[base], seen) or set()
    return members


def missing_internals(files: list[Path], project: Path, module: str, names: set[str]) -> list[str]:
    """``Class._name`` for each private name ``files`` use of a class imported from the project's
    ``module`` that the project's class does not define."""
    missing = []
    for cls, used in sorted(used_internals(files, module, names).items()):
        members = class_members(project, module, cls)
        if members is not None:
            missing += [f"{cls}.{attr}" for attr in sorted(used - members)]
    return missing
