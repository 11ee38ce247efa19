"""``ng_pull_environment`` (``gym env pull NAME[==VERSION]``): bring one of NeMo Gym's environments
(or agents, or model adapters) into this project by name.

The ``nemo-gym`` wheel on the package index ships NeMo Gym's server folders. It is fetched with
``pip download`` into a cache (``~/.cache/nemo_gym/wheels``, or ``$NEMO_GYM_WHEEL_CACHE``) and
only unpacked there, never installed: its ``nemo_gym`` package would shadow this one. The named
folder is copied to ``resources_servers/NAME`` (``responses_api_agents/NAME``,
``responses_api_models/NAME`` for the other kinds, or ``+dir=PATH``), the third-party lines of
its ``requirements.txt`` that this environment lacks are installed with pip into the current
environment, and ``.nemo_gym_source.json`` plus the wheel's licence are written into the folder
to record where it came from. The folder then runs with ``ng_run`` / ``gym eval run`` like a
bundled one.

``gym list environments --available [VERSION]`` lists what a wheel offers.
The same wheel helpers serve ``scripts/nemo_gym_corpus.py``.
"""

from __future__ import annotations

import datetime
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, parse_overrides, project_root

KINDS = ("resources_servers", "responses_api_agents", "responses_api_models")
PACKAGE = "nemo-gym"
# The wheel declares Requires-Python >=3.13.14. Its folders are pure Python and are only
# unpacked, so pip is told which interpreter to download for instead of refusing.
WHEEL_PYTHON_VERSION = "3.13.14"
SOURCE_RECORD = ".nemo_gym_source.json"
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
PIP_TIMEOUT_S = 900


class PullError(Exception):
    """A pull that cannot go on; the message says what to do."""


def default_cache_dir() -> Path:
    """Where wheels are downloaded and unpacked: ``$NEMO_GYM_WHEEL_CACHE`` or ``~/.cache/nemo_gym/wheels``."""
    return Path(os.environ.get("NEMO_GYM_WHEEL_CACHE") or Path.home() / ".cache" / "nemo_gym" / "wheels")


def _pip_index_args(index_url: str | None) -> list[str]:
    if not index_url:
        return []
    host = re.sub(r"^[a-z]+://([^/:]+).*$", r"\1", index_url)
    return ["--index-url", index_url, "--trusted-host", host]


def download_wheel(version: str | None, cache_dir: Path, index_url: str | None = None) -> Path:
    """The ``nemo-gym`` wheel file for ``version`` (None: the newest), with ``pip download``.

    A wheel already in ``cache_dir`` for a pinned version is reused. Raises :class:`PullError`
    with pip's own last lines when the index cannot be reached or has no such version.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    if version:
        cached = sorted(cache_dir.glob(f"nemo_gym-{version}-*.whl"))
        if cached:
            return cached[-1]
    with tempfile.TemporaryDirectory(dir=cache_dir) as staging:
        spec = f"{PACKAGE}=={version}" if version else PACKAGE
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
            "--python-version", WHEEL_PYTHON_VERSION, *_pip_index_args(index_url), spec, "-d", staging,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        found = sorted(Path(staging).glob("nemo_gym-*.whl"))
        if proc.returncode != 0 or not found:
            tail = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()][-2:]
            raise PullError(f"pip download {spec} failed: {' | '.join(tail) or f'exit {proc.returncode}'}")
        target = cache_dir / found[0].name
        os.replace(found[0], target)
        return target


def unpack_wheel(wheel: Path) -> Path:
    """The wheel unpacked beside itself (``<cache>/nemo_gym-<version>/``), once."""
    version = wheel_version(wheel)
    unpacked = wheel.parent / f"nemo_gym-{version}"
    # Extracted beside it and renamed into place: the final name never holds a partial tree,
    # so a folder of that name is complete, whoever unpacked it.
    if unpacked.is_dir():
        return unpacked
    staging = Path(tempfile.mkdtemp(prefix=f".nemo_gym-{version}.", dir=wheel.parent))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(staging)
    try:
        staging.rename(unpacked)
    except OSError:  # another process unpacked it at the same moment
        shutil.rmtree(staging, ignore_errors=True)
    return unpacked


def fetch_wheel(version: str | None, cache_dir: Path | None = None, index_url: str | None = None) -> Path:
    """Download (if needed) and unpack the wheel; the unpacked folder."""
    return unpack_wheel(download_wheel(version, cache_dir or default_cache_dir(), index_url))


def wheel_version(wheel: Path) -> str:
    """The version in a wheel's file name (``nemo_gym-0.7.0-py3-none-any.whl`` -> ``0.7.0``)."""
    return wheel.name.split("-")[1]


