"""The reproducibility lock: what a collection was made from, checked again on resume.

A run's lock (``x_lock.json`` beside ``x.jsonl``) records content hashes of every server folder
the stack runs (environment, agent and model folders, file by file), of the input data file, of
the merged config (secrets redacted), this package's version, and the policy model's name and
revision. A resume (``+resume_from_cache=true``) recomputes it and refuses to mix rollouts made
from different things: the refusal names each item that differs (down to the file in a folder),
unless ``+force_resume=true``, which records the override in the lock's history.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from nemo_gym import __version__
from nemo_gym.launch.config import ConfigError, project_root

LOCK_VERSION = 1
SERVER_KINDS = ("resources_servers", "responses_api_agents", "responses_api_models")
# Keys that name the policy model and its revision, wherever they sit in the config.
MODEL_KEYS = ("policy_model_name", "model_name", "model", "model_path", "revision", "model_revision")
MAX_LINE_DIGESTS = 200_000  # beyond this many lines, any change to the data file is a difference
_MALFORMED = "0" * 16
_SKIPPED_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git", ".venv", "results"}


def lock_path(output: str | os.PathLike[str]) -> Path:
    """``x.jsonl`` → ``x_lock.json``."""
    path = Path(output)
    stem = path.name[: -len(".jsonl")] if path.name.endswith(".jsonl") else path.name
    return path.with_name(f"{stem}_lock.json")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_manifest(folder: Path) -> dict[str, str]:
    """Relative path → sha256 of every file under ``folder`` (caches and results left out)."""
    manifest: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not _SKIPPED_PARTS.intersection(rel.parts) and path.suffix != ".pyc":
            manifest[rel.as_posix()] = _sha256_file(path)
    return manifest


def server_folders(config: Mapping[str, Any], root: Path | None = None) -> list[str]:
    """``kind/impl`` of every server instance in a merged config whose folder exists here."""
    base = root or project_root()
    found: set[str] = set()
    for block in config.values():
        if not isinstance(block, Mapping):
            continue
        for kind, impls in block.items():
            if kind in SERVER_KINDS and isinstance(impls, Mapping):
                found.update(f"{kind}/{impl}" for impl in impls if (base / kind / str(impl)).is_dir())
    return sorted(found)


def _model_identity(config: Mapping[str, Any]) -> dict[str, str]:
    """Every model-naming key of the config, by its dotted path (``policy_model....model``)."""
    out: dict[str, str] = {}

    def walk(value: Any, prefix: str) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                path = f"{prefix}.{key}" if prefix else str(key)
                if key in MODEL_KEYS and isinstance(item, str | int | float):
                    out[path] = str(item)
                else:
                    walk(item, path)

    walk(config, "")
    return out


@dataclass
class RunLock:
    """What one collection was made from (see the module docstring)."""

    folders: dict[str, dict[str, str]]
    data_file: dict[str, str]
    config_sha256: str
    package_version: str
    model: dict[str, str]

    @classmethod
    def compute(
        cls, config: Mapping[str, Any], input_jsonl: str | os.PathLike[str] | None, root: Path | None = None
    ) -> RunLock:
        """The lock of ``config`` (the merged, redacted config) run over ``input_jsonl``."""
        base = root or project_root()
        folders = {name: folder_manifest(base / name) for name in server_folders(config, base)}
        data: dict[str, str] = {}
        if input_jsonl is not None and Path(input_jsonl).is_file():
            data = data_file_identity(Path(input_jsonl))
        config_hash = hashlib.sha256(orjson.dumps(_stable(config), option=orjson.OPT_SORT_KEYS)).hexdigest()
        return cls(folders, data, config_hash, __version__, _model_identity(config))

    def to_json(self) -> dict[str, Any]:
        """The on-disk form (``lock_version`` first)."""
        return {
            "lock_version": LOCK_VERSION,
            "package_version": self.package_version,
            "model": self.model,
            "data_file": self.data_file,
            "config_sha256": self.config_sha256,
            "folders": self.folders,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunLock:
        """Read a lock written by :meth:`to_json`."""
        return cls(
            folders={str(k): dict(v) for k, v in dict(data.get("folders") or {}).items()},
            data_file=dict(data.get("data_file") or {}),
            config_sha256=str(data.get("config_sha256", "")),
            package_version=str(data.get("package_version", "")),
            model=dict(data.get("model") or {}),
        )

    def differences(self, other: RunLock) -> list[str]:
        """What differs between this (the recorded lock) and ``other`` (now), one line per item."""
        diffs: list[str] = []
        for name in sorted(set(self.folders) | set(other.folders)):
            before, after = self.folders.get(name), other.folders.get(name)
            if before is None or after is None:
                diffs.append(f"folder {name}: {'added' if before is None else 'no longer in the config'}")
                continue
            for rel in sorted(set(before) | set(after)):
                if before.get(rel) != after.get(rel):
                    change = "added" if rel not in before else "removed" if rel not in after else "changed"
                    diffs.append(f"file {name}/{rel}: {change}")
        diffs += _data_file_differences(self.data_file, other.data_file)
        if self.config_sha256 != other.config_sha256:
            diffs.append("merged config: changed (ng_dump_config shows it)")
        if self.package_version != other.package_version:
            diffs.append(f"nemo_gym version: {self.package_version} -> {other.package_version}")
        for key in sorted(set(self.model) | set(other.model)):
            if self.model.get(key) != other.model.get(key):
                diffs.append(f"model {key}: {self.model.get(key)!r} -> {other.model.get(key)!r}")
        return diffs


def data_file_identity(path: Path) -> dict[str, str]:
    """The data file's path, sha256 and (up to :data:`MAX_LINE_DIGESTS` lines) one short digest per
    line, all zeros for a line that is not a JSON object (a malformed line collects nothing, so
    fixing it later is not a change to what was collected)."""
    whole = hashlib.sha256()
    digests: list[str] = []
    with path.open("rb") as handle:
        for line in handle:
            whole.update(line)
            if len(digests) <= MAX_LINE_DIGESTS:
                digests.append(_line_digest(line))
    out = {"path": str(path.resolve()), "sha256": whole.hexdigest()}
    if len(digests) <= MAX_LINE_DIGESTS:
        out["line_digests"] = "".join(digests)
    return out


def _line_digest(line: bytes) -> str:
    try:
        valid = isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        valid = False
    return hashlib.blake2b(line.strip(), digest_size=8).hexdigest() if valid else _MALFORMED


def _data_file_differences(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """Lines that held a row and now hold something else, or are gone. Appended lines and fixed
    malformed lines are not differences: a resume collects them as new rows."""
    if before.get("sha256") == after.get("sha256"):
        return []
    name = after.get("path") or before.get("path")
    old, new = before.get("line_digests"), after.get("line_digests")
    if old is None or new is None:
        return [f"data file {name}: changed"]
    width = len(_MALFORMED)
    diffs: list[str] = []
    for index in range(0, len(old), width):
        was, now = old[index : index + width], new[index : index + width]
        if was != _MALFORMED and was != now:
            diffs.append(f"data file {name} line {index // width + 1}: {'changed' if now else 'removed'}")
    return diffs


def _stable(value: Any) -> Any:
    """The config without what changes from one start to the next (ports, hosts, pids)."""
    if isinstance(value, Mapping):
        return {
            str(k): _stable(v)
            for k, v in value.items()
            if str(k) not in {"port", "host", "pid", "head_server", "_ng_launch", "ray_head_node_address"}
        }
    if isinstance(value, list | tuple):
        return [_stable(v) for v in value]
    return value


def check_or_write_lock(
    output: str | os.PathLike[str],
    lock: RunLock,
    *,
    resume: bool,
    force: bool = False,
    warn: Any = None,
) -> Path:
    """Write the lock of a new run, or check a resumed run against the one it recorded.

    Raises :class:`ConfigError` naming every difference when a resume's lock differs and
    ``force`` is false. A forced resume keeps the first lock and appends the override to
    ``overrides`` in the file, so the record says the run was mixed.
    """
    path = lock_path(output)
    if resume and path.exists():
        recorded_raw = orjson.loads(path.read_bytes())
        diffs = RunLock.from_json(recorded_raw).differences(lock)
        if diffs and not force:
            shown = "\n  ".join(diffs[:20]) + (
                f"\n  ... and {len(diffs) - 20} more" if len(diffs) > 20 else ""
            )
            raise ConfigError(
                f"refusing to resume {output}: it was collected from something else ({path}):\n  {shown}\n"
                "Restore what changed, write to a new +output_jsonl_fpath, or pass +force_resume=true "
                "to mix rollouts made from both (the lock then records the override)."
            )
        if diffs:
            recorded_raw.setdefault("overrides", []).append({"forced_resume_differences": diffs})
            _write(path, recorded_raw)
            if warn is not None:
                warn(f"resuming despite {len(diffs)} difference(s) from the run's lock (+force_resume=true)")
        return path
    _write(path, lock.to_json())
    return path


def _write(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    os.replace(tmp, path)
