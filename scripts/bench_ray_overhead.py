"""Benchmark: what placing servers through Ray costs on one machine, against local child processes.

Usage: python scripts/bench_ray_overhead.py [--rows 2000] [--concurrency 64] [--repeats 3]

The stack is example_single_tool_call + its simple_agent + the scripted model. For each backend
it prints the start-up time (StackHandle.start until every server is healthy) and the rollouts/s
of ``ng_collect_rollouts`` over ``--rows`` rows; the best of ``--repeats`` runs. The Ray side
starts a one-node Ray cluster on 127.0.0.1 first (not counted in the start-up time: a trainer's
cluster already runs).
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nemo_gym.launch.config import load_config  # noqa: E402
from nemo_gym.launch.launcher import StackHandle  # noqa: E402

ENV = "resources_servers/example_single_tool_call"
CONFIGS = f"+config_paths=[{ENV}/configs/example_single_tool_call.yaml,responses_api_models/scripted_model/configs/scripted_model.yaml]"
AGENT = "example_single_tool_call_simple_agent"


def write_rows(path: Path, count: int) -> None:
    template = json.loads((ROOT / ENV / "data" / "example.jsonl").read_text().splitlines()[0])
    with path.open("w") as out:
        for i in range(count):
            template["responses_create_params"]["input"][-1]["content"] = f"Weather in city {i}?"
            out.write(json.dumps(template) + "\n")


def one_run(backend: Any, rows: Path, count: int, concurrency: int, workdir: Path) -> tuple[float, float]:
    config = load_config([CONFIGS, "++head_server.port=0"])
    started = time.perf_counter()
    handle = StackHandle.start(config, backend=backend) if backend else StackHandle.start(config)
    startup = time.perf_counter() - started
    try:
        out = workdir / f"out-{time.monotonic_ns()}.jsonl"
        began = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "nemo_gym.rollout_collection",
                f"++head_server.port={handle.head_server_config['port']}",
                f"+agent_name={AGENT}",
                f"+input_jsonl_fpath={rows}",
                f"+output_jsonl_fpath={out}",
                f"+num_samples_in_parallel={concurrency}",
            ],
            cwd=ROOT,
            capture_output=True,
            timeout=600,
        )
        elapsed = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(done.stdout.decode()[-2000:])
    finally:
        handle.stop()
    return startup, count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    from nemo_gym.launch.ray_backend import RayBackend

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        rows = workdir / "rows.jsonl"
        write_rows(rows, args.rows)
        results: dict[str, list[tuple[float, float]]] = {"local": [], "ray": []}
        for _ in range(args.repeats):
            results["local"].append(one_run(None, rows, args.rows, args.concurrency, workdir))
        ray.init(num_cpus=8, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
        try:
            for _ in range(args.repeats):
                results["ray"].append(one_run(RayBackend(), rows, args.rows, args.concurrency, workdir))
        finally:
            ray.shutdown()
    print(f"{args.rows} rows at concurrency {args.concurrency}, best of {args.repeats}")
    print(f"{'backend':<8} {'start-up s':>10} {'rollouts/s':>11}")
    summary = {}
    for name, runs in results.items():
        startup = min(r[0] for r in runs)
        rate = max(r[1] for r in runs)
        summary[name] = {"startup_s": round(startup, 3), "rollouts_per_s": round(rate, 1)}
        print(f"{name:<8} {startup:>10.2f} {rate:>11.0f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