def list_folders(wheel_root: Path, kinds: tuple[str, ...] | list[str] = KINDS) -> list[tuple[str, str]]:
    """Every server folder (one holding an ``app.py``) of the given kinds: ``(kind, name)``, sorted."""
    out = []
    for kind in kinds:
        base = wheel_root / kind
        if base.is_dir():
            out += [(kind, p.name) for p in sorted(base.iterdir()) if (p / "app.py").is_file()]
    return out


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
                if not target.is_dir() or (target / "nemo_gym").is_dir():
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
            if target.is_dir() and not (target / "nemo_gym").is_dir():
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


def wheel_license(wheel_root: Path) -> tuple[str, list[Path]]:
    """The wheel's declared licence (``License-Expression`` or ``License``) and its licence files."""
    dist_info = next(wheel_root.glob("nemo_gym-*.dist-info"), None)
    if dist_info is None:
        return "unknown", []
    meta = email.parser.Parser().parsestr((dist_info / "METADATA").read_text(errors="replace"))
    # License-Expression is an SPDX name; an old-style License field may hold the whole text,
    # so the licence classifier comes before it, and only its first line is ever kept.
    classifiers = [
        c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License")
    ]
    license_lines = (meta.get("License") or "").strip().splitlines()
    declared = (
        meta.get("License-Expression")
        or ", ".join(classifiers)
        or (license_lines[0] if license_lines else "")
    )
    files = (
        sorted(p for p in (dist_info / "licenses").rglob("*") if p.is_file())
        if (dist_info / "licenses").is_dir()
        else []
    )
    return declared.strip() or "unknown", files


def find_folder(wheel_root: Path, name: str, kind: str | None) -> tuple[str, Path]:
    """``(kind, folder)`` of ``name`` in the wheel (resources servers first); :class:`PullError`
    with the closest names otherwise."""
    import difflib

    folders = list_folders(wheel_root, [kind] if kind else KINDS)
    for k, n in folders:
        if n == name:
            return k, wheel_root / k / n
    names = [n for _, n in folders]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise PullError(
        f"the nemo-gym {wheel_version_of(wheel_root)} wheel has no {kind or 'server folder'} named {name!r}{hint} "
        "(gym list environments --available lists them)"
    )


def wheel_version_of(wheel_root: Path) -> str:
    """The version of an unpacked wheel (from its folder name)."""
    return wheel_root.name.removeprefix("nemo_gym-")


def install_requirements(reqs: list[str], index_url: str | None = None) -> tuple[bool, str]:
    """``pip install`` ``reqs`` into the running environment; ``(ok, pip's last line)``."""
    if not reqs:
        return True, ""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "-q",
        *_pip_index_args(index_url),
        *reqs,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    tail = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return proc.returncode == 0, tail[-1] if tail else ""


