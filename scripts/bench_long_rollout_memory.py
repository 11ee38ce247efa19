"""Memory after many long rollouts: what the model server keeps for a rollout is gone when it ends.

The stack of ``scripts/bench_long_horizon.py`` (example_single_tool_call + simple_agent +
openai_model, started by ``ng_run``, in front of the same instant policy), driven by
``ng_collect_rollouts``: a warm-up of ``--warmup`` rollouts, then ``--rollouts`` (default 10,000)
rollouts of ``--turns`` tool calls each (default 16, ~``--bytes-per-turn`` of text per turn). The
model server keeps each rollout's conversation while it runs (see
``nemo_gym/models/conversation_store.py``); after the run it must keep none.

Printed: the conversations and bytes the model server keeps (its ``GET /`` answer's
``kept_conversations``) and the RSS of each server process, after the warm-up and at
``--checkpoints`` points along the run (memory a rollout leaves behind grows from one to the
next; an allocator's high-water mark does not), each after ``--settle-s`` idle seconds (servers
give their freed heap back to the system after 2 s without a request in flight).

Usage: python scripts/bench_long_rollout_memory.py [--rollouts 10000] [--turns 16]
       [--bytes-per-turn 2000] [--concurrency 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_long_horizon as long  # noqa: E402 - the policy, rows and process roles
import bench_vs_nemo_gym as pair  # noqa: E402 - the stack and its processes

from nemo_gym.launch.launcher import free_port, wait_for_port  # noqa: E402


def snapshot(s: pair.System) -> dict[str, Any]:
    """RSS (MiB) by server role, and what the model server keeps."""
    rss: dict[str, float] = {}
    for p in s.stack_processes():
        role = long.role_of(p)
        try:
            rss[role] = rss.get(role, 0.0) + p.memory_info().rss / 2**20
        except Exception:  # noqa: BLE001 - a process that just exited
            continue
    kept = pair.get_json(s.urls["policy_model"] + "/").get("kept_conversations")
    return {"rss_mib": rss, "kept_conversations": kept}


def run(s: pair.System, path: Path, rows: int, concurrency: int, work: Path) -> float:
    started = time.perf_counter()
    out = work / f"out_{time.monotonic_ns()}.jsonl"
    subprocess.run(
        s.ng_collect_rollouts
        + [
            f"+agent_name={pair.AGENT}",
            f"+input_jsonl_fpath={path}",
            f"+output_jsonl_fpath={out}",
            f"+num_samples_in_parallel={concurrency}",
            "++head_server.host=127.0.0.1",
            f"++head_server.port={s.head_port}",
        ],
        cwd=s.tree,
        env=s.env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    written = sum(1 for line in out.read_bytes().splitlines() if line.strip())
    if written != rows:
        raise RuntimeError(f"{written} result rows, expected {rows}")
    out.unlink()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--bytes-per-turn", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--checkpoints", type=int, default=3, help="snapshots taken along the run (a leak grows with each)"
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=3.0,
        help="idle seconds before each snapshot (servers give freed heap back after 2 s idle)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_long_mem_"))
    rows = long.rows_for(args.turns, pair.load_rows(None))
    main_input, warm_input = work / "input.jsonl", work / "warm.jsonl"
    warm_input.write_bytes(b"".join(rows[i % len(rows)] + b"\n" for i in range(args.warmup)))
    s = pair.ours()
    original = s.config_args
    s.config_args = lambda port: (
        original(port)
        + [  # type: ignore[method-assign]
            f"++{pair.AGENT}.responses_api_agents.simple_agent.max_steps={args.turns + 5}"
        ]
    )
    policy_port = free_port()
    policy = subprocess.Popen(
        [sys.executable, "-c", long.POLICY_SERVER, str(policy_port), str(args.bytes_per_turn)]
    )
    result: dict[str, Any] = {
        "args": vars(args) | {"json": str(args.json)},
        "load_avg_at_start": os.getloadavg(),
    }
    try:
        wait_for_port(policy_port)
        s.start(policy_port, work)
        try:
            run(s, warm_input, args.warmup, args.concurrency, work)
            time.sleep(args.settle_s)
            result["after_warmup"] = before = snapshot(s)
            print(f"after {args.warmup} warm-up rollouts: {before}", flush=True)
            part = args.rollouts // args.checkpoints
            main_input.write_bytes(b"".join(rows[i % len(rows)] + b"\n" for i in range(part)))
            result["checkpoints"] = []
            seconds = 0.0
            for number in range(1, args.checkpoints + 1):
                seconds += run(s, main_input, part, args.concurrency, work)
                time.sleep(args.settle_s)
                after = snapshot(s)
                result["checkpoints"].append({"rollouts": part * number, **after})
                print(
                    f"after {part * number} rollouts of {args.turns} turns ({seconds:.0f} s): {after}",
                    flush=True,
                )
            result["after_run"] = after
            result["run_s"] = seconds
        finally:
            s.stop()
    finally:
        policy.terminate()
        policy.wait()
        shutil.rmtree(work, ignore_errors=True)
    result["load_avg_at_end"] = os.getloadavg()
    for role in sorted(set(before["rss_mib"]) | set(after["rss_mib"])):
        b, a = before["rss_mib"].get(role, 0.0), after["rss_mib"].get(role, 0.0)
        print(f"{role:10s} RSS {b:7.1f} MiB -> {a:7.1f} MiB ({a - b:+.1f})")
    print(f"model server keeps: {before['kept_conversations']} -> {after['kept_conversations']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
