"""Every nemo_gym name the README and docs/ mention imports from the path they give for it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# NEMO_GYM_ENVIRONMENTS.md is the corpus report: it names NeMo Gym's modules, the missing ones too.
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "NEMO_GYM_ENVIRONMENTS.md"),
]
DOTTED = re.compile(r"`(nemo_gym(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
FROM_IMPORT = re.compile(r"^\s*from (nemo_gym(?:\.\w+)*) import (?:\(([^)]*)\)|([^(\n]+))$", re.M)


def documented_names() -> set[tuple[str, str]]:
    """``(doc, dotted name)`` for each backticked ``nemo_gym.x.y`` and each ``from nemo_gym.x import y``."""
    found: set[tuple[str, str]] = set()
    for doc in DOCS:
        text = doc.read_text()
        for match in DOTTED.finditer(text):
            found.add((doc.name, match.group(1)))
        for match in FROM_IMPORT.finditer(text):
            for name in (match.group(2) or match.group(3)).split(","):
                name = name.split("#")[0].split(" as ")[0].strip()
                if name:
                    found.add((doc.name, f"{match.group(1)}.{name}"))
    return found


def resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted`` and walk the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_docs_mention_names() -> None:
    names = {name for _, name in documented_names()}
    assert (
        "nemo_gym.cli.RunHelper" in names and "nemo_gym.base_resources_server.SimpleResourcesServer" in names
    )


@pytest.mark.parametrize(("doc", "dotted"), sorted(documented_names()))
def test_documented_name_imports(doc: str, dotted: str) -> None:
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{doc} documents {dotted}, which does not import: {exc}")