def pull_environment(
    name: str,
    version: str | None = None,
    *,
    dest: Path | None = None,
    kind: str | None = None,
    install: bool = True,
    install_gpu_requirements: bool = False,
    force: bool = False,
    cache_dir: Path | None = None,
    index_url: str | None = None,
    project: Path | None = None,
) -> dict[str, Any]:
    """Pull one folder; returns the source record written to ``<dest>/.nemo_gym_source.json``.

    Raises :class:`PullError` when the wheel or the folder cannot be found, when ``dest`` exists
    (unless ``force``), or when pip cannot install a requirement.
    """
    wheel = download_wheel(version, cache_dir or default_cache_dir(), index_url)
    root = unpack_wheel(wheel)
    found_kind, source = find_folder(root, name, kind)
    target = dest or (project or project_root()) / found_kind / name
    if target.exists() and not force:
        raise PullError(
            f"{target} already exists; pass +force=true to replace it or +dir=PATH to put it elsewhere"
        )
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".venv", "__pycache__", "*.pyc"))

    missing = unmet_requirements(folder_requirements(target))
    gpu = [r for r in missing if requirement_name(r) in GPU_REQUIREMENTS and not install_gpu_requirements]
    to_install = [r for r in missing if r not in gpu] if install else []
    if to_install:
        ok, last = install_requirements(to_install, index_url)
        if not ok:
            raise PullError(f"pip could not install {name}'s requirements {to_install}: {last}")

    declared, licence_files = wheel_license(root)
    for licence in licence_files:
        shutil.copy2(licence, target / licence.name)
    record = {
        "package": PACKAGE,
        "version": wheel_version(wheel),
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "index_url": index_url or "pip's configured index",
        "kind": found_kind,
        "name": name,
        "source_path": f"{found_kind}/{name}",
        "license": declared,
        "license_files": [p.name for p in licence_files],
        "requirements_installed": to_install,
        "requirements_not_installed": [r for r in missing if r not in to_install],
        "pulled_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    (target / SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


_NAME_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]*?)(==(?P<version>[0-9][^=\s]*))?$")


def _pull_command(argv: list[str]) -> int:
    """Pull one of NeMo Gym's environments (or agents, model adapters) by name.

    ng_pull_environment NAME[==VERSION] [+dir=PATH] [+kind=KIND] [+install=false]
        [+force=true] [+install_gpu_requirements=true] [+index_url=URL]
    """
    specs = [a for a in argv if not a.startswith("+") and _NAME_SPEC.match(a)]
    overrides = {o.path: o.value for o in parse_overrides([a for a in argv if a not in specs])}
    if len(specs) > 1:
        raise ConfigError(f"name one environment to pull, got {specs}")
    match = _NAME_SPEC.match(specs[0]) if specs else None
    name = (match.group("name") if match else None) or overrides.get("name")
    version = (match.group("version") if match else None) or overrides.get("version")
    if not name:
        raise ConfigError("name the environment to pull: ng_pull_environment NAME[==VERSION] (or +name=NAME)")
    kind = overrides.get("kind")
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"+kind must be one of {', '.join(KINDS)}, got {kind!r}")
    dest = Path(str(overrides["dir"])) if overrides.get("dir") else None
    try:
        record = pull_environment(
            str(name),
            str(version) if version is not None else None,
            dest=dest,
            kind=kind,
            install=overrides.get("install", True) is not False,
            install_gpu_requirements=overrides.get("install_gpu_requirements") is True,
            force=overrides.get("force") is True,
            index_url=overrides.get("index_url"),
        )
    except PullError as exc:
        sys.stderr.write(f"ng_pull_environment: {exc}\n")
        return 1
    where = dest or Path(record["source_path"])
    print(
        f"pulled {record['source_path']} from nemo-gym {record['version']} ({record['license']}) into {where}"
    )
    if record["requirements_installed"]:
        print(f"installed: {', '.join(record['requirements_installed'])}")
    if record["requirements_not_installed"]:
        print(
            f"not installed (install them yourself if needed): {', '.join(record['requirements_not_installed'])}"
        )
    return 0


ng_pull_environment = console_command(_pull_command, "ng_pull_environment")

if __name__ == "__main__":
    ng_pull_environment(None)
