"""Peak RSS of ``/aggregate_metrics`` over a large results file (default 1,000,000 rows).

Writes a results file shaped like ``ng_collect_rollouts`` output (task and rollout indices,
agent_ref, reward, a response with usage, the row's params), starts the example stack
(example_single_tool_call + simple_agent + scripted model, real processes on 127.0.0.1) and
runs the collector's aggregation step (``aggregate_results_file``, what ``ng_collect_rollouts``
does after the last rollout) in a child process, twice:

- ``through the servers``: rows stream collector → agent → resources server, which computes
  the metrics and streams its answer back;
- ``local``: no server (as when the call fails): the collector computes them itself.

Peak RSS is each process's own high-water mark (``ru_maxrss`` of the collector child,
``VmHWM`` of the server processes). The run fails if the metrics differ between the two paths
or if the collector fell back to local metrics in the first.

Usage: python scripts/bench_metrics_rss.py [--rows 1000000] [--repeats 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nemo_gym.testing.child_servers import peak_rss_kib  # noqa: E402

AGENT = "example_single_tool_call_simple_agent"

CHILD = textwrap.dedent(
    """
    import asyncio, json, resource, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from nemo_gym.rollout_collection import aggregate_results_file
    from nemo_gym.serving.server_client import ServerClient
    results, metrics, head = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]

    async def main():
        client = ServerClient(head) if head != "none" else None
        try:
            return await aggregate_results_file(results, metrics, client, verbose=False)
        finally:
            if client is not None:
                await client.close()

    started = time.perf_counter()
    summaries = asyncio.run(main())
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6,
                      "seconds": time.perf_counter() - started, "summaries": summaries}))
    """
)


def write_results(path: Path, rows: int, repeats: int) -> None:
    """Rows as the collector writes them: ``rows // repeats`` tasks with ``repeats`` rollouts each."""
    with path.open("wb") as sink:
        for i in range(rows):
            task, run = divmod(i, repeats)
            reward = float((task * 7919 + run * 104729) % 10 < 4)
            row: dict[str, Any] = {
                "_ng_task_index": task,
                "_ng_rollout_index": run,
                "responses_create_params": {
                    "input": [{"role": "user", "content": f"Question {task}: what is {task} + {run}?"}],
                },
                "response": {
                    "id": f"resp_{i}",
                    "output": [
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": "42"}],
                        }
                    ],
                    "usage": {
                        "input_tokens": 20 + task % 50,
                        "output_tokens": 5 + run,
                        "total_tokens": 25 + task % 50 + run,
                    },
                },
                "reward": reward,
                "expected_answer": str(task),
                "agent_ref": {"type": "responses_api_agents", "name": AGENT},
            }
            sink.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))


def peak_rss_mb(pid: int) -> float:
    """A process's high-water RSS (VmHWM) in MB (10**6 bytes)."""
    return peak_rss_kib(pid) * 1024 / 1e6


def run_child(results: Path, metrics: Path, head: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(results), str(metrics), head],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"aggregation failed: {out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["fell_back_to_local"] = "computed metrics locally" in out.stderr
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=4, help="rollouts per task")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from nemo_gym.launch.config import load_config
    from nemo_gym.launch.launcher import StackHandle

    report: dict[str, Any] = {"rows": args.rows, "rollouts_per_task": args.repeats}
    with tempfile.TemporaryDirectory(prefix="bench_metrics_") as tmp:
        work = Path(tmp)
        results = work / "results.jsonl"
        started = time.perf_counter()
        write_results(results, args.rows, args.repeats)
        report["results_file_mb"] = results.stat().st_size / 1e6
        print(
            f"{args.rows} result rows, {report['results_file_mb']:.0f} MB ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )

        config = load_config(
            [
                "+config_paths=[resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,"
                "responses_api_models/scripted_model/configs/scripted_model.yaml]",
                "++head_server.port=0",
            ],
            cwd=ROOT,
        )
        handle = StackHandle.start(config, log=lambda name, line: None)
        try:
            pids = {r.name: r.pid for r in handle.stack.head.registry.all()}
            at_start = {name: peak_rss_mb(pid) for name, pid in pids.items()}
            served = run_child(results, work / "served_metrics.json", handle.head_url)
            servers = {name: peak_rss_mb(pid) for name, pid in pids.items()}
        finally:
            handle.stop()
        local = run_child(results, work / "local_metrics.json", "none")

    if served["fell_back_to_local"]:
        raise SystemExit("the collector fell back to local metrics: the servers did not answer")
    if served["summaries"] != local["summaries"]:
        raise SystemExit(f"metrics differ: {served['summaries']} vs {local['summaries']}")
    report["through_servers"] = {
        "collector_peak_rss_mb": served["peak_rss_mb"],
        "agent_peak_rss_mb": servers[AGENT],
        "resources_peak_rss_mb": servers["example_single_tool_call"],
        "server_peak_rss_mb_before": {
            "agent": at_start[AGENT],
            "resources": at_start["example_single_tool_call"],
        },
        "seconds": served["seconds"],
    }
    report["local"] = {"collector_peak_rss_mb": local["peak_rss_mb"], "seconds": local["seconds"]}
    report["key_metrics"] = served["summaries"][0]["key_metrics"]
    t, lo = report["through_servers"], report["local"]
    print("| path | process | peak RSS | time |\n|---|---|---|---|")
    print(f"| through the servers | collector | {t['collector_peak_rss_mb']:.0f} MB | {t['seconds']:.0f} s |")
    print(f"| through the servers | agent (simple_agent) | {t['agent_peak_rss_mb']:.0f} MB | |")
    print(f"| through the servers | resources server | {t['resources_peak_rss_mb']:.0f} MB | |")
    print(f"| local (no server) | collector | {lo['collector_peak_rss_mb']:.0f} MB | {lo['seconds']:.0f} s |")
    print(f"key metrics: {report['key_metrics']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
