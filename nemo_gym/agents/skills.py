"""Agent skills: a folder of skill folders an agent may use during a rollout (served at NeMo
Gym's path ``nemo_gym.skills``).

A skill is a folder holding ``SKILL.md`` (a ``---``-delimited YAML header with at least ``name``,
then markdown) and any files it refers to, as Claude Code and Codex CLI read them. A run names
one folder of skills (``skills.path``); agents copy it where their CLI looks (``stage_skills``)
and rollouts carry a ``skills_ref`` (``load_skill_directory``): the path, a content hash and
each skill's header, so results of two versions of a skill at one path stay apart. The
collector stamps that ``skills_ref`` on every row when a run names ``+skills.path=...``.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

from nemo_gym import _resolve_under_cwd_or_install

SKILL_MD_FILENAME = "SKILL.md"
# Short enough to read in a table, long enough (48 bits) never to collide within one experiment.
_HASH_HEX_CHARS = 12


class SkillMetadata(BaseModel):
    """One skill's header: ``name`` (required), ``description``, and ``metadata.version``."""

    name: str
    description: str | None = None
    version: str | None = None


class SkillsRef(BaseModel):
    """What a rollout records about the skills it ran with: ``path`` as configured, ``hash`` of
    the folder's contents, and each skill's header."""

    path: str
    hash: str
    skills: list[SkillMetadata]


class SkillsConfig(BaseModel):
    """The run-level ``skills`` block: ``path`` is a folder of skill folders."""

    path: str = Field(description="Folder holding one folder per skill, each with a SKILL.md.")


def hash_skill_dir(root: Path) -> str:
    """A short sha256 (12 hex digits) of every file under ``root``: relative path and bytes, in
    sorted path order, so renaming, adding or editing any file changes it."""
    digest = hashlib.sha256()
    files = sorted(
        (p for p in Path(root).rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix()
    )
    for file in files:
        # A NUL after each part keeps ("ab", "c") and ("a", "bc") apart.
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()[:_HASH_HEX_CHARS]


def parse_skill_md(skill_md_path: Path) -> SkillMetadata:
    """Read ``SKILL.md``'s YAML header; ``ValueError`` naming the file when it has none, is not
    closed, is not a mapping, is bad YAML or has no ``name``."""
    path = Path(skill_md_path)
    # utf-8-sig: a byte-order mark is tolerated, as Claude Code tolerates it.
    lines = path.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    if not lines or lines[0].strip() != "---":
        raise ValueError(
            f"{path}: a skill file must start with a '---' line opening its YAML header (name, description)"
        )
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise ValueError(f"{path}: the YAML header opened by '---' is never closed by another '---' line")
    try:
        header = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: the YAML header does not parse: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the YAML header must be a mapping, not {type(header).__name__}")
    if not header.get("name"):
        raise ValueError(f"{path}: the YAML header has no 'name'")
    # The Agent Skills format keeps a version under `metadata:`, not at the top level.
    extra = header.get("metadata")
    version = extra.get("version") if isinstance(extra, dict) else None
    description = header.get("description")
    return SkillMetadata(
        name=str(header["name"]),
        description=None if description is None else str(description),
        version=None if version is None else str(version),
    )


def _skills_folder(path: str, purpose: str) -> Path:
    resolved = _resolve_under_cwd_or_install(path)
    if not resolved.exists():
        raise ValueError(f"skills.path={path!r}: {resolved} does not exist ({purpose})")
    if not resolved.is_dir():
        raise ValueError(
            f"skills.path={path!r}: {resolved} is a file; it must be a folder of skill folders ({purpose})"
        )
    return resolved


def load_skill_directory(path: str) -> SkillsRef:
    """The ``SkillsRef`` of the folder of skills at ``path`` (resolved like input paths:
    ``NEMO_GYM_EXTRA_ROOTS``, the working directory, the project root). ``ValueError`` when the
    folder is missing, empty, or holds a folder without a valid ``SKILL.md``."""
    root = _skills_folder(path, "loading skills")
    skills = []
    for skill_dir in sorted(d for d in root.iterdir() if d.is_dir()):
        skill_md = skill_dir / SKILL_MD_FILENAME
        if not skill_md.is_file():
            raise ValueError(f"skill folder {skill_dir} has no {SKILL_MD_FILENAME}")
        skills.append(parse_skill_md(skill_md))
    if not skills:
        raise ValueError(
            f"skills.path={path!r}: {root} holds no skill folders (each a folder with a {SKILL_MD_FILENAME})"
        )
    return SkillsRef(path=path, hash=hash_skill_dir(root), skills=skills)


def stage_skills(path: str, dest_skills_dir: Path) -> None:
    """Copy the folder of skills at ``path`` to ``dest_skills_dir`` (which must not exist yet),
    where an agent CLI discovers skills (``<CLAUDE_CONFIG_DIR>/skills``, ``<CODEX_HOME>/skills``).
    ``ValueError`` when ``path`` is not a folder on this machine."""
    root = _skills_folder(path, "staging skills; a distributed run needs it on storage every agent sees")
    shutil.copytree(root, Path(dest_skills_dir))
