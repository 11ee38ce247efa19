"""The ``nemo-gym`` wheel as a catalogue: download it with pip (never install it), unpack it into a
cache, list its server folders, read its metadata and licence.

Shared by ``gym env pull`` (:mod:`nemo_gym.tools.env_pull`), ``gym list ... --available`` and
``scripts/nemo_gym_corpus.py``.
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

KINDS = ("resources_servers", "responses_api_agents", "responses_api_models")
PACKAGE = "nemo-gym"
# The wheel declares Requires-Python >=3.13.14. Its folders are pure Python and are only
# unpacked, so pip is told which interpreter to download for instead of refusing.
WHEEL_PYTHON_VERSION = "3.13.14"
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


def wheel_version_of(wheel_root: Path) -> str:
    """The version of an unpacked wheel (from its folder name)."""
    return wheel_root.name.removeprefix("nemo_gym-")


def module_source(root: Path, module: str) -> Path | None:
    """The source file of the dotted ``module`` in the tree at ``root`` (a wheel, a project):
    ``a/b.py`` or ``a/b/__init__.py``; None when neither is there."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def list_folders(wheel_root: Path, kinds: tuple[str, ...] | list[str] = KINDS) -> list[tuple[str, str]]:
    """Every server folder of the given kinds: ``(kind, name)``, sorted. A server folder holds an
    ``app.py``, or is a group of servers one level down sharing its ``requirements.txt``
    (NeMo Gym's ``responses_api_agents/conversational_tool_use``: an agent per stage)."""
    out = []
    for kind in kinds:
        base = wheel_root / kind
        if base.is_dir():
            out += [
                (kind, p.name)
                for p in sorted(base.iterdir())
                if (p / "app.py").is_file() or (p.is_dir() and any(p.glob("*/app.py")))
            ]
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


def wheel_metadata(wheel_root: Path) -> email.message.Message | None:
    """The unpacked wheel's ``METADATA`` (None when it has no ``dist-info``)."""
    dist_info = next(wheel_root.glob("nemo_gym-*.dist-info"), None)
    if dist_info is None:
        return None
    return email.parser.Parser().parsestr((dist_info / "METADATA").read_text(errors="replace"))
