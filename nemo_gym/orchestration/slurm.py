"""Submitting to Slurm and following what was submitted: submit, status, logs, cancel, resume.

Everything goes through Slurm's own clients (``sbatch``, ``squeue``, ``sacct`` when accounting
is there, ``scontrol``, ``scancel``) on this machine: ``gym eval submit`` runs where those
clients work (a login node). Submitting over SSH (``compute.hostname``) is refused with a
message rather than half supported.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from nemo_gym.collection.run_lock import lock_path
from nemo_gym.orchestration.api import SubmitConfig
from nemo_gym.orchestration.jobs import (
    RESOLVED_CONFIG_NAME,
    BenchmarkJob,
    SubmissionRecord,
    new_gym_job_id,
    new_record,
    utc_now,
)
from nemo_gym.orchestration.slurm_script import JOB_SCRIPT_NAME, RESULTS_NAME, build_sbatch_script
from nemo_gym.serving.secrets import redact


class SlurmError(RuntimeError):
    """A Slurm client failed or is missing; the message says which and what it printed."""


def _slurm(*argv: str, check: bool = True) -> str:
    if shutil.which(argv[0]) is None:
        raise SlurmError(
            f"{argv[0]} is not on PATH: run gym eval on a machine with Slurm's clients (a login node)"
        )
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SlurmError(
            f"{' '.join(argv)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}"
        )
    return done.stdout


def dry_run(config: SubmitConfig) -> str:
    """The batch script of every benchmark, as ``--dry-run`` prints it (nothing is written)."""
    run_dir = Path(config.job.output_path).resolve() / "<gym-job-id>"
    out = []
    for name in config.driver.benchmarks:
        out.append(f"# ===== benchmark {name}: {run_dir / name / JOB_SCRIPT_NAME}")
        out.append(build_sbatch_script(config, name, run_dir / name))
    return "\n".join(out)


def submit(config: SubmitConfig) -> SubmissionRecord:
    """Stage the run directory, sbatch each benchmark, save and return the record.

    One benchmark's failed sbatch does not stop the others: its entry carries the error.
    """
    if config.slurm.hostname is not None:
        raise SlurmError(
            f"compute.{config.cluster}.hostname is set ({config.slurm.hostname}): submitting over SSH is not "
            "supported here; run gym eval submit on that login node (hostname: null)"
        )
    now = utc_now()
    run_dir = Path(config.job.output_path).resolve() / new_gym_job_id(now)
    record = new_record(config.cluster, None, run_dir, now)
    run_dir.mkdir(parents=True)
    (run_dir / RESOLVED_CONFIG_NAME).write_text(
        yaml.safe_dump(redact(config.model_dump(mode="json")), sort_keys=False)
    )
    for name in config.driver.benchmarks:
        bench_dir = run_dir / name
        for sub in ("logs", "artifacts"):
            (bench_dir / sub).mkdir(parents=True)
        script = bench_dir / JOB_SCRIPT_NAME
        script.write_text(build_sbatch_script(config, name, bench_dir))
        script.chmod(0o700)
        job = BenchmarkJob(benchmark=name, job_dir=str(bench_dir))
        try:
            job.job_id = _sbatch(script)
        except SlurmError as exc:
            job.error = str(exc)
        record.benchmarks.append(job)
    record.save()
    return record


def _sbatch(script: Path) -> str:
    out = _slurm("sbatch", "--parsable", str(script)).strip()
    job_id = out.splitlines()[-1].split(";")[0] if out else ""
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered no job id: {out!r}")
    return job_id


@dataclass
class BenchmarkStatus:
    """Where one benchmark stands."""

    benchmark: str
    job_id: str | None
    state: str
    rollouts: int
    failures: int
    lock: bool

    def line(self) -> str:
        """One line for ``gym eval status``."""
        return (
            f"{self.benchmark:<20} job {self.job_id or '-':<8} {self.state:<12} "
            f"{self.rollouts} rollout(s), {self.failures} failure(s){'' if self.lock else ', no lock yet'}"
        )


def job_state(job_id: str) -> str:
    """Slurm's state of a job: from the queue, else from accounting or the controller's memory."""
    queued = _slurm("squeue", "-h", "-j", job_id, "-o", "%T", check=False).strip()
    if queued:
        return queued.splitlines()[0]
    shown = _slurm("scontrol", "show", "job", job_id, check=False)
    for token in shown.split():
        if token.startswith("JobState="):
            return token.split("=", 1)[1]
    if shutil.which("sacct"):
        acct = _slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", check=False).strip()
        if acct:
            return acct.splitlines()[0].split()[0]
    return "UNKNOWN"


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def status(record: SubmissionRecord) -> list[BenchmarkStatus]:
    """Each benchmark's job state and how many rollouts and failures its results hold."""
    out = []
    for bench in record.benchmarks:
        results = Path(bench.job_dir) / RESULTS_NAME
        failures = results.with_name("rollouts_failures.jsonl")
        state = job_state(bench.job_id) if bench.job_id else "NOT_SUBMITTED"
        out.append(
            BenchmarkStatus(
                bench.benchmark,
                bench.job_id,
                state,
                _count_lines(results),
                _count_lines(failures),
                lock_path(results).exists(),
            )
        )
    return out


def log_files(record: SubmissionRecord, benchmark: str | None = None, service: str = "driver") -> list[Path]:
    """The log files of a service (``driver``, ``job``, a service name) across the job's restarts."""
    files: list[Path] = []
    for bench in record.benchmarks:
        if benchmark is None or bench.benchmark == benchmark:
            files += sorted((Path(bench.job_dir) / "logs").glob(f"{service}-*.log"))
    return files


def cancel(record: SubmissionRecord, benchmark: str | None = None) -> list[str]:
    """``scancel`` each benchmark's current job; the ids cancelled."""
    ids = [
        b.job_id for b in record.benchmarks if b.job_id and (benchmark is None or b.benchmark == benchmark)
    ]
    if ids:
        _slurm("scancel", *ids)
    return [i for i in ids if i]


FINISHED_OK = {"COMPLETED"}
STILL_GOING = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}


def resume(record: SubmissionRecord, benchmark: str | None = None) -> list[BenchmarkJob]:
    """Submit again each benchmark whose job ended without completing (cancelled, failed, timed
    out, preempted, lost): the same script in the same directory, so the collection resumes from
    its own results and lock. Benchmarks still queued or running, or completed, are left alone."""
    resumed = []
    for bench in record.benchmarks:
        if benchmark is not None and bench.benchmark != benchmark:
            continue
        state = job_state(bench.job_id) if bench.job_id else "NOT_SUBMITTED"
        if state.split()[0].rstrip("+") in FINISHED_OK | STILL_GOING:
            continue
        new_id = _sbatch(Path(bench.job_dir) / JOB_SCRIPT_NAME)
        if bench.job_id:
            bench.previous_job_ids.append(bench.job_id)
        bench.job_id, bench.error = new_id, None
        resumed.append(bench)
    record.save()
    return resumed


def echo(text: str) -> None:
    """Print to stdout (commands' output)."""
    sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))
