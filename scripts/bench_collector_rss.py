"""Peak RSS of the rollout collector on a large input (default 1,000,000 rows).

The collector (``RolloutCollectionHelper.run_from_config``, the code behind
``ng_collect_rollouts``) runs in a child process that reports its own peak RSS
(``ru_maxrss``) and its RSS right after imports, so the input generator and the agent server
never count. Transports:

- ``dry`` (default): everything but sockets. The input pre-pass, materialized rows, the bounded
  in-flight dispatch, result appends, failure handling and progress all run for real; only
  ``ServerClient.request`` is replaced by an in-process stand-in that answers ``/run`` like an
  agent (the row echoed back with a small ``response`` and ``reward``).
- ``http``: a minimal agent server in a separate process on 127.0.0.1 answers ``/run`` over
  real HTTP (slow on a small machine: ~1 ms of CPU per rollout across both processes).

Aggregation is off by default (``+disable_aggregation=true``). ``--aggregate`` turns it on:
with ``http`` the rows stream to the agent process (its body limit raised: a million stripped
rows are ~350 MB) and its answer streams to disk; with ``dry`` the call fails and the metrics
are computed in the collector by ``nemo_gym.collection.streaming_metrics.MetricsAccumulator`` (tens of MB
for a million rows; see scripts/bench_metrics_rss.py).
``--resume`` then cuts the results in half, adds a torn line and measures a resumed run.

Measured on 2 shared cores, 1,000,000 rows: dry 109 MB peak (38 s); http 110 MB (337 s),
110 MB with aggregation; resume of half the run 154 MB.

Usage: python scripts/bench_collector_rss.py [--rows 1000000] [--transport dry|http]
       [--parallel 256] [--repeats 1] [--aggregate] [--resume] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    """Current RSS of this process in MB."""
    import psutil

    return psutil.Process().memory_info().rss / 1e6


def peak_rss_mb() -> float:
    """Peak RSS of this process in MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def write_input(path: Path, rows: int) -> None:
    """Distinct rows shaped like a dataset row (~300 bytes each), streamed to disk."""
    import orjson

    with path.open("wb") as sink:
        for i in range(rows):
            row: dict[str, Any] = {
                "responses_create_params": {
                    "input": [
                        {"role": "system", "content": "You are a careful assistant. Answer briefly."},
                        {
                            "role": "user",
                            "content": f"Question {i}: what is {i} + {i % 97}? Reply with a number.",
                        },
                    ]
                },
                "expected_answer": str(i + i % 97),
                "question_id": f"q{i:08d}",
            }
            sink.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))


def agent_answer(row: dict[str, Any]) -> dict[str, Any]:
    """What a scripted agent returns for a row: the row, a short response and a reward."""
    return {
        **row,
        "response": {
            "id": "resp_bench",
            "object": "response",
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": row.get("expected_answer", "")}],
                }
            ],
            "usage": {"input_tokens": 30, "output_tokens": 2, "total_tokens": 32},
        },
        "reward": 1.0,
    }


def run_collector(args: argparse.Namespace) -> None:
    """Child mode: run one collection and print a JSON line with the measurements."""
    import orjson

    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.serving.server_client import ServerClient, ServerResponse

    class DryClient(ServerClient):
        """Answers /run in-process: the only part of collection not exercised is the socket."""

        async def resolve(self, server_name: str, refresh: bool = False) -> list[str]:
            return ["dry://" + server_name]

        async def request(
            self, method: str, server_name: str, url_path: str, json: Any = None, **kwargs: Any
        ) -> ServerResponse:
            await asyncio.sleep(0)
            if url_path != "/run":
                return ServerResponse(404, b'{"error": "not served by the dry agent"}', {})
            # Serialize and parse like the wire would, so payload costs are real.
            row = orjson.loads(orjson.dumps(json))
            return ServerResponse(200, orjson.dumps(agent_answer(row)), {})

    baseline = rss_mb()
    if args.transport == "dry":
        client: ServerClient = DryClient(static_urls={"bench_agent": "dry://bench_agent"})
    else:
        client = ServerClient(static_urls={"bench_agent": args.agent_url})
    config = {
        "agent_name": "bench_agent",
        "input_jsonl_fpath": args.input,
        "output_jsonl_fpath": args.output,
        "num_repeats": args.repeats,
        "num_samples_in_parallel": args.parallel,
        "disable_aggregation": not args.aggregate,
        "progress_interval_s": 60,
        "resume_from_cache": args.resume,
    }
    started = time.monotonic()
    summary = asyncio.run(
        RolloutCollectionHelper(server_client=client).run_from_config(config, verbose=args.verbose)
    )
    elapsed = time.monotonic() - started
    print(
        "RESULT "
        + json.dumps(
            {
                "rows": args.rows,
                "rollouts": summary.succeeded,
                "failed": summary.failed,
                "seconds": round(elapsed, 1),
                "rollouts_per_s": round(summary.succeeded / elapsed, 1),
                "rss_after_imports_mb": round(baseline, 1),
                "peak_rss_mb": round(peak_rss_mb(), 1),
            }
        ),
        flush=True,
    )


