"""Fault-scale benchmark: 10,000 rollouts at concurrency 2,048, the collector killed with
SIGKILL mid-run and resumed, at this machine's default open-file limit and under
``ulimit -n 1024``. Prints lost / duplicated / misscored counts and the failures by class.

A rollout is *lost* when it is in neither the results nor the failures file at the end,
*duplicated* when its (task, rollout) key is in the results more than once, *misscored* when
its reward is not the one the scripted model earns (1.0) or a failure row was also scored.

    python scripts/bench_fault_scale.py                 # both fd limits, writes docs/bench_fault_scale.json
    python scripts/bench_fault_scale.py --rows 500      # a quicker run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ENV = "resources_servers/example_single_tool_call"
CONFIGS = [
    f"{ENV}/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"
REPEATS = 4


def scenario(rows: int, parallel: int, fd_limit: int | None, kill_at: float) -> dict[str, Any]:
    """One run in this process (its fd limit applies to the whole stack it starts)."""
    from nemo_gym.collection.collection_io import CollectionPaths
    from nemo_gym.testing import collector_argv, distinct_example_rows, running_stack, write_jsonl

    if fd_limit is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    work = Path(tempfile.mkdtemp(prefix="ng_bench_fault_"))
    source = work / "in.jsonl"
    write_jsonl(source, distinct_example_rows(ENV, rows))
    out = work / "x.jsonl"
    total = rows * REPEATS
    report: dict[str, Any] = {
        "fd_limit": {"soft": soft, "hard": hard},
        "rollouts": total,
        "parallel": parallel,
    }
    with running_stack(CONFIGS) as stack:
        argv = collector_argv(
            stack.head_server_config["port"],
            AGENT,
            source,
            out,
            f"+num_repeats={REPEATS}",
            f"+num_samples_in_parallel={parallel}",
            "+progress_interval_s=600",
        )
        started = time.monotonic()
        first = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        killed_after = None
        while first.poll() is None:
            done = len(out.read_bytes().splitlines()) if out.exists() else 0
            if done >= kill_at * total:
                first.send_signal(signal.SIGKILL)
                killed_after = done
                break
            time.sleep(0.05)
        first.wait()
        resumed = subprocess.run(
            [*argv, "+resume_from_cache=true"], cwd=ROOT, capture_output=True, text=True, check=False
        )
        report["wall_s"] = round(time.monotonic() - started, 1)
        report["collector_killed_after_rows"] = killed_after
        report["resume_exit_status"] = resumed.returncode
        if resumed.returncode not in (0, 3):
            report["resume_stderr_tail"] = resumed.stderr[-2000:]
    keys: dict[tuple[int, int], int] = {}
    misscored = 0
    for line in out.read_bytes().splitlines():
        row = orjson.loads(line)
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        keys[key] = keys.get(key, 0) + 1
        misscored += row.get("reward") != 1.0
    failures: dict[str, int] = {}
    failed_keys = set()
    failures_path = CollectionPaths.for_output(out).failures
    if failures_path.exists():
        for line in failures_path.read_bytes().splitlines():
            record = orjson.loads(line)
            failed_keys.add((record.get("_ng_task_index"), record.get("_ng_rollout_index")))
            cls = record.get("_ng_failure_class", "?")
            failures[cls] = failures.get(cls, 0) + 1
    expected = {(t, r) for t in range(rows) for r in range(REPEATS)}
    report.update(
        results=sum(keys.values()),
        lost=len(expected - set(keys) - failed_keys),
        duplicated=sum(n - 1 for n in keys.values() if n > 1),
        misscored=misscored + len(failed_keys & set(keys)),
        failures_by_class=failures,
        rollouts_per_s=round(total / report["wall_s"], 1),
    )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2500, help=f"input rows (x{REPEATS} repeats)")
    parser.add_argument("--parallel", type=int, default=2048)
    parser.add_argument(
        "--kill-at", type=float, default=0.3, help="kill the collector after this share of rows"
    )
    parser.add_argument(
        "--fd-limit", default="both", help="'default', a number, or 'both' (default and 1024)"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # run a single scenario here
    parser.add_argument("--output", default=str(ROOT / "docs" / "bench_fault_scale.json"))
    args = parser.parse_args()
    if args.one:
        limit = None if args.fd_limit == "default" else int(args.fd_limit)
        print(json.dumps(scenario(args.rows, args.parallel, limit, args.kill_at)))
        return
    limits = ["default", "1024"] if args.fd_limit == "both" else [args.fd_limit]
    reports = []
    for limit in limits:
        # Each scenario in its own process: a lowered hard limit cannot be raised again.
        done = subprocess.run(
            [sys.executable, __file__, "--one", "--rows", str(args.rows), "--parallel", str(args.parallel),
             "--kill-at", str(args.kill_at), "--fd-limit", limit],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            sys.exit(f"scenario fd_limit={limit} failed:\n{done.stderr[-4000:]}")
        report = json.loads(done.stdout.strip().splitlines()[-1])
        reports.append(report)
        print(
            f"fd limit {report['fd_limit']['soft']}: {report['rollouts']} rollouts at concurrency "
            f"{report['parallel']}, collector killed after {report['collector_killed_after_rows']} rows and "
            f"resumed: lost {report['lost']}, duplicated {report['duplicated']}, misscored "
            f"{report['misscored']}, failed {sum(report['failures_by_class'].values())} "
            f"{report['failures_by_class']}, {report['wall_s']} s ({report['rollouts_per_s']}/s)",
            flush=True,
        )
    Path(args.output).write_text(
        json.dumps({"machine": f"{os.cpu_count()} cores, shared with other work", "runs": reports}, indent=2)
        + "\n"
    )


if __name__ == "__main__":
    main()
