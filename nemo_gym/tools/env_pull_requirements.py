"""What a pulled NeMo Gym folder needs installed: the lines of its ``requirements.txt`` (or
``pyproject.toml``), and NeMo Gym's own dependencies that its code imports without listing them
(they come with ``-e nemo-gym[...]`` in NeMo Gym, not with this package).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from nemo_gym.tools.env_pull_wheel import PIP_TIMEOUT_S, _pip_index_args, wheel_metadata

# Requirements never installed without +install_gpu_requirements=true: CUDA stacks of
# several GB that only an accelerator machine can use.
GPU_REQUIREMENTS = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "vllm",
        "flashinfer-python",
        "flash-attn",
        "deepspeed",
        "xformers",
        "triton",
    }
)


def read_requirements(path: Path) -> list[str]:
    """The third-party requirement lines of a folder's ``requirements.txt``.

    NeMo Gym's self-reference (``-e nemo-gym[dev] @ ../../``, or ``-e`` of a path holding a
    ``nemo_gym`` package) is dropped: this package stands in for it. A local path (``-e
    ./pocketshell[pcre]``, relative to the file) becomes ``-e <absolute path>[extras]``. Entries
    glued together by a missing newline (``tiktoken-e nemo-gym...``) are split.
    """
    if not path.is_file():
        return []
    out = []
    for raw in path.read_text(errors="replace").splitlines():
        for part in re.split(r"(?=-e\s)", raw):
            line = part.split("#", 1)[0].strip()
            editable = line.startswith("-e ")
            line = line.removeprefix("-e ").strip() if editable else line
            if not line or re.match(r"nemo[-_]gym\b", line, re.I):
                continue
            if line.startswith((".", "/")):
                where, bracket, extras = line.partition("[")
                target = (path.parent / where).resolve()
                # ../../ from a folder is its project root: NeMo Gym itself, as is a path holding nemo_gym/.
                if (
                    not target.is_dir()
                    or (target / "nemo_gym").is_dir()
                    or target == path.parent.parent.parent
                ):
                    continue
                out.append(("-e " if editable else "") + f"{target}{bracket}{extras}")
            elif not line.startswith("-"):
                out.append(line)
    return out


def read_pyproject_requirements(path: Path) -> list[str]:
    """The third-party dependencies a folder's ``pyproject.toml`` declares (``[project]
    dependencies``), with its uv sources applied: a ``git`` source becomes ``name @
    git+URL[@rev]``, a ``url`` source ``name @ URL``, a ``path`` source the absolute path
    (``-e`` when editable). NeMo Gym's self-reference is dropped, as in :func:`read_requirements`."""
    import tomllib

    if not path.is_file():
        return []
    data = tomllib.loads(path.read_text(errors="replace"))
    sources = {
        requirement_name(k): v
        for k, v in ((data.get("tool") or {}).get("uv") or {}).get("sources", {}).items()
    }
    out = []
    for dep in (data.get("project") or {}).get("dependencies") or []:
        name = requirement_name(dep)
        if re.match(r"nemo[-_]gym\b", dep, re.I):
            continue
        source = sources.get(name) or {}
        if source.get("git"):
            ref = source.get("rev") or source.get("tag") or source.get("branch")
            out.append(f"{name} @ git+{source['git']}" + (f"@{ref}" if ref else ""))
        elif source.get("url"):
            out.append(f"{name} @ {source['url']}")
        elif source.get("path"):
            target = (path.parent / source["path"]).resolve()
            if target.is_dir() and not (target / "nemo_gym").is_dir() and target != path.parent.parent.parent:
                out.append(("-e " if source.get("editable") else "") + str(target))
        else:
            out.append(dep)
    return out


def folder_requirements(folder: Path) -> list[str]:
    """What a folder needs installed: its ``requirements.txt`` when it has one, else what its
    ``pyproject.toml`` declares (some NeMo Gym folders, e.g. ``code_fim``, have only that)."""
    if (folder / "requirements.txt").is_file():
        return read_requirements(folder / "requirements.txt")
    return read_pyproject_requirements(folder / "pyproject.toml")


def pip_arguments(reqs: list[str]) -> list[str]:
    """``reqs`` as pip command-line arguments (``-e PATH`` split in two)."""
    args: list[str] = []
    for req in reqs:
        args += ["-e", req[3:]] if req.startswith("-e ") else [req]
    return args


