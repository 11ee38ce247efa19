"""The Slurm path against a local run: start-up time and throughput of the same collection.

Runs N rollouts of the example environment on the scripted model three ways and prints one JSON
object: ``gym eval run`` on this machine (local child processes), and ``gym eval submit`` on a
real two-node Slurm cluster started here (one network namespace per node; see
``nemo_gym.testing.slurm_cluster``) with the stack placed on a Ray service over both nodes.
For each: seconds from the command to the first rollout on disk (start-up: for Slurm this
includes scheduling, starting Ray on both nodes and the stack), to the last, and the steady
rollouts/s in between. Needs root and Debian's Slurm packages.

    python scripts/bench_slurm.py --rollouts 2000 --parallel 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from nemo_gym.testing.slurm_cluster import start_cluster, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
GYM = str(Path(sys.executable).parent / "gym")
ENV = "example_single_tool_call"
RUN = {
    "config_paths": [
        f"resources_servers/{ENV}/configs/{ENV}.yaml",
        "responses_api_models/scripted_model/configs/scripted_model.yaml",
    ],
    "agent_name": f"{ENV}_simple_agent",
    "input_jsonl_fpath": f"resources_servers/{ENV}/data/example.jsonl",
    "disable_aggregation": True,
}


def _lines(path: Path) -> int:
    return sum(1 for _ in path.open("rb")) if path.exists() else 0


def _watch(results: Path, total: int, started: float, done: object, timeout_s: float) -> dict[str, float]:
    """Poll the results file: times of the first and last rollout after ``started``."""
    first = None
    end = started + timeout_s
    while time.monotonic() < end:
        n = _lines(results)
        now = time.monotonic()
        if n and first is None:
            first = now
        if n >= total:
            assert first is not None
            return {
                "to_first_rollout_s": round(first - started, 2),
                "to_last_rollout_s": round(now - started, 2),
                "rollouts_per_s_after_first": round((n - 1) / max(now - first, 1e-9), 1),
            }
        if callable(done) and done():
            break
        time.sleep(0.05)
    raise SystemExit(f"{results}: {_lines(results)}/{total} rollouts before the run ended")


def bench_local(tmp: Path, repeats: int, parallel: int) -> dict[str, float]:
    out = tmp / "local.jsonl"
    args = [f"+{k}=[{','.join(v)}]" if isinstance(v, list) else f"+{k}={v}" for k, v in RUN.items()]
    args += [f"+output_jsonl_fpath={out}", f"+num_repeats={repeats}", f"+num_samples_in_parallel={parallel}"]
    started = time.monotonic()
    proc = subprocess.Popen(
        [GYM, "eval", "run", *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    result = _watch(out, 5 * repeats, started, lambda: proc.poll() is not None, 600)
    proc.wait(60)
    return result


def bench_slurm(tmp: Path, repeats: int, parallel: int) -> dict[str, float]:
    cluster = start_cluster(tmp / "slurm", nodes=2, tag="ngbench")
    try:
        config = {
            "services": {"gym_ray": {"type": "ray", "node_pools": ["cpu"], "num_cpus": 2}},
            "compute": {
                "local": {
                    "type": "slurm",
                    "account": "bench",
                    "node_pools": {"cpu": {"partition": "debug", "nodes": 2}},
                }
            },
            "driver": {
                "benchmarks": {
                    "b": {"run": {**RUN, "num_repeats": repeats, "num_samples_in_parallel": parallel}}
                }
            },
            "job": {"output_path": str(tmp / "runs")},
        }
        path = tmp / "submit.yaml"
        path.write_text(yaml.safe_dump(config))
        started = time.monotonic()
        subprocess.run(
            [GYM, "eval", "submit", "--config", str(path)], check=True, env=cluster.env, capture_output=True
        )
        (bench_dir,) = (tmp / "runs").glob("gym-job-*/b")

        def job_ended() -> bool:
            queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=cluster.env).stdout
            return not queue.strip()

        try:
            return _watch(bench_dir / "artifacts/rollouts.jsonl", 5 * repeats, started, job_ended, 600)
        except SystemExit:
            for log in sorted((bench_dir / "logs").glob("*.log")):
                print(f"==> {log.name}\n" + "\n".join(log.read_text().splitlines()[-20:]), file=sys.stderr)
            raise
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=2000, help="total rollouts (5 rows x repeats)")
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    repeats = max(1, args.rollouts // 5)
    with tempfile.TemporaryDirectory(prefix="bench_slurm_") as tmp:
        report = {
            "rollouts": 5 * repeats,
            "parallel": args.parallel,
            "load_average": os.getloadavg()[0],
            "local": bench_local(Path(tmp), repeats, args.parallel),
            "slurm_two_nodes_ray": bench_slurm(Path(tmp), repeats, args.parallel),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