def serve_agent() -> None:
    """Child mode: a minimal agent server on a free loopback port (printed), answering /run."""
    from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
    from nemo_gym.serving.server import bind_socket
    from nemo_gym.serving.uvicorn_factory import loop_factory

    class BenchAgent(SimpleResponsesAPIAgent):
        async def run(self, body: dict[str, Any]) -> dict[str, Any]:
            return agent_answer(body)

    sock = bind_socket("127.0.0.1", 0)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        # Since [PERF2] /aggregate_metrics streams (no body limit applies); the raised limit stays so
        # runs compare with the earlier numbers.
        agent = BenchAgent({"name": "bench_agent", "max_body_bytes": 4 << 30})
        runner.run(agent.serve(sock, register=False))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=256)
    parser.add_argument("--transport", choices=("dry", "http"), default="dry")
    parser.add_argument("--aggregate", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="show the collector's progress bar")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="then cut the results in half (plus a torn line, as a kill leaves) and measure a resumed run",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--agent-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_agent:
        serve_agent()
        return
    if args.child:
        run_collector(args)
        return

    with tempfile.TemporaryDirectory(prefix="ng_bench_rss_") as tmp:
        input_path, output_path = Path(tmp) / "input.jsonl", Path(tmp) / "out" / "rollouts.jsonl"
        started = time.monotonic()
        write_input(input_path, args.rows)
        print(
            f"wrote {args.rows} rows ({input_path.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - started:.1f}s"
        )
        agent = None
        child_args = (
            [
                sys.executable,
                __file__,
                "--child",
                f"--rows={args.rows}",
                f"--repeats={args.repeats}",
                f"--parallel={args.parallel}",
                f"--transport={args.transport}",
                f"--input={input_path}",
                f"--output={output_path}",
            ]
            + (["--aggregate"] if args.aggregate else [])
            + (["--verbose"] if args.verbose else [])
        )
        agent_url: list[str] = []
        try:
            if args.transport == "http":
                agent = subprocess.Popen(
                    [sys.executable, __file__, "--serve-agent"], stdout=subprocess.PIPE, text=True
                )
                assert agent.stdout is not None
                port = agent.stdout.readline().split()[1]
                agent_url.append(f"--agent-url=http://127.0.0.1:{port}")
            report = {"fresh": measure(child_args + agent_url, output_path, args)}
            if args.resume:
                size = output_path.stat().st_size
                with output_path.open("r+b") as results:
                    results.seek(size // 2)
                    results.readline()
                    results.truncate(results.tell() + 40)  # half the rows, then a torn line
                report["resume"] = measure(child_args + agent_url + ["--resume"], output_path, args)
        finally:
            if agent is not None:
                agent.terminate()
                agent.wait(10)
        print(json.dumps(report, indent=2))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))


def measure(child_args: list[str], output_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run one collector child; its measurements, checked against the results file."""
    done = subprocess.run(child_args, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"collector failed:\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(
        next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:]
    )
    result.update(transport=args.transport, aggregate=args.aggregate)
    result["notices"] = [line for line in done.stderr.splitlines() if line.startswith("[nemo_gym collect]")]
    result["output_mb"] = round(output_path.stat().st_size / 1e6, 1)
    keys = set()
    with output_path.open("rb") as results:
        for line in results:
            row = json.loads(line)
            keys.add((row["_ng_task_index"], row["_ng_rollout_index"]))
            result["output_lines"] = result.get("output_lines", 0) + 1
    if len(keys) != args.rows * args.repeats or result["output_lines"] != len(keys):
        sys.exit(f"expected {args.rows * args.repeats} distinct results, found {result}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