def requirement_name(req: str) -> str:
    """The normalised distribution name of a requirement line (``Pillow==1`` -> ``pillow``)."""
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
    return re.sub(r"[-_.]+", "-", m.group(0)).lower() if m else req


def unmet_requirements(reqs: list[str]) -> list[str]:
    """The requirement lines the running environment does not satisfy."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for req in reqs:
        if req.startswith(("-e ", "/")):  # a local project: always (re)installed
            out.append(req)
            continue
        try:
            parsed = Requirement(req)
            have = metadata.version(parsed.name)
        except (InvalidRequirement, metadata.PackageNotFoundError):
            out.append(req)
            continue
        if parsed.url is None and parsed.specifier and not parsed.specifier.contains(have, prereleases=True):
            out.append(req)
    return out


def protected_versions(dist: str = "nemo_gym") -> dict[str, str]:
    """The installed version of every distribution this package requires (all extras), and of
    what those pin exactly (``pydantic`` pins ``pydantic-core==``), by normalised name: a pull
    never changes them. A folder pinning ``pydantic==2.13.4`` beside another ``pydantic-core``
    would break this package; a looser dependency of a dependency (``python-dateutil`` through
    pandas) may be shadowed by what a folder needs."""
    from packaging.requirements import InvalidRequirement, Requirement

    found: dict[str, str] = {}
    todo = [dist]
    while todo:
        name = todo.pop()
        try:
            meta = metadata.metadata(name)
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        if name != dist:
            found[requirement_name(name)] = meta["Version"]
        extras = meta.get_all("Provides-Extra") or [] if name == dist else []
        for line in requires:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            wanted = req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ["", *extras])
            pinned = any(spec.operator == "==" for spec in req.specifier)
            if (
                wanted
                and (name == dist or pinned)
                and requirement_name(req.name) not in found
                and _installed(req.name)
            ):
                todo.append(req.name)
    return found


def installed_conflicts(reqs: list[str], protected: dict[str, str]) -> list[str]:
    """Those of ``reqs`` (unmet ones) that would change a distribution this package uses."""
    return [r for r in reqs if requirement_name(r) in protected]


def install_requirements(
    reqs: list[str], index_url: str | None = None, keep: dict[str, str] | None = None
) -> tuple[bool, str]:
    """``pip install`` ``reqs`` into the running environment, never changing the versions in
    ``keep`` (a constraints file pins them); ``(ok, pip's last line)``."""
    if not reqs:
        return True, ""
    with tempfile.TemporaryDirectory(prefix="nemo_gym_pull.") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(
            "".join(f"{name}=={version}\n" for name, version in sorted((keep or {}).items()))
        )
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            "-c",
            str(constraints),
            *_pip_index_args(index_url),
            *reqs,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    tail = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return proc.returncode == 0, tail[-1] if tail else ""


def index_alternatives(reqs: list[str], index_url: str | None = None) -> list[str]:
    """For each of ``reqs`` taken from a git clone or a URL whose distribution is on the package
    index, ``"NAME @ git+...: on the index as NAME==VERSION"`` (the newest version pip would pick
    for this interpreter, which may differ from the pinned revision)."""
    out = []
    for req in reqs:
        if " @ " not in req and not req.startswith(("git+", "http")):
            continue
        name = requirement_name(req.split("[")[0])
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", "--disable-pip-version-check",
             *_pip_index_args(index_url), name],
            capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
        )  # fmt: skip
        match = re.match(r"\S+ \(([^)]+)\)", proc.stdout.strip()) if proc.returncode == 0 else None
        if match:
            out.append(f"{req.split(';')[0].strip()}: on the index as {name}=={match.group(1)}")
    return out


# NeMo Gym's folders list ``-e nemo-gym[dev]`` as a requirement: NeMo Gym's own dependencies
# come with it. Those a folder's code names (by import name) and this environment lacks are
# installed with the folder. A distribution's import name, where it differs from its name:
IMPORT_NAMES = {
    "pyyaml": "yaml",
    "hydra-core": "hydra",
    "pillow": "PIL",
    "requests-mock": "requests_mock",
    "mlflow-skinny": "mlflow",
    "pyjwt": "jwt",
    "gitpython": "git",
    "python-multipart": "multipart",
    "pydantic-core": "pydantic_core",
    "pytest-asyncio": "pytest_asyncio",
    "pytest-xdist": "xdist",
    "pytest-cov": "pytest_cov",
}


