"""Benchmark: ng_run start → all-healthy time and RSS per process for a stack.

Usage: python scripts/bench_startup.py [--repeats 5] [--json out.json] [+config_paths=[...]]
Default stack: example_single_tool_call + its simple_agent + the scripted policy model (+ head).
Prints a table and the median; targets: under 3 s to all-healthy, under 80 MB RSS per server process.
Also each process's CPU seconds (user + system) spent by then: mostly imports, and unlike the
wall time it hardly moves when other work shares the machine.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIGS = (
    "+config_paths=[resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,"
    "responses_api_models/scripted_model/configs/scripted_model.yaml]"
)


def one_run(config_arg: str) -> tuple[float, dict[str, float], dict[str, float]]:
    """Start ng_run, time until it reports all-healthy, read every process's RSS and CPU, stop it."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "ng_run"), config_arg, "++head_server.port=0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    head_url = None
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"Head server: (http://\S+)", line)
        if found:
            head_url = found.group(1)
            break
    elapsed = time.perf_counter() - started
    if head_url is None:
        proc.kill()
        raise RuntimeError("ng_run did not become healthy")
    with urllib.request.urlopen(head_url + "/server_instances", timeout=5) as resp:
        instances = json.load(resp)
    processes = {"head_server (ng_run)": psutil.Process(proc.pid)}
    processes.update({info["name"]: psutil.Process(info["pid"]) for info in instances})
    rss = {name: p.memory_info().rss / 2**20 for name, p in processes.items()}
    cpu = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    return elapsed, rss, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIGS)
    args = parser.parse_args()

    times, rss_runs, cpu_runs = [], [], []
    for i in range(args.repeats):
        elapsed, rss, cpu = one_run(args.config)
        times.append(elapsed)
        rss_runs.append(rss)
        cpu_runs.append(cpu)
        print(f"run {i + 1}: all healthy in {elapsed:.2f}s")
    median_rss = {name: statistics.median(run[name] for run in rss_runs) for name in rss_runs[0]}
    median_cpu = {name: statistics.median(run[name] for run in cpu_runs) for name in cpu_runs[0]}
    print(
        f"\nng_run → all healthy: median {statistics.median(times):.2f}s (min {min(times):.2f}s, max {max(times):.2f}s)"
    )
    print(f"{'process':42} {'RSS MiB (median)':>16} {'CPU s (median)':>15}")
    for name, value in median_rss.items():
        print(f"{name:42} {value:16.1f} {median_cpu[name]:15.2f}")
    if args.json:
        args.json.write_text(
            json.dumps({"startup_s": times, "rss_mib": median_rss, "cpu_s": median_cpu}, indent=2)
        )


if __name__ == "__main__":
    main()
