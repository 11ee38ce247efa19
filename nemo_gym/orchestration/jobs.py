"""The record a submission leaves: ``gym-job.json`` in its run directory and a copy in this
machine's job index, in NeMo Gym 0.7.0's ``SubmissionRecord`` shape (schema version 1).

A record is read by any later Gym: fields are only ever added with a default, and a reader
refuses only a record written with a newer schema than it knows.
"""

from __future__ import annotations

import getpass
import os
import secrets
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel

from nemo_gym import __version__
from nemo_gym.launch.config import project_root

SCHEMA_VERSION = 1
MANIFEST_NAME = "gym-job.json"
RESOLVED_CONFIG_NAME = "resolved-config.yaml"


class BenchmarkJob(BaseModel):
    """One benchmark's Slurm job. ``job_id`` None: sbatch failed, and ``error`` says why."""

    benchmark: str
    job_dir: str
    job_id: str | None = None
    error: str | None = None
    previous_job_ids: list[str] = []
    """Jobs this benchmark ran as before a ``gym eval resume`` (oldest first)."""


class SubmissionRecord(BaseModel):
    """Everything needed to find a submission again (status, logs, cancel, resume)."""

    gym_job_id: str
    gym_version: str
    gym_commit: str | None = None
    submitted_at: str
    run_dir: str
    cluster: str
    executor: str
    submitted_by: str
    benchmarks: list[BenchmarkJob]
    hostname: str | None = None
    executor_metadata: dict[str, str] = {}
    schema_version: int = SCHEMA_VERSION

    @property
    def failed(self) -> list[BenchmarkJob]:
        """Benchmarks whose sbatch failed."""
        return [b for b in self.benchmarks if b.job_id is None]

    def dumps(self) -> str:
        """The manifest's bytes."""
        return self.model_dump_json(indent=2) + "\n"

    def save(self) -> Path:
        """Write the manifest into the run directory and the local index; the manifest's path."""
        path = Path(self.run_dir) / MANIFEST_NAME
        _write_atomic(path, self.dumps())
        try:
            _write_atomic(local_index_dir() / f"{self.gym_job_id}.json", self.dumps())
        except OSError:
            pass  # the index is a convenience; the run directory holds the record
        return path

    @classmethod
    def load(cls, payload: dict) -> SubmissionRecord:
        """Parse a record; one written by a newer Gym (schema) is refused, saying so."""
        version = payload.get("schema_version")
        if not isinstance(version, int):
            raise ValueError(f"not a gym eval submit record (schema_version {version!r})")
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"record schema_version {version} is newer than this Gym's {SCHEMA_VERSION}: upgrade"
            )
        return cls.model_validate(payload)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def find_record(ref: str) -> SubmissionRecord:
    """A record by gym job id (this machine's index), run directory or manifest path."""
    import orjson

    candidates = [Path(ref), Path(ref) / MANIFEST_NAME, local_index_dir() / f"{ref}.json"]
    for path in candidates:
        if path.is_file():
            record = SubmissionRecord.load(orjson.loads(path.read_bytes()))
            durable = Path(record.run_dir) / MANIFEST_NAME  # the run directory's copy is the newest
            if durable.is_file() and durable != path:
                record = SubmissionRecord.load(orjson.loads(durable.read_bytes()))
            return record
    known = sorted(p.stem for p in local_index_dir().glob("gym-job-*.json"))[-5:]
    raise ValueError(
        f"no submission {ref!r}: not a run directory, manifest or gym job id of this machine"
        + (f" (recent: {', '.join(known)})" if known else "")
    )


def installed_gym_commit() -> str | None:
    """The git commit of this checkout (``-dirty`` with uncommitted changes), or None."""
    root = project_root()
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def utc_now() -> datetime:
    """Now, in UTC (the run directory's clock)."""
    return datetime.now(UTC)


def new_gym_job_id(now: datetime) -> str:
    """A submission's id and run directory name: time plus a random suffix (two submits in one
    second never share a directory)."""
    return f"gym-job-{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def local_index_dir() -> Path:
    """Where this machine remembers its submissions."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nemo-gym" / "jobs"


def new_record(config_cluster: str, hostname: str | None, run_dir: Path, now: datetime) -> SubmissionRecord:
    """An empty record for a submission made now (benchmarks are added as they are queued)."""
    return SubmissionRecord(
        gym_job_id=run_dir.name,
        gym_version=__version__,
        gym_commit=installed_gym_commit(),
        submitted_at=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        run_dir=str(run_dir),
        cluster=config_cluster,
        executor="slurm",
        submitted_by=getpass.getuser(),
        benchmarks=[],
        hostname=hostname,
    )
