"""The release's own dependency pins, in the environment a pulled folder runs in.

NeMo Gym runs each server in a virtual environment built from its release's ``nemo-gym``
dependency list plus the folder's requirements, so a folder's tests are written against the
versions that list allows: 0.4.0 declares ``openai<=2.7.2`` and its agents compare response
dumps with openai 2.7.2's keys. Where a release's range (a core ``Requires-Dist``, no extra)
excludes the version installed here, the pull installs the newest version the range allows,
into the environment that runs the pull (a layered one shadows its base, as the corpus
script's does), so long as this package's own range for that distribution still holds
(``openai>=1.99.9``): a pin this package cannot run on is refused and reported, as is a
distribution that what this package runs on pins exactly (``pydantic`` pins
``pydantic-core``). Every release goes through this one rule.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from nemo_gym.tools.env_pull_requirements import install_requirements, requirement_name
from nemo_gym.tools.env_pull_wheel import wheel_metadata


@dataclasses.dataclass
class ReleasePin:
    """One distribution the release pins away from what is installed here."""

    name: str  # normalised distribution name
    release: str  # the release's requirement line (``openai<=2.7.2``)
    installed: str  # the version installed before the pull
    requirement: str  # what pip is asked for: the release's range within ours (``openai<=2.7.2,>=1.99.9``)
    now: str = ""  # the version installed after the pull ("" until applied)


def parsed_requirements(lines: Iterable[str]) -> Iterator[tuple[str, Requirement]]:
    """``(line, requirement)`` for each line that parses as a requirement (others are skipped:
    a dependency list's odd line is pip's to judge, not the pull's)."""
    for line in lines:
        try:
            yield line, Requirement(line)
        except InvalidRequirement:
            continue


def release_requirements(wheel_root: Path) -> list[str]:
    """The release's core ``Requires-Dist`` lines (no extra) whose markers hold here."""
    meta = wheel_metadata(wheel_root)
    out = []
    for line, req in parsed_requirements((meta.get_all("Requires-Dist") or []) if meta is not None else []):
        if req.marker is not None and ("extra" in str(req.marker) or not req.marker.evaluate({"extra": ""})):
            continue
        if requirement_name(req.name) != "nemo-gym":
            out.append(line.split(";", 1)[0].strip())
    return out


def own_ranges(dist: str = "nemo_gym") -> dict[str, SpecifierSet] | None:
    """This package's own range for each distribution it requires (every extra), by normalised
    name: from the ``pyproject.toml`` beside the imported package when it is a source tree (a
    clone, an editable install, whose installed metadata may be older), else from its installed
    metadata; None when neither is found (its ranges are then unknown)."""
    requires = _source_requires(dist)
    if requires is None:
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            return None
    out: dict[str, SpecifierSet] = {}
    for _, req in parsed_requirements(requires):
        name = requirement_name(req.name)
        out[name] = out.get(name, SpecifierSet()) & req.specifier
    return out


def _source_requires(dist: str) -> list[str] | None:
    """The requirement lines (core and every extra) of the ``pyproject.toml`` holding the
    imported ``dist`` package, or None when it is not imported from a source tree."""
    import importlib.util
    import tomllib

    spec = importlib.util.find_spec(dist)
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    pyproject = origin.parent.parent / "pyproject.toml" if origin is not None else None
    if pyproject is None or not pyproject.is_file():
        return None
    project = tomllib.loads(pyproject.read_text()).get("project") or {}
    if requirement_name(str(project.get("name", ""))) != requirement_name(dist):
        return None
    extras = project.get("optional-dependencies") or {}
    return [*(project.get("dependencies") or []), *(line for lines in extras.values() for line in lines)]


def satisfiable(spec: SpecifierSet) -> bool:
    """Whether some version meets every clause of ``spec``: tried on each version the clauses
    name and on one just above it (``>1.5,<1.6`` holds for 1.5.1), enough for the ranges
    dependency lists use."""
    candidates: list[str] = []
    for clause in spec:
        base = clause.version.removesuffix(".*")
        try:
            Version(base)
        except InvalidVersion:
            return True  # an arbitrary-equality clause: let pip decide
        candidates += [base, f"{base}.1", f"{base}.post1"]
    return not candidates or any(spec.contains(v, prereleases=True) for v in candidates)


def _installed_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def plan_release_pins(
    release: list[str],
    ours: dict[str, SpecifierSet] | None,
    keep: dict[str, str],
    installed: Callable[[str], str | None] = _installed_version,
) -> tuple[list[ReleasePin], list[str]]:
    """``(pins, refused)``: the release's requirements whose range excludes the installed
    version, as pins within this package's own range (``ours``), and those refused, each with
    why. ``keep`` is what this package runs on (:func:`~nemo_gym.tools.env_pull_requirements.protected_versions`):
    one of those that this package does not itself require is pinned exactly by one that it
    does, and is kept. A distribution not installed here is left to the folder's own needs."""
    pins: list[ReleasePin] = []
    refused: list[str] = []
    for line, req in parsed_requirements(release):
        name = requirement_name(req.name)
        have = installed(req.name)
        if req.url or not req.specifier or have is None or req.specifier.contains(have, prereleases=True):
            continue
        if ours is None:
            refused.append(f"{line} (kept {name} {have}: this package's own requirements cannot be read)")
            continue
        if name in keep and name not in ours:
            refused.append(f"{line} (kept {name} {have}: a package this one runs on pins it exactly)")
            continue
        own = ours.get(name, SpecifierSet())
        if own and not satisfiable(req.specifier & own):
            refused.append(f"{line} (kept {name} {have}: outside this package's own range {name}{own})")
            continue
        spec = ",".join(sorted(str(c) for c in req.specifier & own))
        pins.append(ReleasePin(name=name, release=line, installed=have, requirement=f"{name}{spec}"))
    return pins, refused


def apply_release_pins(
    pins: list[ReleasePin], keep: dict[str, str], index_url: str | None
) -> tuple[list[ReleasePin], list[str]]:
    """Install each pin (pip constrained to ``keep`` less the pinned distributions):
    ``(applied, refused with pip's reason)``. Applied pins carry the version now installed."""
    if not pins:
        return [], []
    names = {p.name for p in pins}
    rest = {k: v for k, v in keep.items() if k not in names}
    ok, last = install_requirements([p.requirement for p in pins], index_url, rest)
    results = [(p, ok, last) for p in pins]
    if not ok and len(pins) > 1:  # one by one, so one that cannot be installed spares the rest
        results = [(p, *install_requirements([p.requirement], index_url, rest)) for p in pins]
    importlib.invalidate_caches()
    applied, refused = [], []
    for pin, done, why in results:
        if done:
            applied.append(dataclasses.replace(pin, now=_installed_version(pin.name) or "?"))
        else:
            refused.append(f"{pin.release} (kept {pin.name} {pin.installed}: pip: {why})")
    return applied, refused


__all__ = [
    "ReleasePin",
    "apply_release_pins",
    "own_ranges",
    "parsed_requirements",
    "plan_release_pins",
    "release_requirements",
    "satisfiable",
]