# Development tools of NeMo Gym's ``dev`` extra that no folder's tests need.
DEV_TOOLS = {"pre-commit", "mypy", "ruff", "coverage", "pytest-cov"}
# What NeMo Gym's own modules import through its dependencies' dependencies (its metrics
# import pandas), so its folders use them without listing them.
TRANSITIVE = ["pandas", "numpy", "requests", "httpx", "huggingface-hub"]
# Pytest plugins are used by fixture name, not imported.
FIXTURE_NAMES = {"requests-mock": "requests_mock"}


def runtime_requirements(folder: Path, dependencies: dict[str, list[str]]) -> list[str]:
    """NeMo Gym's dependencies (core, plus the extras its ``nemo-gym[...]`` line names) that the
    folder's code imports (or, for a pytest plugin, names as a fixture) and that are not
    installed here at all. A dependency installed at another version is left alone: this
    package's own pins (openai, ...) win."""
    text = "\n".join(
        (folder / name).read_text(errors="replace")
        for name in ("requirements.txt", "pyproject.toml")
        if (folder / name).exists()
    )
    extras = {e.strip() for m in re.finditer(r"nemo[-_]gym\[([^\]]*)\]", text) for e in m.group(1).split(",")}
    candidates = [r for extra in ("", *sorted(extras)) for r in dependencies.get(extra, [])] + TRANSITIVE
    code = "\n".join(p.read_text(errors="replace") for p in folder.rglob("*.py") if ".venv" not in p.parts)
    needed = []
    for req in candidates:
        dist = requirement_name(req)
        if dist in DEV_TOOLS:
            continue
        if dist in FIXTURE_NAMES:
            used = re.search(rf"\b{FIXTURE_NAMES[dist]}\b", code)
        else:
            module = IMPORT_NAMES.get(dist, dist.replace("-", "_"))
            used = re.search(rf"^\s*(import|from)\s+{re.escape(module)}\b", code, re.M)
        if used and not _installed(dist):
            needed.append(req)
    return needed


# The first setuptools release without ``pkg_resources``.
SETUPTOOLS_WITHOUT_PKG_RESOURCES = "81"


def pkg_resources_setuptools(folder: Path, reqs: list[str], available: bool) -> list[str]:
    """``reqs`` with a setuptools that still ships ``pkg_resources`` when the folder's code
    imports it and the running environment has none (``available`` false): its own setuptools
    line narrowed below 81, or one added. NeMo Gym's folders import it for libraries that need
    it (0.7.0's ``grl_sokoban``: ``gym_sokoban`` 0.0.6 imports it, and the folder's fallback
    needs Python 3.12's ``importlib.resources`` on a module). A folder's range that leaves no
    such version is kept as it is."""
    from packaging.requirements import InvalidRequirement, Requirement

    code = "\n".join(p.read_text(errors="replace") for p in folder.rglob("*.py") if ".venv" not in p.parts)
    if available or not re.search(r"^\s*(import|from)\s+pkg_resources\b", code, re.M):
        return reqs
    out, found = [], False
    for req in reqs:
        try:
            parsed = Requirement(req) if requirement_name(req) == "setuptools" else None
        except InvalidRequirement:
            parsed = None
        if parsed is not None and parsed.url is None:
            found = True
            if parsed.specifier.contains("80", prereleases=True) or not parsed.specifier:
                spec = ",".join(filter(None, [str(parsed.specifier), f"<{SETUPTOOLS_WITHOUT_PKG_RESOURCES}"]))
                req = f"setuptools{spec}"
        out.append(req)
    return out if found else [*out, f"setuptools<{SETUPTOOLS_WITHOUT_PKG_RESOURCES}"]


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def nemo_gym_dependencies(wheel_root: Path) -> dict[str, list[str]]:
    """The wheel's ``Requires-Dist``: ``{"": core, "<extra>": that extra's}`` requirement lines."""
    meta = wheel_metadata(wheel_root)
    out: dict[str, list[str]] = {}
    for line in (meta.get_all("Requires-Dist") or []) if meta is not None else []:
        spec, _, marker = line.partition(";")
        extra = re.search(r"extra\s*==\s*[\"']([^\"']+)", marker)
        if requirement_name(spec) != "nemo-gym":
            out.setdefault(extra.group(1) if extra else "", []).append(spec.strip())
    return out
