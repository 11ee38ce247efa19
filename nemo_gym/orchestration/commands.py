"""``gym eval submit|status|logs|cancel|resume``: submit a collection to Slurm and follow it."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import ValidationError

from nemo_gym.orchestration import slurm
from nemo_gym.orchestration.api import SubmitConfig
from nemo_gym.orchestration.jobs import SubmissionRecord, find_record


class SubmitConfigError(ValueError):
    """The submit config cannot be read or is invalid; the message names the file and fields."""


def load_submit_config(path: str, overrides: Sequence[str] = ()) -> SubmitConfig:
    """Read a submit config: the YAML file, ``key=value`` overrides (dotted keys), ``${...}``
    interpolation; root keys starting with ``_`` are scratch space (dropped after resolving)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    file = Path(path)
    if not file.is_file():
        raise SubmitConfigError(
            f"submit config {file} {'is a directory' if file.is_dir() else 'was not found'}"
        )
    try:
        base = OmegaConf.create(yaml.safe_load(file.read_text()) or {})
        cleaned = [o.lstrip("+") for o in overrides]
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(cleaned)) if cleaned else base
        data: Any = OmegaConf.to_container(merged, resolve=True)
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        raise SubmitConfigError(f"submit config {file}: {exc}") from exc
    data = {k: v for k, v in data.items() if not str(k).startswith("_")}
    try:
        return SubmitConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()
        )
        raise SubmitConfigError(f"submit config {file} is invalid: {problems}") from exc


def _parser(prog: str, doc: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def _run(main: Any, argv: Sequence[str] | None) -> None:
    try:
        code = main(list(sys.argv[1:] if argv is None else argv))
    except (SubmitConfigError, slurm.SlurmError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        code = 2
    sys.exit(code)


def _submit(argv: list[str]) -> int:
    p = _parser(
        "gym eval submit",
        "Submit a collection to Slurm: one job per benchmark, services and the stack spread over the\n"
        "allocation, results in job.output_path/<gym-job-id>/<benchmark>/artifacts/.\n\n"
        "example: gym eval submit --config submit.yaml driver.benchmarks.b1.run.limit=10",
    )
    p.add_argument("--config", "-c", required=True, metavar="PATH", help="submit config YAML")
    p.add_argument(
        "--dry-run", action="store_true", help="print each benchmark's batch script; submit nothing"
    )
    p.add_argument("--resolve-only", action="store_true", help="print the validated config and stop")
    p.add_argument("--json", action="store_true", help="print the record (or the config) as JSON")
    args, overrides = p.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        p.error(f"unknown option(s) {unknown}")
    config = load_submit_config(args.config, overrides)
    if args.resolve_only:
        dumped = config.model_dump(mode="json")
        print(
            orjson.dumps(dumped, option=orjson.OPT_INDENT_2).decode() if args.json else yaml.safe_dump(dumped)
        )
        return 0
    if args.dry_run:
        print(slurm.dry_run(config))
        return 0
    record = slurm.submit(config)
    if args.json:
        print(record.dumps(), end="")
    else:
        print(f"run directory: {record.run_dir}")
        for bench in record.benchmarks:
            print(
                f"  {bench.benchmark}: "
                + (f"Slurm job {bench.job_id}" if bench.job_id else f"FAILED: {bench.error}")
            )
        print(f"follow it: gym eval status {record.gym_job_id}  |  gym eval logs {record.gym_job_id}")
    return 1 if record.failed else 0


def _record_args(
    prog: str, doc: str, argv: list[str], extra: Any = None
) -> tuple[argparse.Namespace, SubmissionRecord]:
    p = _parser(prog, doc)
    p.add_argument("job", help="gym job id, run directory or gym-job.json")
    p.add_argument("--benchmark", "-b", help="only this benchmark")
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    return args, find_record(args.job)


def _status(argv: list[str]) -> int:
    def more(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="as JSON")
        p.add_argument(
            "--wait", type=float, default=0, metavar="S", help="poll until no job is queued or running"
        )

    args, record = _record_args(
        "gym eval status", "Each benchmark's Slurm job state and progress.", argv, more
    )
    deadline = time.monotonic() + args.wait
    while True:
        rows = [s for s in slurm.status(record) if args.benchmark in (None, s.benchmark)]
        going = [s for s in rows if s.state.split()[0] in slurm.STILL_GOING]
        if not going or time.monotonic() >= deadline:
            break
        time.sleep(2)
    if args.json:
        print(orjson.dumps([s.__dict__ for s in rows], option=orjson.OPT_INDENT_2).decode())
    else:
        print(f"{record.gym_job_id} ({record.run_dir})")
        for s in rows:
            print("  " + s.line())
    return 0


def _logs(argv: list[str]) -> int:
    def more(p: argparse.ArgumentParser) -> None:
        p.add_argument("--service", default="driver", help="driver (default), job, or a service's name")
        p.add_argument("--tail", type=int, default=50, help="last N lines of each file (0: all)")

    args, record = _record_args("gym eval logs", "Print a benchmark's logs (every restart's).", argv, more)
    files = slurm.log_files(record, args.benchmark, args.service)
    if not files:
        print(f"no {args.service} logs yet under {record.run_dir}/*/logs", file=sys.stderr)
        return 1
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        print(f"==> {path} <==")
        print("\n".join(lines[-args.tail :] if args.tail else lines))
    return 0


def _cancel(argv: list[str]) -> int:
    args, record = _record_args("gym eval cancel", "scancel a submission's jobs.", argv)
    ids = slurm.cancel(record, args.benchmark)
    print(f"cancelled Slurm job(s) {', '.join(ids)}" if ids else "nothing to cancel")
    return 0


def _resume(argv: list[str]) -> int:
    args, record = _record_args(
        "gym eval resume",
        "Submit again what ended without completing; the collection resumes from its results and\n"
        "refuses if the environment, data or config changed since (its lock names what).",
        argv,
    )
    resumed = slurm.resume(record, args.benchmark)
    for bench in resumed:
        print(f"{bench.benchmark}: Slurm job {bench.job_id} (after {', '.join(bench.previous_job_ids)})")
    if not resumed:
        print("nothing to resume: every benchmark is queued, running or completed")
    return 0


def eval_submit(argv: Sequence[str] | None = None) -> None:
    """``gym eval submit``."""
    _run(_submit, argv)


def eval_status(argv: Sequence[str] | None = None) -> None:
    """``gym eval status``."""
    _run(_status, argv)


def eval_logs(argv: Sequence[str] | None = None) -> None:
    """``gym eval logs``."""
    _run(_logs, argv)


def eval_cancel(argv: Sequence[str] | None = None) -> None:
    """``gym eval cancel``."""
    _run(_cancel, argv)


def eval_resume(argv: Sequence[str] | None = None) -> None:
    """``gym eval resume``."""
    _run(_resume, argv)
