"""Does a server's RSS settle back after a burst of thousands of rollouts in flight?

Starts the example stack (example_single_tool_call + simple_agent + scripted model, real
processes on 127.0.0.1), reads each server's RSS, drives ``--rollouts`` rollouts through
``/run`` with ``--in-flight`` at once from a client process (which then exits, closing its
connections), and reads the RSS again right after and ``--settle`` seconds later. Runs twice:
with the release after bursts (the default) and with ``NEMO_GYM_RELEASE_MEMORY_AFTER_BURST=0``.

Usage: python scripts/bench_agent_rss.py [--in-flight 4096] [--rollouts 8192] [--settle 5 20]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

AGENT = "example_single_tool_call_simple_agent"
NAMES = {AGENT: "agent", "example_single_tool_call": "resources", "policy_model": "model"}

DRIVER = textwrap.dedent(
    """
    import asyncio, sys, time, orjson, uvloop
    sys.path.insert(0, sys.argv[1])
    from nemo_gym.serving.server_client import ServerClient
    head, total, in_flight, agent = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    row = orjson.loads(open(sys.argv[1] + "/resources_servers/example_single_tool_call/data/example.jsonl", "rb").readline())

    async def main():
        client = ServerClient(head)
        slots = asyncio.Semaphore(in_flight)

        async def one(i):
            async with slots:
                result = await client.post_json(agent, "/run", {**row, "i": i})
                assert result["reward"] == 1.0

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(total)))
        print(total / (time.perf_counter() - started))
        await client.close()

    uvloop.run(main())
    """
)


def rss_mib(procs: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: round(p.memory_info().rss / 2**20, 1) for name, p in procs.items()}


def one_stack(release: bool, args: argparse.Namespace) -> dict[str, Any]:
    from nemo_gym.launch.config import load_config
    from nemo_gym.launch.launcher import StackHandle

    os.environ["NEMO_GYM_RELEASE_MEMORY_AFTER_BURST"] = "1" if release else "0"
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
        procs = {NAMES[r.name]: psutil.Process(r.pid) for r in handle.stack.head.registry.all()}
        report: dict[str, Any] = {"at_start": rss_mib(procs)}
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                DRIVER,
                str(ROOT),
                handle.head_url,
                str(args.rollouts),
                str(args.in_flight),
                AGENT,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        report["rollouts_per_s"] = float(out.strip().splitlines()[-1])
        done = time.monotonic()
        report["right_after"] = rss_mib(procs)
        for wait in args.settle:
            time.sleep(max(0.0, done + wait - time.monotonic()))
            report[f"after_{wait:g}s"] = rss_mib(procs)
    finally:
        handle.stop()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in-flight", type=int, default=4096)
    parser.add_argument("--rollouts", type=int, default=8192)
    parser.add_argument("--settle", type=float, nargs="+", default=[5.0, 20.0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    results = {
        "in_flight": args.in_flight,
        "rollouts": args.rollouts,
        "release_off": one_stack(False, args),
        "release_on": one_stack(True, args),
    }
    columns = ["at_start", "right_after"] + [f"after_{w:g}s" for w in args.settle]
    print(f"RSS (MiB) around {args.rollouts} rollouts with {args.in_flight} in flight")
    print("| release after burst | server | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for mode in ("release_off", "release_on"):
        for server in ("agent", "resources", "model"):
            cells = " | ".join(f"{results[mode][c][server]:.1f}" for c in columns)
            print(f"| {mode.split('_')[1]} | {server} | {cells} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
